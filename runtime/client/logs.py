"""Following a run's child logs: what `logs RUN [--child PATH] [-f]` and any client stream.

Owns reading each child's stdout and stderr log from the byte offset it has reached, cutting
the bytes into labelled lines (a line still being written is held until its newline, or until
the run ends), and, when following, waking only on events: inotify on the run's directory for
new bytes or a new log file (client/inotify.py, ctypes), and the run's `runs.watch` long-poll
at the node for a child that started and for the run's end. The long-poll runs on a helper
thread with its own connection (ZeroMQ sockets belong to one thread) that wakes the reader
through a pipe. It never polls files on a timer, never writes, and never imports the node.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from subagents_node.client.inotify import DirectoryWatch
from subagents_node.messages.errors import BadRequest, SubagentsError
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import ChildView, RunView

if TYPE_CHECKING:
    from subagents_node.client.client import Client

Stream = Literal["stdout", "stderr"]
#: How long one watch request of the follower waits at the node before it asks again.
_WATCH_WAIT_S = 10.0


@dataclass(frozen=True)
class LogLine:
    """One line a child wrote: the child's label (`single`, `tasks[1]`, …), the stream and
    the text without its newline."""

    child: str
    stream: Stream
    text: str


@dataclass
class _LogFile:
    label: str
    stream: Stream
    path: str
    offset: int = 0
    partial: bytes = field(default=b"")

    def new_lines(self, final: bool) -> list[LogLine]:
        """The complete lines written since the last call (and the rest, when `final`)."""
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise BadRequest(f"cannot read {self.path}: {exc.strerror}", reason="log") from None
        self.offset += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        if final and self.partial:
            chunks.append(self.partial)
            self.partial = b""
        return [LogLine(self.label, self.stream, c.decode("utf-8", "replace")) for c in chunks]


def select_children(run: RunView, child: str | None) -> list[ChildView]:
    """Every child of the run, or the one whose label (or index) is `child`."""
    if child is None:
        return list(run.children)
    chosen = [c for c in run.children if child in (c.label, str(c.index))]
    if not chosen:
        labels = ", ".join(c.label for c in run.children) or "none yet"
        raise BadRequest(
            f"run {run.run_id} has no child {child!r} (children: {labels})",
            reason="child",
            run_id=run.run_id,
            child=child,
        )
    return chosen


class _RunFollower:
    """The helper thread: long-polls the run at the node, keeps its latest view, wakes the
    reader through a pipe on every answer with events, and ends with the run."""

    def __init__(self, address: str, run: RunView, timeout: float) -> None:
        self.latest = run
        self.error: SubagentsError | None = None
        self._address = address
        self._timeout = timeout
        self._lock = threading.Lock()
        self.wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True, name="logs-follow")

    def start(self) -> None:
        self._thread.start()

    def view(self) -> RunView:
        with self._lock:
            return self.latest

    def _follow(self) -> None:
        from subagents_node.client.client import connect

        seq = 0
        try:
            with connect(self._address, timeout=self._timeout) as client:
                while not self._stop.is_set():
                    batch = client.runs.watch(self.latest.run_id, seq, _WATCH_WAIT_S)
                    seq = batch.last_seq
                    with self._lock:
                        self.latest = batch.run
                    if batch.events or batch.run.state in TERMINAL_RUN_STATES:
                        self._wake()
                    if batch.run.state in TERMINAL_RUN_STATES:
                        return
        except SubagentsError as err:
            self.error = err
            self._wake()
        finally:
            os.close(self._wake_w)  # each end of the pipe is closed by the side that reads it

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # the reader closed its end: nobody to wake
            os.write(self._wake_w, b".")

    def close(self) -> None:
        # The thread ends with the run; one abandoned early ends after its current long-poll.
        self._stop.set()
        os.close(self.wake_r)


def follow_logs(
    client: Client, run_id: str, child: str | None = None, follow: bool = False
) -> Iterator[LogLine]:
    """The lines of a run's child logs (stdout and stderr, per child in order); with `follow`,
    keep streaming new lines as they are written until the run has ended."""
    run = client.runs.show(run_id)
    chosen = {c.index for c in select_children(run, child)}
    files: dict[str, _LogFile] = {}

    def track(view: RunView) -> None:
        for c in view.children:
            if c.index not in chosen:
                continue
            for stream, path in (("stdout", c.stdout_path), ("stderr", c.stderr_path)):
                if path and path not in files:
                    files[path] = _LogFile(c.label, stream, path)  # type: ignore[arg-type]

    def drain(final: bool) -> Iterator[LogLine]:
        for log in list(files.values()):
            yield from log.new_lines(final)

    if not follow or run.state in TERMINAL_RUN_STATES:
        track(run)
        yield from drain(final=True)
        return
    # The watch exists before the first read, so no byte written in between is missed.
    with DirectoryWatch(Path(run.run_dir)) as watch:
        follower = _RunFollower(client.address, run, client.timeout)
        follower.start()
        try:
            track(run)
            yield from drain(final=False)
            while True:
                ready, _, _ = select.select([watch.fileno(), follower.wake_r], [], [])
                if watch.fileno() in ready:
                    watch.read()
                if follower.wake_r in ready:
                    os.read(follower.wake_r, 4096)
                if follower.error is not None:
                    raise follower.error
                view = follower.view()
                track(view)
                ended = view.state in TERMINAL_RUN_STATES
                yield from drain(final=ended)
                if ended:
                    return
        finally:
            follower.close()
