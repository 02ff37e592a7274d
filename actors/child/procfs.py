"""What /proc says about processes: identity (pid + start time), descendants, process groups.

Owns no state and imports only the standard library, because the child shim (a process forked
from a template that must stay small) uses it as well as the run supervisor. A process is
identified by its pid and its start time in seconds since boot (/proc/PID/stat field 22), a
clock no wall-clock step can move; a reused pid never passes for the process we recorded, and
start times compare only within one boot (`boot_id`). Linux only, like pidfds and subreapers.

It must never signal anything: callers decide what to end.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

#: Two different processes started at least one clock tick (10 ms) apart.
START_TIME_TOLERANCE_S = 0.005
CLK_TCK = os.sysconf("SC_CLK_TCK")


class ProcessIdentity(NamedTuple):
    """A pid and its start time in seconds since boot. (Named tuples, not dataclasses: the
    shim template imports this module, and `dataclasses` would add a MiB to every fork.)"""

    pid: int
    start_time: float


class ProcStat(NamedTuple):
    """The fields of /proc/PID/stat the shim and the supervisor need."""

    state: str
    ppid: int
    pgid: int
    start_time: float
    session: int = 0


def stat_of(pid: int) -> ProcStat | None:
    try:
        return read_stat(pid)
    except OSError:
        return None


def read_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat, None when the process is gone; any other failure to read it (no file
    descriptor left, say) is raised: it says nothing about the process."""
    # os.open/os.read, not open(): a shim reads its own and its child's stat right after its
    # fork, and the io module's objects (a FileIO, a BufferedReader) it would touch to do so
    # copy some 60 of the template's pages into each shim (a page fault each).
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        raw = os.read(fd, 4096)  # one read: procfs makes the whole file at once
    except ProcessLookupError:
        return None
    finally:
        os.close(fd)
    fields = raw[raw.rindex(b")") + 2 :].split()  # the command name may hold spaces
    return ProcStat(
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        start_time=int(fields[19]) / CLK_TCK,
        session=int(fields[3]),
    )


def start_time_of(pid: int, *, zombies: bool = False) -> float | None:
    """When the live process `pid` started (seconds since boot); None when gone or (unless
    asked for: our own unreaped child may be one) a zombie."""
    stat = stat_of(pid)
    if stat is None or stat.state == "X" or (stat.state == "Z" and not zombies):
        return None
    return stat.start_time


def identity_of(pid: int) -> ProcessIdentity | None:
    started = start_time_of(pid)
    return None if started is None else ProcessIdentity(pid, started)


def is_alive(identity: ProcessIdentity) -> bool:
    """True when `identity.pid` still runs the process that started at `identity.start_time`
    (an unreadable /proc counts as not running)."""
    return is_alive_or_unknown(identity) is True


def is_alive_or_unknown(identity: ProcessIdentity) -> bool | None:
    """`is_alive`, or None when /proc could not be read (no descriptor left, say)."""
    try:
        stat = read_stat(identity.pid)
    except OSError:
        return None
    if stat is None or stat.state in ("X", "Z"):
        return False
    return abs(stat.start_time - identity.start_time) < START_TIME_TOLERANCE_S


@functools.cache  # one boot per process life: read once (the template reads it for its shims)
def boot_time() -> float:
    """The wall-clock time of this boot (btime in /proc/stat)."""
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return 0.0


def wall_clock(start_time: float) -> float:
    """A start time since boot as seconds since the epoch (for people and the proof)."""
    return start_time + boot_time()


@functools.cache
def boot_id() -> str:
    """This boot's identity: start times since boot compare only within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def in_session(sid: int) -> list[ProcessIdentity]:
    """Every live process of session `sid` (a dead shim's: what its child left in it, which a
    session id names for as long as one of them lives). One scan of /proc, on a shim's death."""
    found: list[ProcessIdentity] = []
    for name in os.listdir("/proc"):
        stat = stat_of(int(name)) if name.isdigit() else None
        if stat is not None and stat.session == sid and stat.state not in ("Z", "X"):
            found.append(ProcessIdentity(int(name), stat.start_time))
    return found


def descendants(root: int) -> list[tuple[int, ProcStat]]:
    """Every live process below `root` by parent links, with its stat. One scan of /proc:
    called only to end a tree (stop, deadline, a leader's group left behind), never per tick."""
    children: dict[int, list[tuple[int, ProcStat]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = stat_of(int(name))
        if stat is not None and stat.state not in ("Z", "X"):
            children.setdefault(stat.ppid, []).append((int(name), stat))
    found: list[tuple[int, ProcStat]] = []
    todo = [root]
    while todo:
        for pid, stat in children.get(todo.pop(), ()):
            found.append((pid, stat))
            todo.append(pid)
    return found
