"""ShimTemplate: the pre-imported process the run supervisor's shims are forked from.

Owns one small process (`python -m subagents_node.actors.child.template`) that has imported
what a shim needs and forks one shim per order written to its stdin, so a child costs a fork,
not an interpreter start, and the order's shape (`order_of`). It exits when its stdin closes
(the supervisor is gone); the shims it forked do not. Its stdout is the announce pipe each
fork is announced on (read by `ShimWatch`, shims.py). A template found gone (a write to a
closed pipe) or stopped (SIGSTOP, from any of its shims' children) is replaced at the next
order; a stopped one is ended at once (`_end_when_stopped`), so the shims it forked, which it
no longer continues when a child stops them, are the supervisor's strays (strays.py).

It never reads the announce pipe, never waits on a shim and never writes a table.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from subagents_node.actors.child.procfs import ProcessIdentity
from subagents_node.messages.runs import ChildSpec

log = logging.getLogger(__name__)

TEMPLATE_MODULE = "subagents_node.actors.child.template"
#: The template's order pipe (F_SETPIPE_SZ; 1 MiB is Linux's default limit for a user).
ORDER_PIPE_BYTES = 1 << 20


def order_of(
    spec: ChildSpec,
    node_address: str,
    sync: bool = True,
    cgroup_base: str = "",
    ends_with: ProcessIdentity | None = None,
) -> dict[str, Any]:
    """What the shim is told: the spec, where its records go, where to report, whether to
    fsync its exit record (as the node's store syncs its commits: synchronous=FULL), where
    to make the child's cgroup ('' for none: the subreaper alone) and the embedded node whose
    death ends the child (None: the child outlives its node, for the next one to adopt)."""
    return {
        **spec.model_dump(mode="json"),
        "record_dir": spec.records,
        "node_address": node_address,
        "sync": sync,
        "cgroup_base": cgroup_base,
        "ends_with": None if ends_with is None else [ends_with.pid, ends_with.start_time],
    }


class ShimTemplate:
    """The pre-imported process shims are forked from; started on first use, restarted when it
    is found gone (a write to a closed pipe)."""

    def __init__(
        self,
        open_files: int | None = None,
        on_start: Callable[[int, int], None] | None = None,
    ) -> None:
        """`open_files`: the soft limit on open files the template, its shims and so every
        child start with (None: this process's). `on_start(fd, pid)` is given the read end of each
        template's announce pipe (its stdout, where each shim it forks writes its identity
        before it starts the child: `ShimWatch.listen`), which it then owns; None: no pipe."""
        self._on_start = on_start
        self._proc: subprocess.Popen[bytes] | None = None
        self._argv = [sys.executable, "-m", TEMPLATE_MODULE]
        if open_files is not None:
            self._argv.append(str(open_files))

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def order(
        self,
        spec: ChildSpec,
        node_address: str,
        sync: bool = True,
        cgroup_base: str = "",
        ends_with: ProcessIdentity | None = None,
    ) -> None:
        """Fork a shim for `spec`. Raises OSError when no template can be started."""
        self.order_raw(order_of(spec, node_address, sync, cgroup_base, ends_with))

    def order_raw(self, order: dict[str, Any]) -> None:
        """Fork a shim for an order as `order_of` builds it (tests add their own knobs)."""
        line = (json.dumps(order) + "\n").encode()
        for _attempt in range(2):
            proc = self._ensure()
            assert proc.stdin is not None
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
                return
            except (BrokenPipeError, ValueError):
                log.warning("the shim template (pid %d) is gone; starting another", proc.pid)
                self.close()
        raise OSError("the shim template cannot be started")

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and _stopped(self._proc.pid):
            # Frozen (SIGSTOP: any child can send it, the template is its shim's parent): it
            # forks nothing more, and every launch after it waited for good. Its orders not
            # forked end not-started when its announce pipe ends (ShimWatch); a new one serves.
            log.warning("the shim template (pid %d) is stopped; starting another", self._proc.pid)
            self._proc.kill()
            self.close()
        if self._proc is None or self._proc.poll() is not None:
            announce_r, announce_w = -1, subprocess.DEVNULL
            if self._on_start is not None:
                announce_r, announce_w = os.pipe2(os.O_CLOEXEC)
                os.set_blocking(announce_w, False)  # a shim never waits on the supervisor
                with contextlib.suppress(OSError):  # room for a burst's announcements
                    fcntl.fcntl(announce_r, fcntl.F_SETPIPE_SZ, ORDER_PIPE_BYTES)
            try:
                self._proc = subprocess.Popen(
                    self._argv,
                    stdin=subprocess.PIPE,
                    stdout=announce_w,
                    stderr=None,
                    cwd="/",
                    close_fds=True,
                )
            except BaseException:
                if announce_r >= 0:
                    os.close(announce_r)
                raise
            finally:
                if announce_r >= 0:
                    os.close(announce_w)  # the template and its shims hold it now
            _end_when_stopped(self._proc.pid)
            if self._on_start is not None:
                self._on_start(announce_r, self._proc.pid)
            assert self._proc.stdin is not None
            # A burst of orders (a run's first group) fits in the pipe: the supervisor's write
            # returns at once instead of waiting, order by order, for the template to fork.
            with contextlib.suppress(OSError):
                fcntl.fcntl(self._proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, ORDER_PIPE_BYTES)
        return self._proc

    def close(self) -> None:
        """Close its stdin: it exits; the shims it forked keep running."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _stopped(pid: int) -> bool:
    """Is our child `pid` stopped (SIGSTOP)? Its status is left to be waited for (WNOWAIT)."""
    try:
        found = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return found is not None and found.si_code == os.CLD_STOPPED


def _end_when_stopped(pid: int) -> None:
    """SIGKILL our template `pid` as soon as it stops. A stopped template forks nothing and no
    longer continues the shims a child stops (shimstops.py): a child that stopped the template,
    then its own shim, and exited left its run `running` for good when no order came after.
    Its end is an event (its announce pipe ends: the watch then treats its shims as strays).
    One thread per template, blocked in waitid on a pidfd of our unreaped child (no pid
    reuse); WNOWAIT: the reap stays Popen's, and the thread ends with the template (or with
    ECHILD, once Popen reaped it)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # no descriptor left: a stopped template is ended at the next order, as before

    def wait() -> None:
        try:
            found = os.waitid(os.P_PIDFD, fd, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
            if found is not None and found.si_code == os.CLD_STOPPED:
                log.warning("the shim template (pid %d) is stopped; ending it", pid)
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass  # reaped already (ECHILD)
        finally:
            os.close(fd)

    threading.Thread(target=wait, name="template-stop", daemon=True).start()
