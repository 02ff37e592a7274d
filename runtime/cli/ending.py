"""How a command that follows a foreground run is ended: Ctrl-C, and as much SIGTERM (a CI
job's timeout) and SIGHUP (a closed terminal).

Owns the handlers that turn TERM and HUP into an exception while a run is followed (on the main
thread only), and their removal afterwards. It never stops a run itself: the follower catches
`Ended` (or KeyboardInterrupt), stops its run and exits 128 + the signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

#: What ends a foreground command besides Ctrl-C.
END_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Ended(Exception):
    """SIGTERM or SIGHUP reached a command that follows a foreground run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _ended(signum: int, _frame: object) -> None:
    # Once: a second TERM or HUP while the run is being stopped ends the command at once.
    for each in END_SIGNALS:
        signal.signal(each, signal.SIG_DFL)
    raise Ended(signum)


@contextlib.contextmanager
def ending_signals_raise() -> Iterator[None]:
    """While the block runs, TERM and HUP raise `Ended` (main thread only: elsewhere Python
    cannot set handlers, and the main thread's own stay as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _ended) for s in END_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, nothing to restore
                signal.signal(signum, handler)
