"""OrphanTrees: the trees of children whose shim died before they ended (ChildKeeper's part).

Owns, for each such child, the processes of its tree still alive (its leader, when the shim
died first; those the shim reported, a `setsid()` daemon say; what the child's cgroup holds, or
without cgroups what is left in the dead shim's session), and that cgroup while it holds any:
it watches the first of them (its exit brings the child back to the keeper), asks for the
child's deadline to be kept (the shim kept it; now nobody does), and signals them all on a stop.

It never writes a row and never decides an outcome: the keeper settles the child once this says
nothing of its tree lives on. It never signals a process it has not verified by pid and start
time (`signal_shim`), and keeps nothing for a child it was told to forget.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

from subagents_node.actors.child import cgroup as cg
from subagents_node.actors.child import procfs, rows
from subagents_node.actors.child.procfs import ProcessIdentity, identity_of, is_alive
from subagents_node.actors.child.shims import ShimWatch, signal_shim
from subagents_node.messages.runs import ChildReport

log = logging.getLogger(__name__)


class OrphanTrees:
    def __init__(
        self,
        cgroup_base: str,
        watch: ShimWatch,
        on_due: Callable[[str, float, str], object] | None,
    ) -> None:
        """`cgroup_base`: where shims make each child's cgroup ('' for none); `watch`: the
        keeper's shim watch, which watches a live process of each tree too; `on_due`: the
        keeper's (`deadline` calls for a child whose shim kept its deadline)."""
        self._cgroup_base = cgroup_base
        self._watch = watch
        self._on_due = on_due
        #: Children whose shim died before their tree ended, by the processes left alive.
        self._alive: dict[str, list[ProcessIdentity]] = {}
        #: Their cgroups, when they had one (cgroup v2 containment): what a stop kills.
        self._cgroups: dict[str, str] = {}

    def bookkeeping(self) -> dict[str, int]:
        return {"escaped": len(self._alive), "escaped_cgroups": len(self._cgroups)}

    def holds(self, child_id: str) -> bool:
        """Whether `child_id`'s tree outlived its shim (and is watched here)."""
        return child_id in self._alive

    def cgroup_of(self, child_id: str) -> str | None:
        """The cgroup this node made for `child_id`, if it still exists."""
        if not self._cgroup_base:
            return None
        path = cg.child_path(self._cgroup_base, child_id)
        return path if cg.populated(path) is not None else None

    def leader_left(self, child_id: str, shim_pid: int) -> ProcessIdentity | None:
        """The child a shim that died before its first report left: the oldest live process
        in the child's cgroup, or without one in the shim's session; None when none lives."""
        group = self.cgroup_of(child_id)
        found = [] if group is None else [identity_of(pid) for pid in cg.pids_in(group)]
        if group is None:
            found = list(procfs.in_session(shim_pid))
        alive = [identity for identity in found if identity is not None]
        return min(alive, key=lambda identity: identity.start_time) if alive else None

    def wait(
        self,
        row: Any,
        report: ChildReport,
        group: str | None,
        leader: ProcessIdentity | None = None,
    ) -> bool:
        """The shim died: its live `leader` (the child itself, when the shim died first) and
        the processes it reported left (a `setsid()` daemon) are the tree now. While one of
        them lives, watch it (its exit brings the child back to the keeper); True while there
        is one. A stop already asked for ends them at once."""
        child_id = str(row["child_id"])
        recorded = [ProcessIdentity(p.pid, p.start) for p in report.descendants]
        recorded = recorded or [ProcessIdentity(p, t) for p, t in rows.descendants_of(row)]
        alive = [leader] if leader is not None else []
        alive += [i for i in recorded if i not in alive and is_alive(i)]
        if group is not None and cg.populated(group):
            # The child's cgroup holds the whole tree: whatever it started after the report.
            known = {identity.pid for identity in alive}
            found = (identity_of(pid) for pid in cg.pids_in(group) if pid not in known)
            alive += [identity for identity in found if identity is not None]
            self._cgroups[child_id] = group
        elif group is None and row["shim_pid"] is not None:
            # No cgroup: what is left in the dead shim's session is the tree (all but what
            # left it by setsid(), which only a report can have named).
            known = {identity.pid for identity in alive}
            alive += [i for i in procfs.in_session(int(row["shim_pid"])) if i.pid not in known]
        if not alive:
            return False
        deadline_at = row["deadline_at"]
        # Its shim kept its deadline; now nobody does: the keeper's caller is told when it is.
        first = child_id not in self._alive and row["end_reason"] is None
        if first and deadline_at is not None and self._on_due is not None:
            self._on_due(child_id, float(deadline_at), "deadline")
        if self._alive.get(child_id) != alive:  # each new set once (not each re-check)
            log.warning(
                "the shim of child %s died; %d process(es) of its tree live on (pid %s): "
                "waiting for them",
                child_id,
                len(alive),
                ", ".join(str(identity.pid) for identity in alive[:8]),
            )
        self._alive[child_id] = alive
        if row["end_reason"] is not None:
            self.kill(child_id)  # the stop came first: its grace is over
        self._watch.watch(child_id, alive[0])
        return True

    def forget(self, child_id: str, group: str | None) -> None:
        """Nothing of `child_id`'s tree lives on: drop it, and its cgroup once empty."""
        self._alive.pop(child_id, None)
        if (path := self._cgroups.pop(child_id, None) or group) is not None:
            cg.remove_when_empty(path)

    def kill(self, child_id: str, signum: int = signal.SIGKILL) -> bool:
        """Signal the live processes a dead shim left (verified by pid and start time); False
        when there are none."""
        sent = False
        path = self._cgroups.get(child_id)
        if path is not None and signum == signal.SIGKILL and cg.populated(path):
            cg.kill_all(path)
            sent = True
        for identity in self._alive.get(child_id, []):
            sent = signal_shim(identity, signum) or sent
        return sent
