"""Process identity, process-group signalling and event-driven exit watching, for ChildActor.

Owns no durable state. A process is identified by pid + start time (since boot, see
`start_time_of`), so a reused pid never passes for the process we recorded; a zombie is gone.

Exit watching is event-driven: one daemon thread per watch blocks in `poll()` on pidfds (Linux
>= 5.3), which become readable when the process exits, whether or not we are its parent. Only
the thread that owns a `Popen` reaps it (`Popen.wait`), so no exit status is stolen. Without
pidfd support the fallback blocks in `Popen.wait()` for our own children and in psutil's wait
for the others (which polls, and reaps a target that happens to be our child: a fallback only).

It must never signal a process group that it has not just seen alive (a group id cannot be
reused while a member lives), and never block the caller: watches run on their own threads.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

#: True where the kernel and Python support pidfds (Linux >= 5.3).
PIDFD = hasattr(os, "pidfd_open")
#: Two different processes started at least one clock tick (10 ms) apart.
_START_TIME_TOLERANCE_S = 0.005
_PROC = Path("/proc")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A pid and its start time on the identity clock (see `start_time_of`)."""

    pid: int
    start_time: float


def start_time_of(pid: int, *, zombies: bool = False) -> float | None:
    """When the live process `pid` started, on a clock no wall-clock step can move: seconds
    since boot on Linux (/proc/PID/stat starttime). psutil's `create_time` adds the boot time,
    which moves whenever the wall clock is stepped (NTP, a VM resumed from a snapshot), so an
    identity compared on it could call a live process gone. None when gone or (unless asked
    for: our own unreaped child may be one) a zombie."""
    if not _PROC.is_dir():
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE and not zombies:
                return None
            return float(proc.create_time())
        except psutil.Error:
            return None
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may hold spaces
    if fields[0] == b"X" or (fields[0] == b"Z" and not zombies):
        return None
    return int(fields[19]) / _CLK_TCK


def wall_clock(start_time: float) -> float:
    """A `start_time_of` value as seconds since the epoch (what psutil's create_time says)."""
    return start_time + psutil.boot_time() if _PROC.is_dir() else start_time


def boot_id() -> str:
    """This boot's identity: start times since boot compare only within one boot."""
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def identity_of(pid: int) -> ProcessIdentity | None:
    started = start_time_of(pid)
    return None if started is None else ProcessIdentity(pid, started)


def is_alive(identity: ProcessIdentity) -> bool:
    """True when `identity.pid` still runs the process that started at `identity.start_time`."""
    started = start_time_of(identity.pid)
    return started is not None and abs(started - identity.start_time) < _START_TIME_TOLERANCE_S


def group_exists(pgid: int) -> bool:
    """True when some process (zombies included) is still in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_group_members(pgid: int) -> list[ProcessIdentity]:
    """Live (non-zombie) members of process group `pgid`. Scans the process table: call it
    only after `group_exists` said yes (the common case, an empty group, costs one syscall)."""
    if not group_exists(pgid):
        return []
    members: list[ProcessIdentity] = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        member = identity_of(pid)
        if member is not None:
            members.append(member)
    return members


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to every member of `pgid`; False when the group is already empty."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("not allowed to signal process group %d", pgid)
        return False
    return True


class ExitWatch:
    """Calls `on_exit()` once, from its own thread, when every target process has exited.

    `popen` (our own child, the only target) is reaped with `Popen.wait()` before `on_exit`
    runs, so its `returncode` is set. `cancel()` wakes the thread and drops the callback.
    """

    def __init__(
        self,
        targets: Sequence[ProcessIdentity],
        on_exit: Callable[[], None],
        *,
        popen: subprocess.Popen[bytes] | None = None,
        name: str = "exit-watch",
    ) -> None:
        self._targets = list(targets)
        self._on_exit = on_exit
        self._popen = popen
        self._lock = threading.Lock()
        self._cancelled = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            self._close_wake_w()

    def _close_wake_w(self) -> None:
        # Closing the write end wakes poll() with POLLHUP on the read end.
        if self._wake_w >= 0:
            os.close(self._wake_w)
            self._wake_w = -1

    def _run(self) -> None:
        try:
            exited = self._wait_pidfds() if PIDFD else self._wait_fallback()
            if exited and self._popen is not None:
                self._popen.wait()
            with self._lock:
                fire = exited and not self._cancelled
            if fire:
                self._on_exit()
        except Exception:
            log.exception("exit watch failed")
        finally:
            os.close(self._wake_r)
            with self._lock:
                self._close_wake_w()

    def _open_pidfds(self) -> list[int]:
        """pidfds of the targets still alive; opening first, then checking the identity,
        closes the window in which a pid could be reused between the check and the open."""
        fds: list[int] = []
        for target in self._targets:
            try:
                fd = os.pidfd_open(target.pid)
            except (ProcessLookupError, OSError):
                continue
            if is_alive(target):
                fds.append(fd)
            else:
                os.close(fd)
        return fds

    def _wait_pidfds(self) -> bool:
        fds = set(self._open_pidfds())
        try:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            for fd in fds:
                poller.register(fd, select.POLLIN)
            while fds:
                for fd, _ in poller.poll():
                    if fd == self._wake_r:
                        return False
                    poller.unregister(fd)
                    fds.discard(fd)
                    os.close(fd)
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def _wait_fallback(self) -> bool:
        if self._popen is not None:
            self._popen.wait()
            return True
        procs: list[psutil.Process] = []
        for target in self._targets:
            with suppress(psutil.Error):
                proc = psutil.Process(target.pid)
                if is_alive(target):
                    procs.append(proc)
        while procs:
            _, procs = psutil.wait_procs(procs, timeout=1.0)
            with self._lock:
                if self._cancelled:
                    return False
        return True
