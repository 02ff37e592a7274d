"""Following a run's child logs: what `logs RUN [--child PATH] [-f]` and any client stream.

Owns reading each child's stdout and stderr log from the byte offset it has reached, a chunk
at a time, cutting the bytes into labelled lines (a line still being written is held until its
newline, or until the run ends), going on across a cut of a capped log where the child's
output went on (nothing printed twice; the cut line when something was cut before it was
read), and, when following, waking only on events: inotify on the run's directory for new
bytes or a new log file (client/inotify.py, ctypes), and the run's `runs.watch` long-poll at
the node for a child that started and for the run's end. The long-poll runs on a helper
thread with its own connection (ZeroMQ sockets belong to one thread) that wakes the reader
through a pipe. What it has read is kept apart (`LogsRead`), so a caller whose node stopped or
was killed mid-follow can follow on from there on the next node (the CLI waits for it: this
module never waits for or starts a node). It never polls files on a timer, never writes, and
never imports the node.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from subagents_node.client.inotify import DirectoryWatch
from subagents_node.messages import statefiles
from subagents_node.messages.errors import BadRequest, SubagentsError
from subagents_node.messages.runs import (
    LOG_CUT_LINE,
    LOG_CUT_PATTERN,
    LOG_CUT_SUFFIX,
    TERMINAL_RUN_STATES,
    LogCut,
)
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


#: How much of a log one read takes: a 64 MiB log is streamed, never held whole.
READ_CHUNK = 1 << 20
#: A cut takes milliseconds: one announced as under way for longer was left so by an owner
#: that died in the middle, and is not waited for.
STALE_CUT_S = 10.0


@dataclass
class _LogFile:
    """One log file as far as it was read. `offset` is where the next read starts in the file;
    `cut`/`marker_len` are the count and the length of the cut line before it: a capped log is
    rewritten in place (head, cut line, tail: actors/child/logcap.py), so the position in the
    child's output is `offset - marker_len + cut`, which is what survives a cut; `gen` is the
    cut announcement (`LogCut`) this reader has taken into account."""

    label: str
    stream: Stream
    path: str
    offset: int = 0
    partial: bytes = field(default=b"")
    cut: int = 0
    marker_len: int = 0
    gen: int = 0

    def new_lines(self, final: bool) -> tuple[list[LogLine], bool]:
        """The complete lines of the next chunk written since the last call (and the rest,
        when `final` and nothing is left); True when more is waiting to be read."""
        lines: list[LogLine] = []
        # A seqlock on the node's word about cuts (`<log>.cut`): a read that a cut crossed is
        # thrown away and done again; one that follows a cut first finds its place again.
        before = LogCut.of(self.path, tolerant=True)
        if before is not None and before.gen % 2:  # a cut under way
            if not final and not _stale(self.path):
                return [], False  # its end (the announcement) wakes the follower
        elif before is not None and before.gen != self.gen:
            if self.offset > before.at:  # past the head: the file changed under this reader
                lines += self._across_cut(before)
            self.gen = before.gen
        try:
            fd = _open_log(self.path)
            try:
                size = os.fstat(fd).st_size
                data = os.pread(fd, READ_CHUNK, self.offset) if size > self.offset else b""
            finally:
                os.close(fd)
        except FileNotFoundError:
            return lines, False
        except OSError as exc:
            raise BadRequest(f"cannot read {self.path}: {exc.strerror}", reason="log") from None
        if LogCut.of(self.path, tolerant=True) != before:
            return lines, True  # a cut crossed this read: nothing changed here, read again
        if size < self.offset:  # shrunk with no word of a cut: read on from its end
            self.offset, self.partial = size, b""
        self.offset += len(data)
        more = self.offset < size
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        if final and not more and self.partial:
            chunks.append(self.partial)
            self.partial = b""
        for chunk in chunks:
            if (cut := LOG_CUT_PATTERN.fullmatch(chunk)) is not None:
                self.cut, self.marker_len = int(cut.group(1)), len(chunk) + 2
                chunk = chunk.rstrip(b" ")  # the cut line's padding (to a block boundary)
            lines.append(LogLine(self.label, self.stream, chunk.decode("utf-8", "replace")))
        return lines, more

    def _across_cut(self, cut: LogCut) -> list[LogLine]:
        """The node cut the file (head, cut line, tail). Skip what of the tail was read
        already; if some output was cut before it was read, say so (the cut line) and go on
        from the tail."""
        position = self.offset - self.marker_len + self.cut  # in the child's output
        tail, tail_position = cut.at + cut.line, cut.at + cut.cut
        self.cut, self.marker_len = cut.cut, cut.line
        if position >= tail_position:  # nothing was lost: go on where this reader was
            self.offset = tail + position - tail_position
            return []
        # The line this reader was in the middle of lost its end: it is not printed.
        self.offset, self.partial = tail, b""
        try:  # the node's own cut line, between its newlines
            fd = _open_log(self.path)
            try:
                line = os.pread(fd, max(0, cut.line - 1), cut.at + 1).rstrip(b"\n ")
            finally:
                os.close(fd)
        except OSError:
            line = b""
        if not LOG_CUT_PATTERN.fullmatch(line):
            line = LOG_CUT_LINE.format(cut=cut.cut, cap="?").encode()
        text = line.rstrip(b" \n").decode("utf-8", "replace")
        return [LogLine(self.label, self.stream, text)]


@dataclass
class LogsRead:
    """How far one reader has read a run's child logs: each log file it follows, by path, with
    its offset and the line still being written. A follow given the one an earlier follow of
    the run left (one that ended with NodeNotRunning: the node stopped or was killed, the
    children and their logs went on) goes on from there, so no line is printed twice and none
    is lost."""

    files: dict[str, _LogFile] = field(default_factory=dict)


def _open_log(path: str) -> int:
    """A descriptor of the child log at `path`: a regular file, never through a symlink
    (messages/statefiles.py). Opening a FIFO put in its place waited for a writer, so `logs`
    hung for good; a link led it to print a file from elsewhere."""
    return statefiles.open_file(path)


def _stale(log_path: str) -> bool:
    """Whether a cut announced as under way has been so for longer than any cut takes: the
    owner that made it died in the middle (the log is then read as it is)."""
    try:
        age = time.time() - os.stat(log_path + LOG_CUT_SUFFIX).st_mtime
    except OSError:
        return True
    return age > STALE_CUT_S


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
    client: Client,
    run_id: str,
    child: str | None = None,
    follow: bool = False,
    read: LogsRead | None = None,
) -> Iterator[LogLine]:
    """The lines of a run's child logs (stdout and stderr, per child in order); with `follow`,
    keep streaming new lines as they are written until the run has ended. `read`: what an
    earlier follow of the run read (the lines after it are given), kept up to date as lines
    are given. A node lost under a follow ends it with NodeNotRunning after the last line it
    gave; nothing read is lost with it."""
    run = client.runs.show(run_id)
    if run.state in TERMINAL_RUN_STATES and not os.path.isdir(run.run_dir):
        # Pruned on a full disk: its directory went first, its record stays until the next
        # prune. Printing nothing would read as "the children wrote nothing".
        raise BadRequest(
            f"run {run.run_id} has no logs any more: its directory was pruned",
            reason="run_dir_gone",
        )
    chosen = {c.index for c in select_children(run, child)}
    files = (LogsRead() if read is None else read).files

    def track(view: RunView) -> None:
        for c in view.children:
            if c.index not in chosen:
                continue
            for stream, path in (("stdout", c.stdout_path), ("stderr", c.stderr_path)):
                if path and path not in files:
                    files[path] = _LogFile(c.label, stream, path)  # type: ignore[arg-type]

    def drain(final: bool) -> Iterator[LogLine]:
        for log in list(files.values()):
            more = True
            while more:
                lines, more = log.new_lines(final)
                yield from lines

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
