"""ChildLogCap: every child log file stays under `child_log_max_bytes` (issue 12 item 7).

Owns one inotify descriptor and one thread for all the children of a node, whatever their
number: no thread, pipe or timer per child. The thread makes every inotify call (adding and
removing watches is slow: the caller, the run supervisor, only queues them). A child writes its
stdout and stderr straight into its log files (so it keeps running, and keeps logging, across a
node restart); the kernel tells the thread each time a watched file is modified (IN_MODIFY,
coalesced while unread), and once a file passes the cap the thread cuts its middle in place:

    [head: up to cap/4 bytes] [one line saying how many bytes were cut] [tail: up to cap/4]

(the head ends at a line end, fixed by the first cut; the tail starts at a line start)

Where the file system can (ext4, xfs), the middle goes with fallocate's COLLAPSE_RANGE, which
holds the file's lock while it moves the rest down, so nothing the child writes meanwhile is
lost or misplaced; the range is whole blocks, so the cut line is padded with spaces. Elsewhere
(tmpfs) the file is truncated back to the head and the marker and the tail are appended with
O_APPEND, so the child's own appends keep landing at the end. After a cut the file is about
half the cap, so a child that writes N bytes costs about N/2 bytes of copying in all. On the
truncate path, a write that races the cut itself (the instant between the last size check and
the truncate; the tail is re-read while the size moves) may be lost: the marker's count is of
what was removed, not a guarantee about those few bytes; one that lands between the truncate
and the cut line's write would sit before the cut line, run into the head's last line: it is
moved after the tail. When a child ends, its files get one last check, so a final burst is
cut too.

Each cut is announced beside the file, in `<log>.cut` (replaced atomically, JSON, the layout
of `messages.runs.LogCut`): its generation goes odd just before the rewrite and even once it
is done, with where the tail now starts and how much was cut. A reader that follows the log
(client/logs.py) reads it before and after each read, as a seqlock: a read that a cut crossed
is read again, and a reader past the head goes on where the child's output went on.

Without inotify (not Linux) logs are not capped and a warning says so. It never follows a
symlink, never opens anything but a regular file (a FIFO a child put there would block its
thread: messages/statefiles.py), never touches a file it was not asked to watch, and never
raises into the run supervisor.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import stat
import struct
import threading
from collections.abc import Callable

from subagents_node.actors.child.records import write_atomically
from subagents_node.messages import statefiles
from subagents_node.messages.runs import LOG_CUT_LINE, LOG_CUT_SUFFIX, LogCut

log = logging.getLogger(__name__)

_IN_MODIFY = 0x00000002
_IN_IGNORED = 0x00008000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then `len` bytes of name)
#: The smallest cap: below it the head, the tail and the marker line do not fit.
MIN_CAP = 4096


class _Watched:
    """One capped log file. (Slotted, not a dataclass: ~1 ms of every node's start.)"""

    __slots__ = ("cut", "head", "marker_len", "path", "refs", "wd")

    def __init__(self, path: str, wd: int) -> None:
        self.path = path
        self.wd = wd
        self.refs = 1
        self.cut = 0  # child output removed so far
        self.marker_len = 0  # length of the marker now in the file (not child output)
        self.head = 0  # where the kept head ends (fixed by the first cut)


#: fallocate(2): remove a range of whole blocks and move the rest of the file down.
_FALLOC_FL_COLLAPSE_RANGE = 0x08

#: Queued inotify calls that wake the thread without waiting for `flush`.
WAKE_BATCH = 64


class ChildLogCap:
    """Caps the log files registered with `watch`; `watch` returns the call that unwatches."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(MIN_CAP, max_bytes)
        self._lock = threading.Lock()  # guards the tables: watch() runs in actor threads
        self._cutting = threading.Lock()  # one cut at a time (this thread, or a final check)
        self._by_wd: dict[int, _Watched] = {}  # the thread's: wd -> file
        self._by_path: dict[str, _Watched] = {}  # guarded by _lock
        self._pending: list[tuple[str, _Watched]] = []  # inotify calls for the thread
        self._libc: ctypes.CDLL | None = None
        self._fd = -1
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._stopping = False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = int(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
        except (OSError, AttributeError):
            fd = -1
        if fd < 0:
            log.warning("no inotify here: child logs are not capped at %d bytes", max_bytes)
        else:
            self._libc, self._fd = libc, fd
        self._thread = threading.Thread(target=self._run, name="child-log-cap", daemon=True)
        if self._fd >= 0:
            self._thread.start()

    def watch(self, path: str) -> Callable[[], None]:
        """Watch `path` from now on. The inotify calls themselves (add, and later remove, a
        watch: `inotify_rm_watch` waits for an RCU grace period, about a millisecond) are made
        by the cap's own thread, so the run supervisor never waits on them."""
        if self._libc is None:
            return lambda: None
        with self._lock:
            known = self._by_path.get(path)
            if known is not None:
                known.refs += 1
            else:
                known = _Watched(path, wd=-1)
                self._by_path[path] = known
                self._enqueue("add", known)
        done: list[bool] = []  # a plain flag: unwatch runs on the caller's thread

        def unwatch() -> None:
            if done:
                return
            done.append(True)
            self._unwatch(known)

        return unwatch

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\x01")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for fd in (self._fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._fd = -1

    # -- internals ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Wake the thread for the inotify calls queued since the last flush (the supervisor
        calls it once per commit group: a thread woken per log cost more than the call)."""
        with self._lock:
            if self._pending:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"\x01")

    def _enqueue(self, what: str, watched: _Watched) -> None:
        """Queue an inotify call for the thread (under `_lock`); `flush` wakes it, as does a
        batch of WAKE_BATCH. A remove whose add the thread has not made yet cancels it: a child
        that ended in the group that started it (a short one) costs no inotify call."""
        if what == "remove":
            for i, (kind, pending) in enumerate(self._pending):
                if kind == "add" and pending is watched:
                    del self._pending[i]
                    return
        self._pending.append((what, watched))
        if len(self._pending) >= WAKE_BATCH:
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"\x01")

    def _unwatch(self, watched: _Watched) -> None:
        self._cut_if_over(watched)  # the child's last burst, before its run settles
        with self._lock:
            watched.refs -= 1
            if watched.refs > 0:
                return
            if self._by_path.get(watched.path) is watched:
                del self._by_path[watched.path]
            self._enqueue("remove", watched)

    def _apply_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        assert self._libc is not None
        for what, watched in pending:
            if what == "remove":
                if watched.wd >= 0 and self._by_wd.get(watched.wd) is watched:
                    del self._by_wd[watched.wd]
                    self._libc.inotify_rm_watch(self._fd, watched.wd)
                continue
            if watched.refs <= 0:
                continue  # unwatched before it was ever watched
            wd = int(self._libc.inotify_add_watch(self._fd, watched.path.encode(), _IN_MODIFY))
            if wd < 0:
                log.warning("cannot watch %s: %s", watched.path, os.strerror(ctypes.get_errno()))
                continue
            watched.wd = wd
            self._by_wd[wd] = watched
            self._cut_if_over(watched)  # a child adopted after a restart may be over already

    @property
    def watched(self) -> int:
        """How many log files are watched or about to be (0 once every child settled)."""
        with self._lock:
            return len(self._by_path)

    def _run(self) -> None:
        while not self._stopping:
            ready, _, _ = select.select([self._fd, self._wake_r], [], [])
            if self._stopping:
                return
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                self._apply_pending()
            if self._fd in ready:
                for wd in self._read_events():
                    watched = self._by_wd.get(wd)  # this thread's own table
                    if watched is not None:
                        self._cut_if_over(watched)

    def _read_events(self) -> set[int]:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return set()
        modified: set[int] = set()
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            if mask & _IN_MODIFY and not mask & _IN_IGNORED:
                modified.add(wd)
        return modified

    def _cut_if_over(self, watched: _Watched) -> None:
        try:
            with self._cutting:
                # Most logs end under the cap (every child's two get this check as it ends):
                # one lstat, which follows no link, says so without the open, the checks on
                # the descriptor and the close `_cut` makes. Anything but a regular file under
                # the cap goes that way, which refuses what is not a regular file.
                found = os.lstat(watched.path)
                if stat.S_ISREG(found.st_mode) and found.st_size <= self.max_bytes:
                    return
                self._cut(watched)
        except OSError as exc:  # the file went away or cannot be opened: nothing to cap
            log.debug("child log %s not cut: %s", watched.path, exc)

    @staticmethod
    def _head(watched: _Watched, fd: int, keep: int) -> int:
        """Where the kept head ends: just before the last newline within the first `keep` bytes
        (the cut line's own leading newline ends that line: no empty line before it), fixed by
        the first cut (a later cut, by this node or an earlier one, keeps the same head)."""
        if watched.head:
            return watched.head
        last = LogCut.of(watched.path)
        if last is not None and last.gen % 2 == 0 and last.at:  # cut before this node
            watched.head, watched.cut, watched.marker_len = last.at, last.cut, last.line
            return watched.head
        look = os.pread(fd, min(keep, 4096), keep - min(keep, 4096))
        newline = look.rfind(b"\n")
        watched.head = keep - len(look) + newline if newline >= 0 else keep
        return watched.head

    def _collapse(
        self, watched: _Watched, fd: int, size: int, head: int, keep: int, generation: int
    ) -> bool:
        """Cut the middle out in place with FALLOC_FL_COLLAPSE_RANGE, which holds the file's
        lock while it moves the rest down: a write of the child's waits for it, and nothing
        the child writes meanwhile is lost or misplaced. The range must be whole blocks, so
        the cut line is padded with spaces to a block boundary, and the piece of a line the
        tail would start with is blanked onto the cut line's end. False when the file system
        cannot (tmpfs, say): the caller truncates and rewrites instead."""
        if self._libc is None:
            return False
        block = os.fstat(fd).st_blksize or 4096
        start = size - keep  # where the tail would start, then at its first line
        piece = os.pread(fd, min(keep, 1 << 16), start)
        newline = piece.find(b"\n")
        if not 0 <= newline < len(piece) - 1:
            return False  # no line starts in the tail's first 64 KiB
        tail_at = start + newline + 1
        cut = watched.cut + tail_at - head - watched.marker_len
        line = LOG_CUT_LINE.format(cut=cut, cap=self.max_bytes).encode()
        gone_from = -(-(head + 2 + len(line)) // block) * block  # the cut line, its padding
        gone_to = tail_at // block * block
        if gone_to <= gone_from:
            return False
        padding = b" " * (gone_from - head - 1 - len(line))
        if gone_to == tail_at:  # the tail's newline before it goes: the padding ends the line
            padding = padding[:-1] + b"\n"
        plain = statefiles.open_file(watched.path, os.O_WRONLY)  # a FIFO put there: refused
        try:  # not O_APPEND: pwrite would append, not write where it is told
            os.pwrite(plain, b"\n" + line + padding, head)
            if tail_at - 1 > gone_to:  # the tail's first piece of a line joins the cut line
                os.pwrite(plain, b" " * (tail_at - 1 - gone_to), gone_to)
        finally:
            os.close(plain)
        mode, length = _FALLOC_FL_COLLAPSE_RANGE, gone_to - gone_from
        if self._libc.fallocate(fd, mode, ctypes.c_long(gone_from), ctypes.c_long(length)):
            # Refused (not that file system): the bytes blanked above are in the middle, which
            # the truncate that follows removes anyway.
            return False
        marker_len = (gone_from - head) + (tail_at - gone_to)
        watched.cut, watched.marker_len = cut, marker_len
        _announce(watched.path, LogCut(gen=generation + 1, at=head, cut=cut, line=marker_len))
        return True

    def _cut(self, watched: _Watched) -> None:
        fd = statefiles.open_file(watched.path, os.O_RDWR | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            if size <= self.max_bytes:
                return
            keep = self.max_bytes // 4
            head = self._head(watched, fd, keep)
            # Announced before the tail is read: between the last size check and the truncate
            # nothing else is done (a write landing there is lost, the cut line not counting it).
            generation = _announce(watched.path, None)  # odd: a rewrite is under way
            try:
                if self._collapse(watched, fd, size, head, keep, generation):
                    return
            except OSError as exc:  # what it blanked is in the middle the rewrite removes
                log.debug("child log %s not collapsed: %s", watched.path, exc)
            try:
                # Read the tail until the size holds still between the read and the truncate
                # (bounded: a child that never pauses loses at most what lands in that window).
                for _ in range(5):
                    tail = os.pread(fd, keep, size - keep)
                    grown = os.fstat(fd).st_size
                    if grown == size:
                        break
                    size = grown
                # The tail starts at a line: the piece of a line whose start is cut goes too.
                newline = tail.find(b"\n")
                if 0 <= newline < len(tail) - 1:
                    tail = tail[newline + 1 :]
                cut = watched.cut + size - head - len(tail) - watched.marker_len
                line = LOG_CUT_LINE.format(cut=cut, cap=self.max_bytes)
                marker = f"\n{line}\n".encode()
                os.ftruncate(fd, head)
                os.write(fd, marker + tail)
                _put_back_in_order(fd, head, marker, len(tail))
                watched.cut, watched.marker_len = cut, len(marker)
            finally:  # even again, also when the rewrite failed: readers must not wait on it
                done = LogCut(gen=generation + 1, at=head, cut=watched.cut, line=watched.marker_len)
                _announce(watched.path, done)
        finally:
            os.close(fd)


def _put_back_in_order(fd: int, head: int, marker: bytes, tail_len: int) -> None:
    """The child appends while the file is rewritten: a write that landed between the truncate
    and the cut line's write sits before the cut line, though it came after the tail. Move it
    after the tail (bounded: each move has the same narrow window, and a reader waits on the
    odd announcement meanwhile)."""
    for _ in range(3):
        if os.pread(fd, len(marker), head) == marker:
            return
        rest = os.pread(fd, os.fstat(fd).st_size - head, head)
        at = rest.find(marker)
        if at < 0:
            return
        early, after = rest[:at], rest[at + len(marker) :]
        os.ftruncate(fd, head)
        os.write(fd, marker + after[:tail_len] + early + after[tail_len:])


def _announce(path: str, done: LogCut | None) -> int:
    """Write `<path>.cut`: `done`, or (None) the next odd generation (a rewrite under way),
    above whatever an earlier node wrote there; the generation written."""
    if done is None:
        last = LogCut.of(path)
        gen = 1 if last is None else last.gen + (1 if last.gen % 2 == 0 else 2)
        done = LogCut(gen=gen)
    write_atomically(path + LOG_CUT_SUFFIX, done.model_dump(), sync=False)
    return done.gen
