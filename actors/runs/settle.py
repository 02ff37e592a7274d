"""RunSettler: how the RunSupervisor settles a run once nothing of it runs (R-RUN-5, R-CAP-22).

Owns the moves of a run's end: its budget read as it ends (R-FAN-26, a call whose answer comes
back as a `Settle` tick), its final state, output and event, the children that never started
marked `stopped`, the chains attached to it woken (R-RES-6), its `summary.json`, a paused
run's deadline timed again once it holds no process (R-RUN-2), and what it owes the other
owners (the capacity report, the session's view); and the settled workflows whose background
children still lack proof, whose slot is re-reported as each of those settles. The reports
themselves are runs/settlement.py's; this module only decides when they are owed. It never
sends them itself (they go through the host's outbox), never kills a process, and never
settles a run that still has a child running (runs/children.py asks it to only once none
runs).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol

from subagents_node.actors.context import Cancel
from subagents_node.actors.inbox import Tick
from subagents_node.actors.runs import attach, management, runstore, settlement, steps
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.retention import RunRetention
from subagents_node.actors.runs.ticks import Advance, RunDeadline, Settle
from subagents_node.messages.capacity import ReportTerminal
from subagents_node.messages.fanout import FanoutSnapshot, ReadSnapshot, decode_descriptor
from subagents_node.messages.supervisor import Snapshots

P = ParamSpec("P")


class SettleHost(steps.StepHost, Protocol):
    """What settling a run needs from the RunSupervisor, beyond the StepHost's moves."""

    def after_commit(self, effect: Callable[[], None]) -> None: ...

    def after(self, delay_s: float, tick: Tick) -> Cancel: ...

    def to_self(self, make: Callable[P, Tick]) -> Callable[P, None]:
        """A callback (run on another thread) that delivers the tick `make` builds to us."""

    def track(self, session_id: str, run_id: str, state: Any) -> None:
        """Owe the session owner the run's state (durable, sent until answered)."""

    def report_terminal(self, report: ReportTerminal) -> None:
        """Owe the capacity owner this report about the run's slot (durable, as `track`)."""

    def answer_launches(self, live: LiveRun) -> None:
        """Answer the launches still waiting on the run."""


class RunSettler:
    """Settles the host's live runs (`live`, the host's own map: a settled run leaves it)."""

    def __init__(self, host: SettleHost, live: dict[str, LiveRun], retention: RunRetention):
        self._host = host
        self._live = live
        self._retention = retention
        #: Settled workflows whose background children still lack proof (R-CAP-22): their
        #: slot is re-reported whenever one of those children settles.
        self._unproven_workflows: set[str] = set()

    def finish(self, live: LiveRun) -> None:
        """Read the run's budget as it ends (R-FAN-26: nested claims included), then settle."""
        if live.settling:
            return
        live.settling = True
        row = runstore.run_row(self._host.db, live.run_id)
        encoded = row["fanout"] if row is not None else ""
        if not encoded:
            self.settle(live, None)
            return
        self._host.call(Settle(live.run_id), ReadSnapshot(descriptor=decode_descriptor(encoded)))

    def settle(self, live: LiveRun, fanout: FanoutSnapshot | None) -> None:
        host, db = self._host, self._host.db
        now = host.clock()
        if fanout is not None:
            row = runstore.run_row(db, live.run_id)
            assert row is not None
            snapshots = Snapshots.model_validate_json(row["snapshots"]).model_copy(
                update={
                    "fanout_used": fanout.used,
                    "fanout_limit": fanout.limit,
                    "fanout_remaining": fanout.remaining,
                }
            )
            runstore.update_run(db, live.run_id, snapshots=snapshots)
        state = live.final_state()
        db.execute(
            "UPDATE run_children SET state='stopped' WHERE run_id=? AND state='pending'",
            (live.run_id,),
        )
        ended_at = now if state == "paused" else _ended_at(db, live, now)
        runstore.update_run(
            db, live.run_id, state=state, ended_at=ended_at, error=live.error, output=live.output()
        )
        if state == "paused":
            steps.settle_paused(host, live)
        else:
            host.record_event(live.run_id, f"run.{state}", {"error": live.error or None})
        self.source_ended(live.run_id, state, live.output())
        self._retention.run_ended(db)
        view = runstore.view(db, live.run_id)
        if view is not None:
            settlement.write_summary(view)
        if live.cancel_deadline is not None:
            live.cancel_deadline()
        if live.handle is not None:
            verdict = (False, "")
            if live.mode == "workflow":
                verdict = management.workflow_children_verdict(db, live.run_id)
                if not verdict[0]:
                    self._unproven_workflows.add(live.run_id)
            host.report_terminal(settlement.terminal_report(live, state, now, verdict))
        if live.parent_run_id in self._unproven_workflows:
            self._report_workflow(live.parent_run_id)
        host.track(live.session_id, live.run_id, state)
        live.unstarted.clear()
        host.answer_launches(live)
        # Forgotten once the settlement is durable: undone by a full disk, the run stays live
        # and settling, and settles again (RunSupervisor.group_undone).
        host.after_commit(functools.partial(self._forget, live.run_id))
        self._time_paused(live.run_id)

    def _time_paused(self, run_id: str) -> None:
        """The run settled `paused`: its deadline is timed again. Or it went on with a paused
        run and failed (a continuation whose start failed): that run is still paused, and a
        deadline due meanwhile did nothing (it might have gone on), so its deadline is timed
        again too. Each once the settlement is durable: the tick then finds no live run."""
        db = self._host.db
        row = runstore.run_row(db, run_id)
        for paused_id in (run_id, row["source_run_id"] if row is not None else None):
            deadline = runstore.paused_deadline(db, paused_id) if paused_id else None
            if paused_id and deadline is not None:
                timing = functools.partial(self._time_parked, paused_id, deadline)
                self._host.after_commit(timing)

    def _forget(self, run_id: str) -> None:
        self._live.pop(run_id, None)

    def _time_parked(self, run_id: str, deadline: float) -> None:
        """R-RUN-2: a paused run's deadline keeps counting while it holds no process. Its live
        timer was cancelled above, and a deadline that came while it was pausing found it
        stopping and did nothing: timed again here, due at once if it passed already."""
        self._host.after(max(0.0, deadline - self._host.clock()), RunDeadline(run_id))

    def source_ended(self, run_id: str, state: str, output: str) -> None:
        """Run `run_id` ended (settled here, or a paused run that holds no process): the
        chains attached to it go on, or fail, once this transaction commits."""
        advance = self._host.to_self(Advance)
        for chain_id in attach.source_ended(self._live.values(), run_id, state, output):
            self._host.after_commit(functools.partial(advance, chain_id))

    def recover_unproven(self, db: sqlite3.Connection) -> None:
        """After a restart: the settled workflows that hold a slot while a child of theirs is
        still live. The set lives in memory only; without this, such a child's end after a
        restart would never re-judge its workflow's slot, held for good."""
        self._unproven_workflows |= set(runstore.workflows_awaiting_children(db))

    def _report_workflow(self, run_id: str) -> None:
        """R-CAP-22: re-judge a settled workflow's slot once one of its children settles."""
        db = self._host.db
        row = runstore.run_row(db, run_id)
        if row is None or not row["capacity"]:
            self._unproven_workflows.discard(run_id)
            return
        verdict = management.workflow_children_verdict(db, run_id)
        if verdict[0]:
            self._unproven_workflows.discard(run_id)
        proofs = runstore.proof_states(db, run_id)
        self._host.report_terminal(
            settlement.workflow_rereport(row, verdict, proofs, self._host.clock())
        )


def _ended_at(db: sqlite3.Connection, live: LiveRun, now: float) -> float:
    """When the run ended: now, unless a node restart adopted it (it starts no child then) and
    every child of it has ended: then when the last of them did. Children that ended while no
    node ran were settled from their exit records (their own end times) by the next node; the
    run ended with them, not when that node came up (its duration left the downtime out)."""
    if live.launch is not None:
        return now
    total, ended, latest = db.execute(
        "SELECT COUNT(*), COUNT(ended_at), MAX(ended_at) FROM run_children WHERE run_id=?",
        (live.run_id,),
    ).fetchone()
    if not total or ended < total or latest is None or latest > now:
        return now  # a child the restart settled without an end of its own: ended now
    return float(latest)
