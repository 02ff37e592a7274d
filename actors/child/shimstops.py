"""StoppedShims: the shim template's one thread that continues a shim a child stopped.

A child can stop its shim (SIGSTOP to its parent, `kill -STOP $PPID`), and a stopped shim does
nothing: it reaps nobody, writes no exit record and sends no report. A child that then exited
stayed a zombie under it, and its run stayed `running`, its slot held, for good when it had no
deadline (no event told the supervisor: a pidfd is not readable for a stop). The template is
every shim's parent, and a parent is told of its children's stops: this thread blocks in
`waitid(P_ALL, WSTOPPED)` and sends each stopped shim SIGCONT, so the shim goes on as if never
stopped (it reaps the child, records and reports its real exit status: the proof stays its
parent's, SPEC §0.4). The template ignores SIGCHLD (the kernel reaps its shims), which spares
it a signal per shim; the kernel still wakes a waiter at each stop, and at a shim's exit it
rescans the children in the kernel and sleeps again: no Python runs, and nothing is written in
the template's pages, except at a stop or when the template has no shim left (`ECHILD`: the
thread then sleeps on an eventfd that the next fork writes, `forked`).

It never signals a process that is not the template's own stopped child (the stop is left to
be waited for, WNOWAIT, then taken through a pidfd of that pid: a pid reused meanwhile is
another process and is left alone), never kills, never writes on the template's pipes, and
runs no code of its own between forks while shims live.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import warnings


class StoppedShims:
    """`start()` once (in the template, after its warm-up, before it serves), then `forked()`
    after each fork (one attribute read unless the thread sleeps for want of a shim)."""

    def __init__(self) -> None:
        #: The thread sleeps on `_wake` (the template had no child): the next fork wakes it.
        self.idle = False
        self._wake = os.eventfd(0, os.EFD_CLOEXEC)

    def start(self) -> None:
        # A bare thread (`_thread`, not `threading`): nothing of it is registered for the
        # at-fork hooks a shim would run.
        _thread.start_new_thread(self._run, ())
        # Python 3.12+ warns at each fork of a process with threads (a thread holding a lock
        # at the fork would leave it held in the child). This one holds none when the template
        # forks: it is blocked in waitid or eventfd_read, or waits for the GIL the fork holds.
        warnings.filterwarnings(
            "ignore", message=r".* is multi-threaded, use of fork\(\)", category=DeprecationWarning
        )

    def forked(self) -> None:
        """A shim was just forked: a thread asleep for want of a child waits on it now."""
        if self.idle:
            self.idle = False
            with contextlib.suppress(OSError):
                os.eventfd_write(self._wake, 1)

    def _run(self) -> None:
        while True:
            try:
                found = os.waitid(os.P_ALL, 0, os.WSTOPPED | os.WNOWAIT)
            except ChildProcessError:  # no shim: sleep until the next fork
                self._sleep()
                continue
            except OSError:  # nothing else is expected: end rather than spin on it
                return
            if found is not None:
                self._resume(found.si_pid)

    def _sleep(self) -> None:
        self.idle = True
        # A fork between the failed wait and `idle` (the main thread saw it unset): the
        # child is there now, and is waited on at once.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_ALL, 0, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
            self.idle = False
            return
        with contextlib.suppress(OSError):
            os.eventfd_read(self._wake)
        self.idle = False

    @staticmethod
    def _resume(pid: int) -> None:
        """Take the stop of our child `pid` and continue it. Through a pidfd: the stop is
        taken only if the process that pidfd names is our stopped child (a shim killed since,
        reaped, and its pid reused is not signalled). The stop is always taken (or found
        gone): one left would be found again at once, the thread spinning on it."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # killed since (a stopped process only dies of SIGKILL), and reaped
        except OSError:  # no descriptor left
            fd = -1
        try:
            if fd >= 0:
                with contextlib.suppress(ChildProcessError):  # not our child: a pid reused
                    if os.waitid(os.P_PIDFD, fd, os.WSTOPPED | os.WNOHANG) is not None:
                        signal.pidfd_send_signal(fd, signal.SIGCONT)
                return
        except OSError:  # a kernel without P_PIDFD: by pid, as with no descriptor left
            pass
        finally:
            if fd >= 0:
                os.close(fd)
        # By pid: it names our stopped child until that child dies, of a SIGKILL alone.
        with contextlib.suppress(OSError):
            if os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG) is not None:
                os.kill(pid, signal.SIGCONT)
