"""Whether the reader of a foreground command's output went away (`run … | head`), seen at once.

Owns one thread per foreground command (`run`, `rerun`, `workflow`) that waits in poll(2) on
the command's stdout and stderr when they are pipes or sockets: the kernel reports POLLERR on a
pipe's write end once its last reader has closed it (POLLHUP on a socket whose peer is gone),
with no write needed. The command used to learn it only at its next write, and a foreground
run writes to stdout only its summary, at the run's end: `run … | head` ran its whole run for
nobody. On that event the thread calls `on_gone` once (runtime/cli/ending.py signals the main
thread, which stops the run as for SIGTERM and exits 141), and ends.

It never reads, writes or closes the descriptors it watches and never acts on a run itself. A
terminal is not watched (its hangup is SIGHUP's), nor a file (it has no reader to lose).
"""

from __future__ import annotations

import os
import select
import stat
import threading
from collections.abc import Callable
from types import TracebackType

#: What a pipe or socket whose reader is gone reports; poll(2) reports both whether asked or not.
_GONE = select.POLLERR | select.POLLHUP
#: How long leaving the block waits for the thread (it wakes at once; bounded all the same).
_JOIN_S = 5.0


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
                    self._on_gone()
                    return
                if events & select.POLLNVAL:  # closed under us: nothing more to learn there
                    poller.unregister(fd)
                    left -= 1
