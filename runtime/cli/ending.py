"""How a command that follows a foreground run is ended: Ctrl-C, and as much SIGTERM (a CI
job's timeout) and SIGHUP (a closed terminal).

Owns the handlers of those three signals for the length of such a command (on the main thread
only), and their removal afterwards. While the command starts its node a first signal is held,
not acted on; from the launch on, a signal is acted on only where the command follows its run
(`raising`): a launch cut short would leave a run going that nobody follows (and, with an
embedded node, children no node supervises), so the command first learns its run, then stops
it. The signal acted on raises once, and from that moment every later one is held again until
the follower asks for them: its stop request goes out first, whatever comes while the
exception unwinds or a terminal write blocks (a full pipe, a paused terminal); only then may a
second signal end the command without waiting (the stop already sent goes on in the children's
shims). Also owns how the command writes to a terminal that may be gone once it is ending
(`best_effort`). It never stops a run itself: the follower catches `Ended` (or
KeyboardInterrupt), stops its run and exits 128 + the signal.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

from subagents_node.cli.readerwatch import ReaderWatch

#: What ends a foreground command besides Ctrl-C (and its reader going away: SIGPIPE).
END_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

#: What a write to a terminal that is gone fails with: EIO once it hung up (closed), EPIPE
#: once the reader of the pipe in its place went away.
GONE = (errno.EIO, errno.EPIPE)


class Ended(Exception):
    """SIGTERM or SIGHUP reached a command that follows a foreground run (or SIGPIPE: the
    reader of its output went away)."""

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
    non-interactive shell) stays ignored. Until `hold()` a first signal is only noted and a
    second one raises (it cuts a node's start short); after it, a signal raises only inside
    `raising()`. Whichever raises, every signal after it is held until the next `raising()`.

    With `watch_reader`, the reader of the command's stdout or stderr going away (a pipe's or
    socket's, runtime/cli/readerwatch.py) counts as a SIGPIPE, once, the moment it happens:
    the follower stops its run and the command exits 141. A SIGPIPE a failed write raises is
    not one (that write's own EPIPE is handled where it is made).
    """

    def __init__(self, watch_reader: bool = False) -> None:
        #: The first signal received, and how many came.
        self.pending: int | None = None
        self.count = 0
        self._raising = False
        self._holding = False
        self._previous: dict[int, signal._HANDLER] = {}
        self._watch = ReaderWatch(self._reader_gone) if watch_reader else None
        #: The watch saw the reader go (set on its thread before it signals this one); the
        #: SIGPIPE that says so was taken (the next ones are the watch's resends, or writes
        #: failing); it raised; the follower caught what it raised (`landed`).
        self._reader_went = False
        self._reader_taken = False
        self._reader_raised = False
        self._reader_landed = False

    def __enter__(self) -> EndingSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # elsewhere Python cannot set handlers: the main thread's stay
        for signum in (signal.SIGINT, *END_SIGNALS):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        if self._watch is not None:
            # Python ignores SIGPIPE itself (so a write fails with EPIPE): not the user's choice.
            self._previous[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, self._on_sigpipe)
            self._watch.__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        if self._watch is not None and signal.SIGPIPE in self._previous:
            self._watch.__exit__(None, None, None)  # before its signal's handler goes
        for signum, handler in self._previous.items():
            if handler is not None:  # None: set outside Python, nothing to restore
                signal.signal(signum, handler)
        self._previous.clear()

    def _reader_gone(self) -> None:
        """On the watch's thread: tell the main thread, as a signal (it may be blocked in a
        wait for the node's answer, which a signal interrupts)."""
        self._reader_went = True
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGPIPE)

    def _on_sigpipe(self, signum: int, frame: FrameType | None) -> None:
        if not self._reader_went:
            return  # a write failing: its EPIPE is handled where it was made
        if not self._reader_taken:
            self._reader_taken = True
            self._on_signal(signum, frame)
        elif self._reader_raised and not self._reader_landed:
            # What it raised was lost (raised in a finalizer, where Python only prints it):
            # the watch's resend raises it again.
            self._act_on(signum)

    def landed(self) -> None:
        """The follower caught what a signal raised: the reader watch stops resending."""
        self._reader_landed = True
        if self._watch is not None:
            self._watch.landed()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        first = self.pending is None
        self.pending = self.pending or signum
        if not self._holding and (self._raising or not first):
            self._act_on(signum)

    def _act_on(self, signum: int) -> NoReturn:
        # Held from here, in this same step: a second signal that came while the exception
        # unwound used to raise again before the follower had sent its stop, and escaped it
        # (the run went on; the command said no run was launched).
        self._holding = True
        self._raising = False
        self._reader_raised = self._reader_raised or signum == signal.SIGPIPE
        raise interruption(signum)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While the block runs every signal is only counted, a second one too: for one
        request whose loss would leave a run unfollowed (its launch, its stop), bounded by
        the client's timeout. Afterwards signals are handled as before the block."""
        before = self._holding
        self._holding = True
        try:
            yield
        finally:
            self._holding = before

    def hold(self) -> None:
        """From now on a signal is only counted, but inside `raising()`: the command has its
        run to follow (or is ending: its embedded node stops next, which a signal must not
        cut short)."""
        self._holding = True
        self._raising = False

    @contextlib.contextmanager
    def raising(self, acted_on: int = 0) -> Iterator[None]:
        """While the block runs a signal raises at once; one held before raises on entry, but
        for the first `acted_on` signals (those the command acts on already). A signal that
        raised leaves every later one held; a block that ends otherwise leaves them as they
        were before it."""
        if self.count > acted_on:
            self._act_on(self.pending or signal.SIGINT)
        before = self._holding
        self._holding, self._raising = False, True
        try:
            yield
        finally:
            if self._raising:  # no signal raised in the block
                self._holding, self._raising = before, False


def best_effort(write: Callable[[], object], err: bool, gone: tuple[int, ...] = GONE) -> None:
    """`write` to the command's stdout (or stderr, with `err`) as a command that is ending does:
    its terminal may be closed (EIO, the hangup that ends it) or its reader gone (EPIPE), and
    that must not keep it from stopping its run or exiting 128 + the signal. Such a failure is
    dropped, and that descriptor points at /dev/null from then on, so no later write fails
    there, the interpreter's last flush of what the failed write left buffered included (it
    would make the exit status 120). `gone`: the errors dropped."""
    try:
        write()
    except OSError as exc:
        if exc.errno not in gone:
            raise
        silence(err)


def silence(err: bool) -> None:
    """Point the command's stdout (or stderr, with `err`) at /dev/null: its terminal is gone."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2 if err else 1)
    finally:
        os.close(devnull)
