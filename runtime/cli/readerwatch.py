"""Whether the reader of a foreground command's output went away (`run … | head`), seen at once.

Owns one thread per foreground command (`run`, `rerun`, `workflow`) that waits in poll(2) on
the command's stdout and stderr when they are pipes or sockets: the kernel reports POLLERR on a
pipe's write end once its last reader has closed it (POLLHUP on a socket whose peer is gone),
with no write needed. The command used to learn it only at its next write, and a foreground
run writes to stdout only its summary, at the run's end: `run … | head` ran its whole run for
nobody. On that event the thread calls `on_gone` once (runtime/cli/ending.py signals the main
thread, which stops the run as for SIGTERM and exits 141), and ends. A command that only
follows (`logs -f`, `wait`) ends at once, quietly, with 141 (`ending_when_the_reader_goes`):
`logs -f RUN | grep -m1 ready` used to wait for the run's next line, or its end.

It never reads, writes or closes the descriptors it watches and never acts on a run itself. A
terminal is not watched (its hangup is SIGHUP's), nor a file (it has no reader to lose).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

#: What a pipe or socket whose reader is gone reports; poll(2) reports both whether asked or not.
_GONE = select.POLLERR | select.POLLHUP
#: How long leaving the block waits for the thread (it wakes at once; bounded all the same).
_JOIN_S = 5.0
#: How often `on_gone` is called again until the block ends or `landed()` is called: Python
#: runs a signal's handler at the main thread's next bytecode, and when that one is in a
#: finalizer (a socket's or a future's `__del__`) the exception raised there is only printed
#: ("Exception ignored in …") and the command went on following (1 in 15 `wait | true`).
RESEND_S = 0.5


def _has_reader(fd: int) -> bool:
    """Whether `fd` is a pipe or socket (a reader that can go away), not a terminal or file."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:  # closed: nothing to watch
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class ReaderWatch:
    """While the block runs, `on_gone()` is called (once, from another thread) when the reader
    of any of `fds` that is a pipe or socket goes away."""

    def __init__(self, on_gone: Callable[[], None], fds: tuple[int, ...] = (1, 2)) -> None:
        self._on_gone = on_gone
        self._fds = fds
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None

    def __enter__(self) -> ReaderWatch:
        watched = [fd for fd in dict.fromkeys(self._fds) if _has_reader(fd)]
        if not watched:
            return self
        self._wake = os.pipe2(os.O_CLOEXEC)  # written once when the block ends
        self._thread = threading.Thread(
            target=self._watch, args=(watched, self._wake[0]), name="reader-watch", daemon=True
        )
        self._thread.start()
        return self

    def landed(self) -> None:
        """The main thread acted on the reader's going: `on_gone` is not called again."""
        if self._wake is not None:
            os.write(self._wake[1], b"x")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread is None or self._wake is None:
            return
        os.write(self._wake[1], b"x")
        self._thread.join(_JOIN_S)
        if not self._thread.is_alive():  # it holds the read end while it polls
            os.close(self._wake[0])
        os.close(self._wake[1])
        self._thread = self._wake = None

    def _watch(self, fds: list[int], wake: int) -> None:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, 0)  # only what is reported unasked: POLLERR, POLLHUP, POLLNVAL
        poller.register(wake, select.POLLIN)
        left = len(fds)
        while left:
            for fd, events in poller.poll():
                if fd == wake:
                    return
                if events & _GONE:
                    self._resend(wake)
                    return
                if events & select.POLLNVAL:  # closed under us: nothing more to learn there
                    poller.unregister(fd)
                    left -= 1

    def _resend(self, wake: int) -> None:
        """`on_gone` now, and again every RESEND_S until the block ends or it `landed()`."""
        waiting = select.poll()
        waiting.register(wake, select.POLLIN)
        self._on_gone()
        while not waiting.poll(RESEND_S * 1000):
            self._on_gone()


class ReaderGone(BaseException):
    """Raised in the main thread of a following command whose reader went away: a
    BaseException, as KeyboardInterrupt is, so that no `except Exception` on the way holds it."""


@contextlib.contextmanager
def ending_when_the_reader_goes() -> Iterator[None]:
    """While the block runs, the reader of stdout or stderr going away raises `ReaderGone` in
    the main thread at once (a wait for the node is cut short, as Ctrl-C cuts it). Only on the
    main thread; a SIGPIPE that a failed write raises is left to that write's EPIPE."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    went = threading.Event()
    main = threading.main_thread().ident or 0

    def gone() -> None:
        went.set()
        signal.pthread_kill(main, signal.SIGPIPE)

    def on_sigpipe(_signum: int, _frame: FrameType | None) -> None:
        if went.is_set():
            # A resend that lands while the first ReaderGone unwinds (a generator's clean-up,
            # `follow_logs` closing its watch) would be printed as "Exception ignored in: …"
            # on a stderr that must stay quiet: the command is ending, with nothing to say.
            sys.unraisablehook = _say_nothing
            raise ReaderGone()

    previous = signal.signal(signal.SIGPIPE, on_sigpipe)
    hook = sys.unraisablehook
    try:
        with ReaderWatch(gone):
            yield
    finally:
        went.clear()  # first: from here no resend raises again while this one unwinds
        signal.signal(signal.SIGPIPE, previous)
        sys.unraisablehook = hook


def _say_nothing(_unraisable: Any) -> None:
    """`sys.unraisablehook` once the reader went: an exception nobody can catch is not shown."""
