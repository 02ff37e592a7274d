"""StrayShims: the live shims no template is the parent of (ChildKeeper's part).

A shim a child stops (SIGSTOP to its parent) does nothing: it reaps nobody, writes no exit
record and sends no report. Its template, its parent, is told of the stop and continues it
(shimstops.py). A shim whose template is gone (the node restarted and adopted it; a child
killed the template) has no parent we control, so a stop is told to nobody: a pidfd is not
readable for a stop. Its child then exited a zombie under it, and its run stayed `running`,
its slot held, until a stop, a deadline or the next restart.

Owns, for each such shim's child, the shim's identity. What wakes it is the end of a process
of its tree, which a pidfd does tell: it watches the first live process of the tree (the
leader; then those the shim reported left, what the child's cgroup holds, or without one what
lives in the shim's session) through the keeper's shim watch, whose exit brings the child back
here. Once nothing of the tree is known to live and the shim has not reported its end, a
stopped shim is continued at once, and looked at once more CONTINUE_GRACE_S later (a SIGSTOP
sent just before the child exited is taken when the shim is next scheduled): it then reaps
the tree and reports its real end (the proof stays the parent's, SPEC §0.4), and what it
reports it left is watched in turn. No polling: one look per exit of a watched process or
report of the leader's exit, and one more after the tree's end.

It never writes a row, never decides an outcome, never kills, and never signals a process it
has not verified by pid and start time (`signal_shim`).
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

log = logging.getLogger(__name__)

Connection = Any  # sqlite3.Connection (kept loose: rows.py owns the SQL)

#: How long after its tree's end a stray shim that has not reported is looked at again (a
#: healthy shim reports within milliseconds; a SIGSTOP is taken when the shim next runs).
CONTINUE_GRACE_S = 1.0
#: The `on_due` reason of that second look (the keeper's `continue_stopped`).
DUE_STOPPED = "stopped"
#: The process states of a stopped process (/proc/PID/stat): by a signal, or while traced.
STOPPED_STATES = ("T", "t")


class StrayShims:
    def __init__(
        self,
        cgroup_base: str,
        watch: ShimWatch,
        on_due: Callable[[str, float, str], object] | None,
    ) -> None:
        """`cgroup_base`: where shims make each child's cgroup ('' for none); `watch`: the
        keeper's shim watch (a process of each stray's tree is watched there too); `on_due`:
        the keeper's (DUE_STOPPED: call `look_again` then)."""
        self._cgroup_base = cgroup_base
        self._watch = watch
        self._on_due = on_due
        #: Children whose live shim has no template parent, by that shim.
        self._shims: dict[str, ProcessIdentity] = {}
        #: Children running unreported when a template ended, with its pid: strays, if that
        #: was theirs (or no template serving now is their shim's parent).
        self._unreported: dict[str, int] = {}

    def bookkeeping(self) -> dict[str, int]:
        return {"stray_shims": len(self._shims), "unreported_strays": len(self._unreported)}

    def holds(self, child_id: str) -> bool:
        return child_id in self._shims

    def adopt(self, row: Any, now: float) -> None:
        """`row`'s live shim (it reported) has no template parent: watch its tree from now."""
        if row["shim_pid"] is None:
            return
        child_id = str(row["child_id"])
        self._shims[child_id] = ProcessIdentity(int(row["shim_pid"]), float(row["shim_start"]))
        self.look(row, now)

    def template_gone(
        self,
        db: Connection,
        ended: int,
        serving: int | None,
        now: float,
        skip: Callable[[str], bool],
    ) -> None:
        """Shim template `ended` (its pid; 0: unknown) ended, a child killed or stopped it
        (`serving`: the pid of the template serving orders now, if any): the live shims that
        are its children (it may still be exiting: its pipe ends before its children are
        reparented) or no child of the one serving are strays from now. One stat read per
        running child, once per template's end; `skip(child_id)`: its shim died."""
        for child_id in rows.running_child_ids(db):
            row = rows.read_row(db, child_id)
            if row is None or child_id in self._shims or skip(child_id):
                continue
            if row["shim_pid"] is None:  # not reported yet: looked at with its first report
                self._unreported[child_id] = ended
            else:
                self._adopt_if_stray(row, ended, serving, now)

    def reported(self, db: Connection, child_id: str, serving: int | None, now: float) -> None:
        """`child_id`'s shim reported its start (its row holds it now)."""
        if self._unreported and child_id in self._unreported:
            ended = self._unreported.pop(child_id)  # running when a template ended
            self._adopt_if_stray(rows.read_row(db, child_id), ended, serving, now)

    def _adopt_if_stray(self, row: Any, ended: int, serving: int | None, now: float) -> None:
        shim = ProcessIdentity(int(row["shim_pid"]), float(row["shim_start"]))
        found = procfs.stat_of(shim.pid)
        if found is None or not is_alive(shim):
            return  # gone: the watch tells its death
        if found.ppid == ended or found.ppid != serving:
            self.adopt(row, now)

    def forget(self, child_id: str) -> None:
        """The child settled, or its shim died (orphans.py has its tree then)."""
        self._shims.pop(child_id, None)
        self._unreported.pop(child_id, None)

    def left(self, db: Connection, child_id: str, now: float) -> None:
        """A stray shim reported its leader's exit and what it left (its tree now)."""
        if child_id in self._shims:
            self.look(rows.read_row(db, child_id), now)

    def look(self, row: Any, now: float) -> None:
        """A process of the tree of `row`'s stray shim exited (or it was just adopted): watch
        the next one alive; with none left, continue the shim if it is stopped, and look again
        after CONTINUE_GRACE_S (a stop sent just before is taken when the shim next runs). A
        shim stopped while its tree lives is left to the backstops (a stop, its deadline)."""
        child_id = str(row["child_id"])
        shim = self._shims.get(child_id)
        if shim is None:
            return
        if (live := self._first_alive(row, shim)) is not None:
            self._watch.watch(child_id, live)
            return
        self._continue(child_id, shim)
        if self._on_due is not None:
            self._on_due(child_id, now + CONTINUE_GRACE_S, DUE_STOPPED)

    def look_again(self, db: Connection, child_id: str) -> None:
        """CONTINUE_GRACE_S after the tree of `child_id`'s stray shim ended (DUE_STOPPED):
        still running, its end unreported, the shim is continued if it is stopped."""
        if (shim := self._shims.get(child_id)) is None:
            return
        row = rows.read_row(db, child_id)
        if row is not None and row["state"] == "running":
            self._continue(child_id, shim)

    def _continue(self, child_id: str, shim: ProcessIdentity) -> None:
        found = procfs.stat_of(shim.pid)
        if found is None or found.state not in STOPPED_STATES:
            return
        if signal_shim(shim, signal.SIGCONT):  # pid and start time checked on a pidfd
            log.warning(
                "the shim (pid %d) of child %s was stopped with no template to continue it; "
                "continued it",
                shim.pid,
                child_id,
            )

    def _first_alive(self, row: Any, shim: ProcessIdentity) -> ProcessIdentity | None:
        """The first live process of the tree: its leader, a process the shim reported left,
        one in the child's cgroup, or (without one, once the shim reported its leader's exit:
        before, its report names what it left, and one scan of /proc per child's end would
        cost the supervisor more) in the shim's session (the shim aside)."""
        if row["pid"] is not None and row["identity_start"] is not None:
            leader = ProcessIdentity(int(row["pid"]), float(row["identity_start"]))
            if is_alive(leader):
                return leader
        for pid, start in rows.descendants_of(row):
            if is_alive(left := ProcessIdentity(pid, start)):
                return left
        group = cg.child_path(self._cgroup_base, str(row["child_id"])) if self._cgroup_base else ""
        if group and cg.populated(group) is not None:
            for pid in cg.pids_in(group):
                if pid != shim.pid and (found := identity_of(pid)) is not None:
                    return found
            return None
        if row["exit_code"] is None and row["signal"] is None:
            return None  # the leader's exit is not reported yet: that report brings it back
        for found in procfs.in_session(shim.pid):
            if found.pid != shim.pid:
                return found
        return None
