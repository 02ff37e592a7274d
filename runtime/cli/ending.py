"""How a command that follows a foreground run is ended: Ctrl-C, and as much SIGTERM (a CI
job's timeout) and SIGHUP (a closed terminal).

Owns the handlers of those three signals for the length of such a command (on the main thread
only), and their removal afterwards. While the command starts its node and launches, a signal
is held, not acted on: a launch cut short there would leave a run going that nobody follows
(and, with an embedded node, children no node supervises), so the command first learns its
run, then stops it. While the run is followed a signal raises at once, and so does a second
one at any time (the user insists: the stop already sent goes on in the children's shims).
It never stops a run itself: the follower catches `Ended` (or KeyboardInterrupt), stops its
run and exits 128 + the signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

#: What ends a foreground command besides Ctrl-C.
END_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Ended(Exception):
    """SIGTERM or SIGHUP reached a command that follows a foreground run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interruption(signum: int) -> BaseException:
    """What a signal raises in the command: Ctrl-C as Python's own, TERM and HUP as `Ended`."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Ended(signum)


class EndingSignals:
    """INT, TERM and HUP for one foreground command: held (`pending`) until `raising()`.

    Use it as a context manager around the whole command, node start and stop included. A
    signal whose handler is SIG_IGN when it begins (`nohup`, a background job of a
    non-interactive shell) stays ignored.
    """

    def __init__(self) -> None:
        #: The first signal received, and how many came.
        self.pending: int | None = None
        self.count = 0
        self._raising = False
        self._holding = False
        self._previous: dict[int, signal._HANDLER] = {}

    def __enter__(self) -> EndingSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # elsewhere Python cannot set handlers: the main thread's stay
        for signum in (signal.SIGINT, *END_SIGNALS):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *_: object) -> None:
        for signum, handler in self._previous.items():
            if handler is not None:  # None: set outside Python, nothing to restore
                signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        first = self.pending is None
        self.pending = self.pending or signum
        if not self._holding and (self._raising or not first):
            raise interruption(signum)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While the block runs every signal is only counted, a second one too: for one
        request whose loss would leave a run unfollowed (its launch, its stop), bounded by
        the client's timeout."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False

    def hold(self) -> None:
        """From now on every signal is only counted: the command is ending (its embedded
        node stops next, which a signal must not cut short)."""
        self._holding = True
        self._raising = False

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """While the block runs a signal raises at once; one held before raises on entry."""
        if self.pending is not None:
            raise interruption(self.pending)
        self._raising = True
        try:
            yield
        finally:
            self._raising = False
