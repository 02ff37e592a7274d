"""ChildKeeper: the run supervisor's bookkeeping of every child (the shim is the ChildActor).

Owns the `children` rows (through rows.py, in the supervisor's own transaction: one writer, one
connection, group commit), the shim template and the one thread that watches every shim. It
turns what shims report (`ChildReport`), what a shim's death leaves (its exit record) and what a
restart finds into the supervisor's two child events, `ChildStarted` and `ChildExited`; the
supervisor settles runs from those. Nothing here scales threads or connections with children.

Proof of the end of a child's tree comes only from `tree_ended` (reported, or read from the
exit record a shim writes before it reports); for a shim that died, from the identities of the
processes it reported (its leader alive: `unknown`, the slot stays retained; its leader gone
but a process it reported left, a `setsid()` daemon, alive: the child stays running, that
process is watched and a stop ends it; all gone: `observed`). The trees dead shims leave are
orphans.py's to watch and kill; what ends a tree a frozen shim did not end, backstop.py's.

It never blocks on a shim, never signals a process it has not verified by pid and start time,
and never stores argv, env or stdin (R-MISC-1).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from subagents_node.actors.child import process as cp
from subagents_node.actors.child import procfs, rows
from subagents_node.actors.child.backstop import SHIM_OVERDUE_MARGIN_S, DeadlineBackstop
from subagents_node.actors.child.claims import claimed_shim
from subagents_node.actors.child.orphans import OrphanTrees
from subagents_node.actors.child.procfs import (
    ProcessIdentity,
    boot_id,
    is_alive,
    wall_clock,
)
from subagents_node.actors.child.readback import read_record, report_from_record
from subagents_node.actors.child.records import EXIT_RECORD
from subagents_node.actors.child.shims import ShimWatch, signal_shim, wait_exits
from subagents_node.actors.child.shimtemplate import ShimTemplate
from subagents_node.actors.child.strays import StrayShims
from subagents_node.messages.runs import (
    REASON_EXITED,
    ChildEvent,
    ChildExited,
    ChildReport,
    ChildSpec,
    ChildStarted,
    timeout_error,
)

log = logging.getLogger(__name__)

#: The key `on_shim_gone` is called with, followed by its pid, when a shim template ended (no
#: child id has a colon: `{run id}-{index}`).
TEMPLATE_GONE = "template-gone:"
#: How long a stopping node waits for the shims of finished children to exit.
FINISHING_WAIT_S = 2.0

Connection = Any  # sqlite3.Connection (kept loose: rows.py owns the SQL)

LogCap = Callable[[str], Callable[[], None]]


class ChildKeeper:
    def __init__(
        self,
        node_address: str,
        on_shim_gone: Callable[[str], None],
        cap_log: LogCap | None = None,
        cap_flush: Callable[[], None] | None = None,
        cgroup_base: str = "",
        open_files: int | None = None,
        on_due: Callable[[str, float, str], object] | None = None,
    ) -> None:
        """`cap_log(path)` keeps a log file under the node's cap (actors/child/logcap.py) and
        returns the call that stops watching it: a running child's two logs are watched;
        `cap_flush()` hands the cap's thread what changed (called by `flush`).
        `cgroup_base`: where shims make each child's cgroup ('' for none); `open_files`: the
        soft limit on open files children start with (None: this process's).
        `on_due(child_id, at, why)` asks for a call at `at` (the caller's clock): "deadline",
        a child with a deadline lives on after its shim (which kept it) died: `timed_out`
        then; "overdue", a stop signalled a live shim: `kill_overdue_shim` then; "late" (no
        child id), the earliest deadline of a running child is over with its grace and a
        margin: `late` then (a shim a child froze never ends its tree at its deadline)."""
        self._on_due = on_due
        #: What ends a tree its shim did not end in time (backstop.py): `late`, `overdue_in`,
        #: `kill_overdue_shim`, called by the run supervisor when `on_due` says so.
        self.backstop = DeadlineBackstop(on_due)
        self._address = node_address
        self._cgroup_base = cgroup_base
        self._watch = ShimWatch(
            on_shim_gone, on_template_gone=lambda pid: on_shim_gone(f"{TEMPLATE_GONE}{pid}")
        )
        # Each shim is watched from its announcement, before its child starts, not from its
        # first report: a child can kill its shim (its parent) before that report is sent.
        self._template = ShimTemplate(open_files, on_start=self._watch.listen)
        self._cap_log = cap_log
        self._cap_flush = cap_flush
        self._capped: dict[str, list[Callable[[], None]]] = {}
        #: Shims whose tree ended (acknowledged or about to be) that were not yet seen gone.
        self._finishing: dict[str, ProcessIdentity] = {}
        #: Whether shims fsync their exit records: as durable as the store's own commits
        #: (the supervisor sets it from its connection's `synchronous`; FULL syncs both).
        self.sync_records = True
        #: The trees of children whose shim died before they ended (orphans.py).
        self._orphans = OrphanTrees(cgroup_base, self._watch, on_due)
        #: Live shims no template is the parent of (adopted, or their template died): a stop
        #: is told to nobody, so their trees are watched and a stopped one continued (strays.py).
        self.strays = StrayShims(cgroup_base, self._watch, on_due)
        self._closing = False

    def close(self) -> None:
        """With the node: the template exits, the shims (and their children) keep running;
        shims whose tree ended are given a moment to exit, so a program that embedded the
        node leaves no process of a finished child behind."""
        self._closing = True  # its template's end is no template gone
        self._template.close()
        self._watch.close()
        for child_id in list(self._capped):
            self._uncap(child_id)
        wait_exits(list(self._finishing.values()), FINISHING_WAIT_S)

    # -- log caps (issue 12): the logs of a running child stay under the node's cap -----------

    def _cap(self, record: rows.ChildRecord) -> None:
        if self._cap_log is None or record.child_id in self._capped:
            return
        paths = dict.fromkeys((record.stdout_path, record.stderr_path))
        self._capped[record.child_id] = [self._cap_log(path) for path in paths]

    def _uncap(self, child_id: str) -> None:
        """The child settled: its logs get one last check and are no longer watched."""
        for unwatch in self._capped.pop(child_id, []):
            unwatch()

    def _ended(self, events: list[ChildEvent]) -> list[ChildEvent]:
        for event in events:
            if isinstance(event, ChildExited):
                self._uncap(event.child_id)
                self.strays.forget(event.child_id)
        return events

    def flush(self) -> None:
        """Once per commit group: the shims to watch go to the watch thread together, and so
        do the log watches (a child that ended in the group that started it costs none)."""
        self._watch.flush()
        if self._cap_flush is not None:
            self._cap_flush()

    @property
    def template_pid(self) -> int | None:
        return self._template.pid

    def bookkeeping(self) -> dict[str, int]:
        """How many children each per-child table holds: all 0 once every child settled and
        its shim exited (a test checks it; anything kept per finished child would grow the
        node with every child it ever ran)."""
        return {
            "capped": len(self._capped),
            "finishing": len(self._finishing),
            "watched_shims": self._watch.watched,
            **self._orphans.bookkeeping(),
            **self.strays.bookkeeping(),
        }

    # -- start ----------------------------------------------------------------------------------

    def order(self, db: Connection, spec: ChildSpec, now: float) -> None:
        """Record the child as ordered (in the caller's transaction); `launch` it after the
        commit, so a shim never reports a child the store does not know."""
        record = rows.ChildRecord.from_spec(spec)
        record.started_at = now
        if spec.deadline_s is not None:
            record.deadline_at = now + spec.deadline_s
            self.backstop.arm(record.deadline_at + spec.grace_s + SHIM_OVERDUE_MARGIN_S)
        rows.insert_ordered(db, record)

    def launch(self, spec: ChildSpec, ends_with: ProcessIdentity | None = None) -> str | None:
        """Fork its shim (bound to `ends_with`, an embedded node, when the child must end with
        it); the error (one line) when there is no template to fork from."""
        try:
            order = (spec, self._address, self.sync_records, self._cgroup_base, ends_with)
            self._template.order(*order)
        except OSError as exc:
            return f"cannot start the child's shim: {exc}"
        self._watch.expect(spec.child_id)  # no shim announced before its template ended: gone
        return None

    def not_launched(
        self, db: Connection, child_id: str, error: str, now: float
    ) -> list[ChildEvent]:
        """No shim was forked: the child never started (R-RUN-5 not-started)."""
        row = rows.read_row(db, child_id)
        if row is None or row["state"] != "running" or row["shim_pid"] is not None:
            return []
        record = rows.ChildRecord.from_row(row)
        event = cp.not_started(record, error, now)
        rows.write_settlement(db, record, event)
        return [event]

    # -- reports --------------------------------------------------------------------------------

    def apply(
        self,
        db: Connection,
        report: ChildReport,
        now: float,
        from_shim: bool = True,
        row: Any = None,
    ) -> list[ChildEvent]:
        """Apply a report (idempotent: any report may come again, or alone after a restart).
        `from_shim` is False for one read back from an exit record: its shim is gone already,
        so there is nothing to wait for. `row` is the child's row when the caller has just
        read it (in this transaction), else it is read here."""
        if row is None:
            row = rows.read_row(db, report.child_id)
        if row is None or row["state"] != "running" or row["run_id"] != report.run_id:
            return []  # settled already (a resend), or not ours
        record = rows.ChildRecord.from_row(row)
        events: list[ChildEvent] = []
        if record.shim_pid is None:
            record.shim_pid, record.shim_start = report.shim_pid, report.shim_start
            record.boot_id = report.boot_id
            if report.pid is not None and report.identity_start is not None:
                record.pid, record.identity_start = report.pid, report.identity_start
                record.start_time = report.start_time
                events.append(cp.started_event(record))
                # Debug, not info: one line per child in a fleet of thousands; the run's
                # events (events.jsonl, `show`) carry every child's pid.
                log.debug(
                    "child %s of run %s started (pid %d, shim pid %d)",
                    record.child_id,
                    record.run_id,
                    report.pid,
                    report.shim_pid,
                )
            rows.record_started(db, record)
            shim = ProcessIdentity(report.shim_pid, report.shim_start)
            self._watch.watch(record.child_id, shim)
            self.strays.reported(db, record.child_id, self._template.pid, now)
            self._cap(record)
            if row["end_reason"] is not None:
                signal_shim(shim)  # stopped before its start was known
        if report.kind == "not_started":
            event = cp.not_started(record, report.error or "the child did not start", now)
            rows.write_settlement(db, record, event)
            events.append(event)
        elif report.tree_ended:
            events.append(self._settle(db, record, row, report, now))
            if from_shim:  # it exits once acknowledged; `shim_gone` forgets it then
                shim = ProcessIdentity(report.shim_pid, report.shim_start)
                self._finishing[record.child_id] = shim
        elif report.exit_code is not None or report.signal is not None:
            left = [(p.pid, p.start) for p in report.descendants]
            rows.record_exit(db, record.child_id, report.exit_code, report.signal, left)
            self.strays.left(db, record.child_id, now)  # what it left is its tree now
        return self._ended(events)

    def _settle(
        self,
        db: Connection,
        record: rows.ChildRecord,
        row: Any,
        report: ChildReport,
        now: float,
        unverified: bool = False,
        reason: str = REASON_EXITED,
    ) -> ChildExited:
        # Its logs' last check first: the output and error below are their tails, and a cut
        # of the child's last burst (the log cap's thread, on its own inotify event) running
        # while they were read left the read past the shrunk file's end: the output was empty.
        # Once it is done, nothing cuts them again (the tree ended: nobody writes).
        self._uncap(record.child_id)
        end_reason, end_message = row["end_reason"], row["end_message"]
        if end_reason is None:  # its shim ended it by itself (deadline, SIGTERM, node's death)
            end_reason, end_message = cp.shim_end(report.ended_by, record.timeout_s)
        facts = cp.ExitFacts(
            reason=reason,
            exit_code=report.exit_code,
            signal=report.signal,
            at=report.ended_at or report.tree_ended_at,
        )
        event = cp.outcome(record, facts, end_reason, end_message, unverified, now)
        rows.write_settlement(db, record, event)
        return event

    # -- stop, a shim's death, a restart --------------------------------------------------------

    def stop(
        self, db: Connection, child_id: str, reason: str, message: str
    ) -> Callable[[], float | None] | None:
        """Record why (the first reason wins); the call returned (None: the child is not
        running) SIGTERMs its shim, which ends the tree. The caller makes it only once that
        record has committed: a stop a full disk undoes must have signalled nobody. With its
        shim dead, the processes it left get the TERM: the call returns the grace (seconds),
        after which the caller calls `kill_escaped`."""
        row = rows.read_row(db, child_id)
        if row is None or row["state"] != "running":
            return None
        if row["end_reason"] is None:
            rows.record_end(db, child_id, reason, message)
        shim = (
            None if row["shim_pid"] is None else ProcessIdentity(row["shim_pid"], row["shim_start"])
        )
        grace = float(row["grace_s"])

        def send() -> float | None:
            if shim is not None:
                signal_shim(shim)
            return grace if self.kill_escaped(child_id, signal.SIGTERM) else None

        return send

    def timed_out(self, db: Connection, child_id: str) -> Callable[[], float | None] | None:
        """The deadline of a child whose shim died came: `stop` it as timed out (the shim's
        own deadline would have: TERM, then KILL after the grace)."""
        row = rows.read_row(db, child_id)
        if row is None or row["state"] != "running":
            return None
        return self.stop(db, child_id, "timed_out", timeout_error(float(row["timeout_s"] or 0)))

    def shim_gone(self, db: Connection, child_id: str, now: float) -> list[ChildEvent]:
        """The shim exited. Normally it reported `tree_ended` first (nothing to do); otherwise
        its exit record says what it knew, and the reported identity decides the proof.
        TEMPLATE_GONE and a pid: that shim template ended (its shims' stops are told to nobody)."""
        if child_id.startswith(TEMPLATE_GONE):
            if not self._closing:  # the template a closing keeper closed is no stray maker
                ended = int(child_id[len(TEMPLATE_GONE) :] or 0)
                self.strays.template_gone(db, ended, self._template.pid, now, self._orphans.holds)
            return []
        self._finishing.pop(child_id, None)
        row = rows.read_row(db, child_id)
        if row is None or row["state"] != "running":
            return []
        if row["shim_pid"] is not None and not self._orphans.holds(child_id):
            live = ProcessIdentity(row["shim_pid"], row["shim_start"])
            if is_alive(live):  # told gone by a template's end that missed its announcement
                self._watch.watch(child_id, live)
                self.strays.look(row, now)  # or a process of a stray shim's tree exited
                return []
        self.strays.forget(child_id)
        record = rows.ChildRecord.from_row(row)
        exit_record = read_record(os.path.join(record.record_dir, EXIT_RECORD)) or {}
        report = report_from_record(exit_record)
        if report is not None and (report.tree_ended or report.kind == "not_started"):
            return self.apply(db, report, now, from_shim=False)
        if row["shim_pid"] is None:
            # Gone before its first report (watched from its announcement, or its order lost
            # with its template): no claim means no child, and the claim made here fences a
            # late shim off, as at recovery; a live claimant is the shim to watch.
            shim = claimed_shim(row, record.record_dir)
            if shim is None:
                event = cp.not_started(record, cp.NOT_STARTED_SHIM_GONE, now)
                rows.write_settlement(db, record, event)
                return self._ended([event])
            if is_alive(shim):
                self._watch.watch(child_id, shim, reported=False)
                return []
            started = self._started_orphan(db, record, shim)
            if started is not None:  # its launch is answered now, not at the tree's end
                return [started, *self.shim_gone(db, child_id, now)]
            # Nothing lives where its child would be (the child's cgroup; without one, the
            # shim's session): the proof a reported child's dead shim gets. It was `unknown`,
            # its slot retained for good (shims a sibling killed between claim and spawn).
            self._orphans.forget(child_id, self._orphans.cgroup_of(child_id))  # empty: removed
            gone = ChildReport(
                kind="exited",
                seq=1,
                child_id=record.child_id,
                run_id=record.run_id,
                shim_pid=shim.pid,
                shim_start=shim.start_time,
            )
            event = self._settle(db, record, row, gone, now, reason=cp.REASON_SHIM_GONE_EARLY)
            return self._ended([event])
        if report is None:
            report = ChildReport(
                kind="exited",
                seq=1,
                child_id=record.child_id,
                run_id=record.run_id,
                shim_pid=record.shim_pid or 1,
                shim_start=record.shim_start or 0.0,
            )
        # The child's cgroup, when it has one, holds its whole tree whatever the shim reported
        # (a shim killed before the leader's exit wrote no record that names it).
        group = report.cgroup or self._orphans.cgroup_of(child_id)
        # Never reported started: only its cgroup can say which processes to watch.
        unknown = record.pid is None or record.identity_start is None
        leader: ProcessIdentity | None = None
        if record.pid is not None and record.identity_start is not None:
            leader = ProcessIdentity(record.pid, record.identity_start)
        if self._orphans.wait(row, report, group, leader if leader and is_alive(leader) else None):
            # The tree lives on (its leader, or processes the shim reported or its cgroup
            # holds): the run stays running, holds its slot, and a stop kills them; their end
            # brings it back here.
            return []
        self._orphans.forget(child_id, group)
        log.warning("the shim of child %s died before its tree ended", child_id)
        reason = cp.REASON_SHIM_GONE_LIVE if unknown else cp.REASON_SHIM_GONE
        return self._ended(
            [self._settle(db, record, row, report, now, unverified=unknown, reason=reason)]
        )

    def _started_orphan(
        self, db: Connection, record: rows.ChildRecord, shim: ProcessIdentity
    ) -> ChildStarted | None:
        """A shim that died before its first report left its child in the child's cgroup, or
        without one in the shim's session: the oldest process there is the child (R-RUN-5: a
        real pid), recorded as started (it was failed "ended", its exit status unknown, and
        its slot retained for good, while it ran on)."""
        leader = self._orphans.leader_left(record.child_id, shim.pid)
        if leader is None:
            return None
        record.shim_pid, record.shim_start = shim
        record.boot_id = boot_id()
        record.pid, record.identity_start = leader
        record.start_time = wall_clock(leader.start_time)
        rows.record_started(db, record)
        self._cap(record)
        return cp.started_event(record)

    def kill_escaped(self, child_id: str, signum: int = signal.SIGKILL) -> bool:
        """Signal the live processes a dead shim left (orphans.py); False when there are none."""
        return self._orphans.kill(child_id, signum)

    def recover(self, db: Connection, now: float) -> list[ChildEvent]:
        """After a restart: every child still recorded as running is settled from its exit
        record, adopted (its live shim is watched; its reports, resent until acknowledged,
        do the rest), or given up as never started. One file read per child, no polling."""
        events: list[ChildEvent] = []
        later = [over_at + SHIM_OVERDUE_MARGIN_S for _, over_at in rows.deadlines(db)]
        self.backstop.arm(min(later, default=None))
        for child_id in rows.running_child_ids(db):
            row = rows.read_row(db, child_id)
            assert row is not None
            record_dir = row["record_dir"] or ""
            exit_record = read_record(os.path.join(record_dir, EXIT_RECORD))
            report = None if exit_record is None else report_from_record(exit_record)
            if report is not None and (report.tree_ended or report.kind == "not_started"):
                events.extend(self.apply(db, report, now, from_shim=False))
                continue
            shim = claimed_shim(row, record_dir)
            if shim is None:
                record = rows.ChildRecord.from_row(row)
                event = cp.not_started(record, cp.NOT_STARTED_BY_RESTART, now)
                rows.write_settlement(db, record, event)
                events.append(event)
                continue
            if not is_alive(shim):
                events.extend(self.shim_gone(db, child_id, now))
                continue
            if (found := procfs.stat_of(shim.pid)) is not None and found.state == "T":
                # Stopped by its child while no template was its parent to continue it
                # (shimstops.py): with a tree that ended meanwhile, its run never ended.
                signal_shim(shim, signal.SIGCONT)  # pid and start time checked on a pidfd
            # Known from its claim alone (it never reported): ended if a child stopped it.
            self._watch.watch(child_id, shim, reported=row["shim_pid"] is not None)
            self.strays.adopt(row, now)  # no template of ours is its parent: stops unseen
            self._cap(rows.ChildRecord.from_row(row))
            if row["end_reason"] is not None:
                signal_shim(shim)  # a stop the earlier node recorded but may not have sent
                overdue = float(row["grace_s"]) + SHIM_OVERDUE_MARGIN_S
                if self._on_due is not None:  # a frozen shim would never end the tree
                    self._on_due(child_id, now + overdue, "overdue")
        return events
