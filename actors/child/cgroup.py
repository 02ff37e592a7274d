"""cgroup v2 containment: one cgroup per child's tree, where the node may create them.

Owns finding a writable cgroup v2 subtree (`probe`: the cgroup2 mount in
/proc/self/mountinfo, the process's own cgroup in /proc/self/cgroup, a `subagents-node.<id>`
directory below it, a child cgroup made and a process moved into it and back), the node's mark
on that directory while it serves (`mark_serving`), the sweep of what killed nodes left
(`sweep`: never a directory a live node marks), and one child's cgroup (`ChildCgroup`): made
by the shim before the spawn, the agent born in it (the shim enters it for the spawn and leaves
again: `clone3(CLONE_INTO_CGROUP)` is not reachable from Python), its `cgroup.events`
(`populated 0`: no process of the tree is left, whatever it did to its sessions and parents;
the file polls as POLLPRI on each change), its end (`cgroup.kill`, kernel >= 5.14, else
freeze and SIGKILL every pid in `cgroup.procs`) and its removal once empty.

The child cgroups sit below the node's own cgroup, which holds processes and so enables no
controller (cgroup v2's "no internal processes" rule): they contain and account, they do not
limit. Standard library and procfs.py only (the shim template imports it). It never decides
an outcome and never signals anything outside the cgroup it was given.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import time
from typing import Literal, NamedTuple

from subagents_node.actors.child import procfs

#: The node's setting: `auto` uses cgroups where it can, `cgroup` requires them, `subreaper`
#: never uses them.
CONTAINMENT_SETTINGS = ("auto", "cgroup", "subreaper")
ContainmentMode = Literal["cgroup", "subreaper"]
MOUNTINFO = "/proc/self/mountinfo"
OWN_CGROUP = "/proc/self/cgroup"


class Containment(NamedTuple):
    """What the node uses: `cgroup` with the directory its children's cgroups go in, or
    `subreaper` with why not."""

    mode: ContainmentMode
    path: str = ""
    why: str = ""


def cgroup2_mount(mountinfo: str = MOUNTINFO) -> str | None:
    """Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
    on a hybrid host); None without one."""
    try:
        with open(mountinfo, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            return _unescape(left.split(" ")[4])
    return None


def own_cgroup(pid: int | str = "self") -> str | None:
    """The process's cgroup v2 path (`0::/PATH`), relative to the mount; None when it has none
    (or it is the unreachable `/..` of another namespace)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = line[3:].removesuffix(" (deleted)")
            return None if path.startswith("/..") else path
    return None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (`\\040`)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def own_directory() -> str | None:
    """The directory of this process's own cgroup, or None."""
    mount, own = cgroup2_mount(), own_cgroup()
    if mount is None or own is None:
        return None
    return os.path.normpath(mount + own)


@functools.cache  # read once, in the shim template: every shim it forks starts where it is
def template_directory() -> str | None:
    """`own_directory()` of the shim template, the cgroup each shim returns to after its spawn.
    A shim asking /proc itself read two files (mountinfo is KiBs) for every child."""
    return own_directory()


def probe(setting: str, key: str) -> Containment:
    """The containment a node serving `key` (its state dir) uses for `setting`: `subreaper`
    unless cgroup v2 is mounted, a `subagents-node.<hash of key>` directory can be made below
    this process's own cgroup, and a process can be moved into a child of it and back. It
    changes nothing another node could be using, so it may run before the node knows it is the
    only one serving `key` (it moves this process into a cgroup of its own and back: no process
    may be forked meanwhile, or it is born there); `sweep` and `mark_serving` come after."""
    if setting == "subreaper":
        return Containment("subreaper", why="containment = subreaper")
    mount = cgroup2_mount()
    if mount is None:
        return Containment("subreaper", why="no cgroup v2 mount")
    own = own_cgroup()
    if own is None:
        return Containment("subreaper", why="the node's cgroup v2 path is unknown")
    import hashlib  # here, not at the top: libcrypto would add MiBs to every shim's fork

    home = os.path.normpath(mount + own)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    base = os.path.join(home, f"subagents-node.{digest}")
    try:
        os.makedirs(base, exist_ok=True)
        _probe(base, home)
    except OSError as err:
        return Containment("subreaper", why=f"{err.filename or base}: {err.strerror or err}")
    return Containment("cgroup", path=base)


#: A serving node keeps an empty cgroup `node.<pid>.<start ticks>` in its directory: another
#: node's sweep leaves a directory alone while the process it names lives (cgroupfs holds no
#: files, so the mark is a directory too).
SERVING_MARK = "node."


def mark_serving(base: str) -> str:
    """Mark `base` as this process's, serving (made again if a sweep had just removed an empty
    `base`); the mark's path, for `unmark_serving` at a clean stop."""
    pid = os.getpid()
    mark = os.path.join(base, f"{SERVING_MARK}{pid}.{_start_ticks(pid)}")
    os.makedirs(mark, exist_ok=True)
    return mark


def unmark_serving(base: str, mark: str) -> None:
    """A clean stop: the mark goes (`""`: none was made), then `base` if nothing else is in
    it."""
    if mark:
        remove_empty(mark)
    remove_empty(base)


def _start_ticks(pid: int) -> int | None:
    """The start time of the live process `pid`, in clock ticks; None when gone (or a zombie:
    a killed node its parent has not reaped yet serves nothing)."""
    stat = procfs.stat_of(pid)
    if stat is None or stat.state in ("Z", "X"):
        return None
    return round(stat.start_time * procfs.CLK_TCK)


def _serving(base: str, names: list[str]) -> bool:
    """Does a live process mark `base` (a mark whose pid lives with the same start time)?"""
    for name in names:
        pid, _, ticks = name.removeprefix(SERVING_MARK).partition(".")
        if (
            name.startswith(SERVING_MARK)
            and pid.isdigit()
            and ticks.isdigit()
            and _start_ticks(int(pid)) == int(ticks)
        ):
            return True
    return False


def sweep(base: str) -> None:
    """Remove what nodes killed before their clean-up left: the empty child cgroups in `base`
    (no shim of this state dir is between making one and entering it yet), and in the
    `subagents-node.*` directories of other state dirs that no live node marks as serving, their
    empty child cgroups, stale marks and the directory itself (rmdir fails on anything in use;
    a shim whose base was swept makes it again). A live node's directory is left alone: its
    path is what its `status` shows."""
    home = os.path.dirname(base)
    _remove_empty_children(base)
    for name in _listdir(home):
        other = os.path.join(home, name)
        if not name.startswith("subagents-node.") or other == base or not os.path.isdir(other):
            continue
        if not _serving(other, _listdir(other)):
            _remove_empty_children(other)
            remove_empty(other)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _remove_empty_children(path: str) -> None:
    for name in _listdir(path):
        child = os.path.join(path, name)
        if os.path.isdir(child):
            remove_empty(child)


def _probe(base: str, home: str) -> None:
    """Make a child cgroup, move this process in and back out, remove it (OSError if any step
    fails; this process ends where it started)."""
    probe = os.path.join(base, f"probe.{os.getpid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(probe)
    try:
        _write(os.path.join(probe, "cgroup.procs"), str(os.getpid()))
        _write(os.path.join(home, "cgroup.procs"), str(os.getpid()))
        if not os.path.exists(os.path.join(probe, "cgroup.events")):
            raise OSError(0, "cgroup.events is missing", probe)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        try:
            os.write(fd, text.encode())
        except OSError as err:
            err.filename = path
            raise
    finally:
        os.close(fd)


def child_path(base: str, child_id: str) -> str:
    """Where the cgroup of child `child_id` is made below the node's directory `base`."""
    return os.path.join(base, child_id.replace("/", "_"))


class ChildCgroup:
    """One child's cgroup: `create` it, `enter` it, spawn, `leave` it, watch `events_fd`
    (POLLPRI) and ask `populated()`, `kill()` what is in it, `remove()` it once empty."""

    def __init__(self, path: str, home: str) -> None:
        self.path = path
        self._home = home  # the cgroup the shim returns to after the spawn
        self.events_fd = -1

    @classmethod
    def create(cls, base: str, name: str) -> ChildCgroup | None:
        """The cgroup `base/name`, made now; None when it cannot be (the shim then relies on
        the subreaper alone)."""
        home = template_directory()
        if home is None:
            return None
        path = child_path(base, name)
        try:
            for attempt in (1, 2):
                try:
                    if attempt == 1:
                        os.mkdir(path)  # one syscall: the node made its base
                    else:
                        os.makedirs(path, exist_ok=True)
                    break
                except FileExistsError:  # a shim that died before
                    break
                except FileNotFoundError:  # its base swept by a node starting just now
                    if attempt == 2:
                        raise
            # Before anything is in it: every later change (the tree's end) wakes the poller.
            fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        group = cls(path, home)
        group.events_fd = fd
        return group

    def enter(self) -> None:
        """Move this process in (a child it starts now is born in it). OSError if it cannot."""
        _write(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))

    def leave(self) -> None:
        """Move this process back to its own cgroup. OSError if it cannot: then this process
        is in the cgroup too, which must then be neither killed nor waited for."""
        _write(os.path.join(self._home, "cgroup.procs"), str(os.getpid()))

    def populated(self) -> bool:
        """Is any process of the tree still in it? (Re-arms the poll on `events_fd`.)"""
        try:
            text = os.pread(self.events_fd, 256, 0)
        except OSError:
            return False
        return b"populated 1" in text

    def pids(self) -> list[int]:
        return pids_in(self.path)

    def kill(self) -> None:
        kill_all(self.path)

    def remove(self) -> bool:
        """Remove it once empty (False when it cannot be: a process is left, or a cgroup the
        child made below it)."""
        if self.events_fd >= 0:
            os.close(self.events_fd)
            self.events_fd = -1
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


def populated(path: str) -> bool | None:
    """Is the cgroup at `path` populated? None when it is gone (or not a cgroup)."""
    try:
        with open(os.path.join(path, "cgroup.events"), "rb") as fh:
            return b"populated 1" in fh.read()
    except OSError:
        return None


def remove_empty(path: str) -> None:
    """Remove a cgroup if it is empty."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


def remove_when_empty(path: str, timeout: float = 0.5) -> bool:
    """Remove a dead shim's child cgroup once its last process has left it: a process seen
    gone (its pidfd) may leave the cgroup a moment later, so wait for `populated 0` (an
    event on cgroup.events), `timeout` at most. False when it is still there."""
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return not os.path.exists(path)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        deadline = time.monotonic() + timeout
        while b"populated 1" in os.pread(fd, 256, 0):
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                return False
    finally:
        os.close(fd)
    remove_empty(path)
    return not os.path.exists(path)


def pids_in(path: str) -> list[int]:
    """The processes in the cgroup at `path` (none when it is gone)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "rb") as fh:
            return [int(line) for line in fh.read().split()]
    except (OSError, ValueError):
        return []


def kill_all(path: str) -> None:
    """SIGKILL every process in the cgroup at `path`, at once: `cgroup.kill`, or (before 5.14)
    freeze it so nothing forks, kill every pid, thaw."""
    try:
        _write(os.path.join(path, "cgroup.kill"), "1")
        return
    except OSError:
        pass
    freeze = os.path.join(path, "cgroup.freeze")
    with contextlib.suppress(OSError):
        _write(freeze, "1")
    for pid in pids_in(path):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        _write(freeze, "0")
