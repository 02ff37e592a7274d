"""The child shim: one small process per child, its parent and the subreaper of its tree.

Owns one child process tree from spawn to its end, and the two files beside the run that
record it (`shim.json`: who the shim is; `exit.json`: the exit status and whether the tree
ended), written atomically (temp, rename; fsync too when the node's store syncs its commits,
so the record is exactly as durable as the row it stands in for). Its life:

    setsid (nobody's terminal job; it outlives the node) and PR_SET_CHILD_SUBREAPER
    claim shim.json (link(2): fails if recovery already gave this child up) -> start the agent
      in its own process group, stdio straight to the run's log files
    report `started(pid, start time)`; reap every descendant (a `setsid()` daemon is
      re-parented to the shim, so it is still seen); the leader's exit -> exit.json -> report
      `exited`; a leader's group left behind is ended (TERM, grace, KILL); no descendant left
      -> exit.json with `tree_ended` -> report `tree_ended` -> exit once every report is acked
    SIGTERM (the supervisor's stop) or the deadline: TERM, grace, KILL to every descendant and
      every group they are in, escaped sessions included (found through /proc)
    bound at spawn to an embedded node (`ends_with`, actors/runs/binding.py), the death of that
      process (its pidfd readable) ends the tree the same way (`ended_by: node_gone`): nothing
      would adopt it; the exit record is written and the shim exits without waiting for a node
    a rebind (actors/child/rebind.py: `bind.json`, then SIGWINCH) from a node that adopted it:
      it watches the process named there instead (the foreground command that took it over)

Reports go to the run supervisor over ZeroMQ (ZMTP 3.0 as a DEALER to the supervisor's ROUTER,
spoken by actors/child/zmtp.py over one plain socket: no libzmq context, no thread; type
`child.report`), carry a sequence number and every fact known so far, and are resent with
backoff until acknowledged. With the node gone the shim keeps its child running and keeps
trying, and a new node adopts it by acknowledging. One thread; signals arrive through a
wake-up pipe polled beside the socket (and the cgroup's events), so nothing polls on a timer.

The records it writes are actors/child/records.py's, the spawn itself actors/child/spawn.py's,
the delivery of its reports actors/child/reports.py's; this module is the shim's life and its
loop. It imports only the standard library and msgpack (the template that forks shims must
stay small: a shim costs a fork, not an interpreter), never logs argv, env or stdin (they may
hold the task, R-MISC-1), and never decides a run's outcome.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import math
import os
import select
import signal
import time
from typing import Any

from subagents_node.actors.child import procfs, rebind
from subagents_node.actors.child.cgroup import ChildCgroup
from subagents_node.actors.child.records import EXIT_RECORD, SHIM_RECORD, write_atomically
from subagents_node.actors.child.reports import MAX_REPORTED_PROCESSES, ReportDelivery
from subagents_node.actors.child.spawn import spawn_agent, spawn_error
from subagents_node.actors.child.zmtp import ReportLink

_PR_SET_CHILD_SUBREAPER = 36
#: After its tree ended the shim keeps nothing alive; its exit record (synced) says all its
#: reports say, so it stops retrying after this long and exits: a running supervisor sees it
#: go (pidfd) and reads the record, a new node reads it at recovery.
GIVE_UP_AFTER_TREE_END_S = 30.0
#: Why an exit record could not be written that a later try may not meet: a full disk or
#: quota, or a file system remounted read-only for repair.
_SPACE_MAY_COME_BACK = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class Shim:
    """One child's shim: `run()` is the whole life of the process (it returns an exit code)."""

    def __init__(self, order: dict[str, Any]) -> None:
        self.order = order
        self.record_dir: str = order["record_dir"]
        self.facts: dict[str, Any] = {
            "child_id": order["child_id"],
            "run_id": order["run_id"],
            "shim_pid": os.getpid(),
            "shim_start": procfs.start_time_of(os.getpid()) or 0.0,
            "boot_id": procfs.boot_id(),
        }
        self.leader = 0
        self.leader_gone = False
        self.tree_ended = False
        self.ended_by = ""
        self.term_at: float | None = None  # when the TERM of a whole-tree end was sent
        self.kill_at: float | None = None
        self.group_kill_at: float | None = None
        deadline_s = order.get("deadline_s")
        self.deadline = None if deadline_s is None else time.monotonic() + float(deadline_s)
        self.grace_s = float(order.get("grace_s", 2.0))
        self.reports = ReportDelivery()
        #: Sync the exit record (fsync) only when the node's store syncs its commits too
        #: (synchronous=FULL, the opt-in for power loss): a process crash loses neither.
        self.sync = bool(order.get("sync", True))
        #: The child's own cgroup (the node's containment is cgroup v2), else None.
        self.cgroup: ChildCgroup | None = None
        #: The newest exit record could not be written (a full or read-only disk): it is
        #: written again at each report resend, and the shim never gives up while it is owed.
        self.record_owed = False
        #: The embedded node this child ends with died (its pidfd became readable).
        self.node_gone = False
        #: [pid, start time] of the process this child ends with (None: it outlives its node).
        self.bound_to: list[float] | None = None

    # -- the life of the shim -------------------------------------------------------------------

    def run(self) -> int:
        # Its template announced it already (actors/child/template.py), right after the fork.
        os.setsid()
        _prctl()(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the template's pipes are not ours to hold
            os.dup2(devnull, fd)
        os.close(devnull)
        # The version says which messages this shim takes (a rebind: actors/child/rebind.py).
        claim = {**self.facts, "at": time.time(), "shim_version": rebind.SHIM_VERSION}
        try:
            # The supervisor made it only for a child with private files (its task file or
            # stdin); otherwise it is made here, in the shim, off the supervisor's loop. One
            # mkdir: the run's directory is there already (makedirs would stat both first).
            try:
                os.mkdir(self.record_dir, 0o700)
            except FileExistsError:
                pass
            except FileNotFoundError:
                os.makedirs(self.record_dir, mode=0o700, exist_ok=True)
            # No fsync: the claim fences a recovering node against a late shim, and a power
            # cut ends both; the exit record, which must survive the node, is synced.
            if not write_atomically(self._path(SHIM_RECORD), claim, exclusive=True, sync=False):
                return 0  # a recovering node gave this child up as never started: keep it so
        except OSError as err:  # a full or read-only disk: no claim, so no child; say why
            self._not_started(f"cannot write the child's records: {err}", record=False)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for signum in (signal.SIGCHLD, signal.SIGTERM, rebind.REBIND_SIGNAL):
            signal.signal(signum, lambda *_: None)  # the byte in the wake-up pipe is the event
        # Before the start: a node gone meanwhile is not missed. A rebind written before the
        # handler was set (its signal then ignored) is read here.
        node_fd = self._watch_node(
            rebind.read_binding(self.record_dir) or self.order.get("ends_with")
        )
        if not self.tree_ended:
            base = self.order.get("cgroup_base")
            if base:
                self.cgroup = ChildCgroup.create(str(base), str(self.order["child_id"]))
            self._start()
        link = ReportLink(str(self.order["node_address"]))
        try:
            self._loop(link, wake_r, node_fd)
        finally:
            link.close()
        return 0

    def _start(self) -> None:
        try:
            pid = self._spawn()
        except OSError as err:
            self._drop_cgroup()
            self._not_started(spawn_error(self.order, err))
            return
        except (ValueError, TypeError) as exc:  # an argv or env the OS cannot take
            self._drop_cgroup()
            self._not_started(f"cannot start {self.order['argv'][0]}: {exc}")
            return
        self.leader = pid
        if self.cgroup is not None:
            self.facts["cgroup"] = self.cgroup.path
        start = procfs.start_time_of(pid, zombies=True) or 0.0
        self.facts.update(pid=pid, identity_start=start, start_time=procfs.wall_clock(start))
        self._report("started")

    def _not_started(self, error: str, record: bool = True) -> None:
        """No child, and why: its "tree" ended before it began. The moment is its end's, so a
        shim no node acknowledges gives up as one whose tree ended does (GIVE_UP_AFTER_TREE_
        END_S; a node that comes back finds the child unstarted); without it, it retried for
        good, an idle process per failed spawn once its node was gone."""
        self.facts["error"] = error[:4000]
        self.facts["tree_ended_at"] = time.time()
        self.leader_gone = self.tree_ended = True
        if record:
            self._record_exit()
        self._report("not_started")

    def _spawn(self) -> int:
        """The agent, born in the child's cgroup when there is one (the shim enters it for
        the spawn and leaves it again); in the shim's own otherwise."""
        group = self.cgroup
        if group is None:
            return spawn_agent(self.order)
        try:
            group.enter()
        except OSError:
            self.cgroup = None
            group.remove()
            return spawn_agent(self.order)
        try:
            return spawn_agent(self.order)
        finally:
            try:
                group.leave()
            except OSError:  # the shim shares the cgroup with its child: neither its end
                self.cgroup = None  # nor a kill of it would be the tree's alone

    def _drop_cgroup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None

    def _watch_node(self, ends_with: list[float] | None) -> int:
        """A pidfd of the process this child ends with (`ends_with`: pid, start time; None: it
        outlives its node), or -1; that process gone already sets `node_gone` (the tree is
        ended as soon as it starts)."""
        self.bound_to = ends_with
        fd, gone = rebind.watch(ends_with)
        self.node_gone = self.node_gone or gone
        return fd

    def _loop(self, link: ReportLink, wake_r: int, node_fd: int = -1) -> None:
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        if node_fd >= 0:  # the embedded node's end is an event (pidfd), not a poll of its pid
            poller.register(node_fd, select.POLLIN)
        if self.node_gone and not self.tree_ended:
            self._end_tree("node_gone")
        events_fd = -1 if self.cgroup is None else self.cgroup.events_fd
        if events_fd >= 0:  # each change of cgroup.events (the tree's end) is an event
            poller.register(events_fd, select.POLLPRI)
        sock_fd = -1
        while not (self.tree_ended and not self.reports.unacked) and not self._given_up():
            if self.record_owed:  # a resend is due: space may have come back since
                self._record_exit()
            self.reports.send_due(link)
            if link.fileno() != sock_fd:  # (re)connected, or the connection dropped
                if sock_fd >= 0:
                    with contextlib.suppress(KeyError):
                        poller.unregister(sock_fd)
                sock_fd = link.fileno()
                if sock_fd >= 0:
                    poller.register(sock_fd, select.POLLIN)
            timeout = self._next_timer()
            wait_ms = None if timeout is None else math.ceil(max(0.0, timeout) * 1000)
            events = dict(poller.poll(wait_ms))
            if wake_r in events:
                signals = os.read(wake_r, 4096)
                if signal.SIGTERM in signals and not self.tree_ended:
                    self._end_tree("stop")
                if rebind.REBIND_SIGNAL in signals and self.term_at is None:
                    node_fd = self._rebind(poller, node_fd)
                self._reap()
            elif events_fd >= 0 and events_fd in events:
                self._reap()
            if events_fd >= 0 and self.tree_ended:
                poller.unregister(events_fd)
                events_fd = -1
            if node_fd >= 0 and node_fd in events:
                poller.unregister(node_fd)
                os.close(node_fd)
                node_fd = -1
                self.node_gone = True
                if not self.tree_ended:  # as its command's stop would have (Ctrl-C)
                    self._end_tree("node_gone")
            if sock_fd >= 0 and sock_fd in events:
                self.reports.receive(link)
            self._on_timers()

    def _rebind(self, poller: select.poll, node_fd: int) -> int:
        """A node that adopted this shim bound its tree to another process (`bind.json`): watch
        that one instead; gone already, the tree ends now. The new pidfd, or -1."""
        target = rebind.read_binding(self.record_dir)
        if target is None or target == self.bound_to or self.tree_ended:
            return node_fd
        if node_fd >= 0:
            poller.unregister(node_fd)
            os.close(node_fd)
        node_fd = self._watch_node(target)
        if node_fd >= 0:
            poller.register(node_fd, select.POLLIN)
        if self.node_gone:
            self._end_tree("node_gone")
        return node_fd

    def _given_up(self) -> bool:
        if self.record_owed:  # nothing on disk says how the tree ended: only a report can
            return False
        ended = self.facts.get("tree_ended_at")
        if ended is not None and self.node_gone:  # no node to report to: the record says it
            return True
        limit = float(self.order.get("give_up_s", GIVE_UP_AFTER_TREE_END_S))
        return ended is not None and time.time() - ended > limit

    # -- the tree -------------------------------------------------------------------------------

    def _reap(self) -> None:
        leader_code: int | None = None
        tree_left = True
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                tree_left = False  # no child left: with a subreaper, no descendant either
                break
            if pid == 0:
                break
            if pid == self.leader and not self.leader_gone:
                leader_code = os.waitstatus_to_exitcode(status)
        # With a cgroup, the tree has ended when the subreaper has nobody left to reap and
        # the cgroup holds no process (`populated 0`; each is an event, in either order).
        if self.cgroup is not None and self.cgroup.populated():
            tree_left = True
        if leader_code is not None:
            self._leader_exited(leader_code, tree_left)
        if self.leader_gone and not tree_left and not self.tree_ended:
            self.tree_ended = True
            self.facts["tree_ended_at"] = time.time()
            if self.cgroup is not None:
                self.cgroup.remove()
            self._record_exit()
            self._report("tree_ended")

    def _leader_exited(self, code: int, tree_left: bool) -> None:
        """The leader's exit status. When its tree ended with it (the common case) the one
        `tree_ended` record and report carry it; otherwise it is recorded and reported now."""
        self.leader_gone = True
        self.facts.update(
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            ended_at=time.time(),
            ended_by=self.ended_by,
        )
        if not tree_left:
            return
        # Who is left is recorded and reported: should the shim die, these identities are
        # what proves the tree's end (every one gone), and what a stop ends.
        found = procfs.descendants(os.getpid())
        self.facts["descendants"] = [
            {"pid": pid, "start": st.start_time} for pid, st in found[:MAX_REPORTED_PROCESSES]
        ]
        self._record_exit()
        self._report("exited")
        # The members of the leader's own group are the child's: they end with it (TERM,
        # grace, KILL). Escaped sessions are waited for: they keep the tree (and slot) alive.
        if self._signal_tree(signal.SIGTERM, only_group=self.leader, found=found):
            self.group_kill_at = time.monotonic() + self.grace_s

    def _end_tree(self, why: str) -> None:
        """Stop or deadline: the first reason wins; TERM now, KILL after the grace."""
        if self.term_at is not None:
            return
        self.ended_by = why
        self.facts["ended_by"] = why
        self.term_at = time.monotonic()
        self.kill_at = self.term_at + self.grace_s
        self._signal_tree(signal.SIGTERM)

    def _signal_tree(
        self,
        signum: int,
        only_group: int | None = None,
        found: list[tuple[int, procfs.ProcStat]] | None = None,
    ) -> bool:
        """Signal every descendant (`found`: a scan just made) and every group one of them is
        in (a group id cannot be reused while the member we just saw lives); False when there
        was nobody to signal."""
        if found is None:
            found = procfs.descendants(os.getpid())
        if only_group is None and self.cgroup is not None:
            # The cgroup holds the whole tree, wherever its processes now hang (or hid).
            known = {pid for pid, _ in found}
            for pid in self.cgroup.pids():
                if pid not in known and (stat := procfs.stat_of(pid)) is not None:
                    found.append((pid, stat))
        if only_group is not None:
            found = [(pid, st) for pid, st in found if st.pgid == only_group]
        # Each process gets the signal once (a second SIGTERM could cut short the clean-up
        # the first one started): through its group, or alone if it is in the shim's group.
        groups = {st.pgid for _, st in found if st.pgid != self.facts["shim_pid"]}
        for pgid in groups:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signum)
        for pid, st in found:
            if st.pgid not in groups:
                with contextlib.suppress(OSError):
                    os.kill(pid, signum)
        return bool(found)

    # -- timers ---------------------------------------------------------------------------------

    def _next_timer(self) -> float | None:
        now = time.monotonic()
        due = [t for t in (self.kill_at, self.group_kill_at) if t is not None]
        if self.deadline is not None and self.term_at is None and not self.tree_ended:
            due.append(self.deadline)
        if (send_at := self.reports.next_send_at()) is not None:
            due.append(send_at)
        return None if not due else min(due) - now

    def _on_timers(self) -> None:
        now = time.monotonic()
        if (
            self.deadline is not None
            and now >= self.deadline
            and self.term_at is None
            and not self.tree_ended
        ):
            self._end_tree("deadline")
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            if self.cgroup is not None:
                self.cgroup.kill()  # every process of the tree, however it left the shim's
            self._signal_tree(signal.SIGKILL)
        if self.group_kill_at is not None and now >= self.group_kill_at:
            self.group_kill_at = None
            self._signal_tree(signal.SIGKILL, only_group=self.leader)

    # -- records and reports --------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.record_dir, name)

    def _record_exit(self) -> None:
        """Before the report that tells of it: a new node reads it even if the report is lost.
        One that cannot be written (ENOSPC, EROFS) never stops the report, which alone, once
        acknowledged, makes the end durable in the node's store. Owed (written again at each
        resend, and the shim does not give up) only while space may come back; a record
        directory that is gone (the state dir removed) is owed to nobody, and a shim that kept
        trying would live on for good, an idle process per child, once no node came back."""
        try:
            write_atomically(
                self._path(EXIT_RECORD),
                {**self.facts, "tree_ended": self.tree_ended, "version": 1},
                sync=self.sync,
            )
            self.record_owed = False
        except OSError as err:
            self.record_owed = err.errno in _SPACE_MAY_COME_BACK

    def _report(self, kind: str) -> None:
        self.reports.post(kind, self.facts, tree_ended=self.tree_ended, ended_by=self.ended_by)


def announce(child_id: str, pid: int, start: float) -> None:
    """Tell the supervisor a shim's identity (or pid 0: no shim) on the template's stdout, its
    announce pipe (actors/child/shims.py); the template writes it right after each fork, so
    before the child is started: a child that killed its shim (its parent: `kill -9 $PPID`)
    before the shim's first report used to leave a run nobody watched, its launch unanswered
    and its stop without effect. One write of a line under PIPE_BUF is atomic; a full pipe
    (O_NONBLOCK) or none costs the line, never the template."""
    line = json.dumps([child_id, pid, start]) + "\n"
    with contextlib.suppress(OSError):
        os.write(1, line.encode())


@functools.cache  # looked up once, in the template: a shim calls it, it does not make it
def _prctl() -> Any:
    return ctypes.CDLL(None, use_errno=True).prctl
