"""The signals that end `subagents-node mcp`, held for the server's whole life.

Owns the handlers of END_SIGNALS and the process's signal wakeup descriptor from before the
server's node is found (or embedded and started) until after that node is stopped, and puts
back what it found on leaving. A signal there is only written down: its number is a byte on a
pipe, which the server awaits (stdio.py), so one that comes while the node starts ends the
server as soon as it serves, and one that comes while the server ends (its calls cancelled, a
foreground run stopped, its embedded node stopped) changes nothing. anyio's signal receiver,
used before, put each signal back to its default when left: a second TERM then killed the
server in the middle of its end, the embedded node's socket and pid file left behind.

It must never decide what a signal does to the server's calls (stdio.py does), and must run
on the main thread only (Python sets handlers nowhere else).
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType, TracebackType

import anyio

#: What ends the server besides the end of its input: an agent CLI that exits sends TERM (or
#: its terminal closes: HUP); Ctrl-C in a terminal reaches every process of its group.
END_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _written_down(_signum: int, _frame: FrameType | None) -> None:
    """Nothing to do in Python: the interpreter's C handler has already written the signal's
    number to the wakeup descriptor, from whichever thread the kernel chose."""


class EndSignals:
    """END_SIGNALS, written down from `__enter__` to `__exit__`; `first()` awaits the first.

    A signal ignored when it begins (`nohup`) stays ignored.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
        self._previous: dict[int, signal._HANDLER] = {}
        self._previous_wakeup = -1
        self._first: int | None = None

    def __enter__(self) -> EndSignals:
        # The descriptor before the handlers: a signal between the two is not lost.
        self._previous_wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for signum in END_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, _written_down)
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            # None: set outside Python; the default is what it was.
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        signal.set_wakeup_fd(self._previous_wakeup)
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)

    async def first(self) -> int:
        """The first signal written down (at once if one came before), else wait for it."""
        while self._first is None:
            try:
                got = os.read(self._read, 1)
            except BlockingIOError:
                await anyio.wait_readable(self._read)
                continue
            # A byte from elsewhere in the process (another signal's handler) is no end.
            if got and got[0] in END_SIGNALS:
                self._first = got[0]
        return self._first
