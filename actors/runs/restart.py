"""RunRestart: what the RunSupervisor does each time it starts, after a node restart or in place.

Owns the order of recovery, in one transaction (the host's on_start commits it, so a run that
recovery settles and the reports it then owes become durable together): the outbox sent again
ahead of new rows; the appends whose record is durable but whose claims were never committed
owed again (R-APP-4); run and child rows that cannot be read quarantined and never adopted, so
their slot and claims stay held (DESIGN §2); runs that hold no process left to pauses.py (a
paused run's deadline timed again); every other unsettled run adopted from the store (its
deadline re-armed: it outlives the node that set it, and its slot's start owed again: the node
may have died before marking it; bound to this node's process when it is its foreground
command's, runs/rebinding.py); the shims' exit records applied; the live shims of the bound
runs told so; the children of runs paused before the crash stopped; superseded runs stopped
(R-MISC-2); each adopted run advanced; retention re-armed.
Adopting runs happens once per node process: an in-place restart after a crash keeps the live
runs (their shims report to the actor whatever happens to it) and only sends the outbox again.
It never kills a process (the keeper tells each shim), never adopts a row it cannot read, and
never sends what the runs owe itself (the outbox does, once the transaction has committed).
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable
from typing import Protocol

from subagents_node.actors.child import rows as child_rows
from subagents_node.actors.context import Cancel
from subagents_node.actors.inbox import Tick
from subagents_node.actors.owner import Outcome
from subagents_node.actors.quarantine import reason_of
from subagents_node.actors.runs import (
    checkpoints,
    children,
    management,
    pauses,
    rebinding,
    runrequests,
    runstore,
)
from subagents_node.actors.runs.launches import RunLaunches
from subagents_node.actors.runs.liverun import LiveRun, adopt_from_store
from subagents_node.actors.runs.outbox import Outbox
from subagents_node.actors.runs.retention import RunRetention
from subagents_node.actors.runs.ticks import RunDeadline
from subagents_node.messages.base import Request
from subagents_node.messages.capacity import MarkStarted, MarkWorkflowStarted
from subagents_node.messages.errors import CapacityOwnershipChanged, RecordQuarantined
from subagents_node.messages.fanout import AbortReservation, CommitReservation
from subagents_node.messages.node import QuarantinedRecord


class RestartHost(children.ChildHost, pauses.PauseHost, rebinding.BindingHost, Protocol):
    """What recovery needs from the RunSupervisor, beyond the child and pause hosts'."""

    def after(self, delay_s: float, tick: Tick) -> Cancel: ...

    def quarantine(self, table: str, key: str, reason: str) -> QuarantinedRecord: ...

    def quarantine_unreadable(self, err: RecordQuarantined) -> str:
        """Report a run or child row that cannot be read; the run id it belongs to."""


class RunRestart:
    """Recovers the host's runs into `live` (the host's own map of its live runs)."""

    def __init__(
        self,
        host: RestartHost,
        live: dict[str, LiveRun],
        outbox: Outbox,
        launches: RunLaunches,
        retention: RunRetention,
    ) -> None:
        self._host = host
        self._live = live
        self._outbox = outbox
        self._launches = launches
        self._retention = retention
        self._recovered = False

    def recover(self) -> None:
        """After a node restart: settle or keep watching the runs the store says are going.

        Runs only once per node process: an in-place restart after a crash keeps the live runs
        (their shims report to this actor whatever happens to it). Every start, in place or
        not, sends the outbox again: an in-place restart may have undone a commit whose
        effects were to send its next rows.
        """
        if self._recovered:
            self._outbox.resend_all()
            return
        self._recovered = True
        host, db = self._host, self._host.db
        # One transaction (on_start commits it): a run that recovery settles and the reports
        # it then owes become durable together, as they do when a request settles a run.
        db.execute("BEGIN IMMEDIATE")
        self._outbox.resend_all()  # sent after that commit, oldest first, ahead of new rows
        # PRAGMA synchronous: 2 is FULL (power-loss safe), so the exit records are synced too.
        host.keeper.sync_records = int(db.execute("PRAGMA synchronous").fetchone()[0]) >= 2
        for run_id, seq, reservation in management.reserving_appends(db):
            # Its reserve went unanswered with the node: no append was made (nor answered as
            # made), so its reservation, if the fan-out owner recorded it, is aborted.
            management.drop_reserving(db, run_id, seq)
            self._outbox.put(AbortReservation(reservation_id=reservation), run_id)
        for run_id, seq, reservation in management.uncommitted_appends(db):
            # R-APP-4 after a crash: the record is durable, so its claims must be too. Owed
            # through the outbox: a commit lost to a restarting fan-out owner is sent again.
            management.mark_committing(db, run_id, seq)
            self._outbox.put(CommitReservation(reservation_id=reservation), run_id)
        # Only the runs that may still be going are read: recovery is bounded by them, never
        # by the history (a finished run's unreadable row is reported when first read).
        unreadable = {host.quarantine_unreadable(err) for err in runstore.unreadable(db)}
        unsettled = runstore.unsettled_runs(db)
        for run_id in unsettled:
            if run_id in unreadable:  # a run that cannot be read is listed, not recovered
                continue
            if checkpoints.parked(db, run_id):
                pauses.recover_parked(host, run_id)  # it holds no process (R-RUN-2)
                self._arm_parked_deadline(run_id)
            else:
                self._adopt_run(run_id)
        for child_id, reason in child_rows.unreadable(db, unsettled):
            host.quarantine(child_rows.TABLE, child_id, reason)  # never adopted: fail closed
        for event in host.keeper.recover(db, host.clock()):
            children.apply_event(host, event)
        rebinding.tell_shims(host, list(self._live.values()))  # those whose tree goes on
        for live in list(self._live.values()):
            if live.stop_state == "paused":  # its pause was asked for before the crash
                for child_id in list(live.running):
                    send = host.keeper.stop(db, child_id, "stopped", "Paused by request.")
                    if send is not None:  # once recovery's transaction has committed
                        host.after_commit(functools.partial(_discard, send))
        for run_id in list(self._live):
            self._launches.stop_superseded(run_id)  # R-MISC-2: linked, but maybe not yet stopped
            if run_id in self._live:
                host.advance(self._live[run_id])
        self._retention.arm(db)
        host.keeper.flush()  # the adopted shims (recovery is not a commit group's message)

    def _arm_parked_deadline(self, run_id: str) -> None:
        """A paused run (by `pause` or at a checkpoint) keeps its deadline counting (R-RUN-2);
        the node that timed it is gone, so it is timed again from its absolute time (past: at
        once)."""
        host = self._host
        deadline = pauses.parked_deadline(host, run_id)
        if deadline is not None:
            host.after(max(0.0, deadline - host.clock()), RunDeadline(run_id))

    def _adopt_run(self, run_id: str) -> None:
        """Keep watching a run the store says is going; one whose record does not parse is
        quarantined instead (its slot and claims stay held: fail closed)."""
        host = self._host
        try:
            runstore.view(host.db, run_id)  # every field of the run and its children parses
            live, row = adopt_from_store(host.db, run_id)
        except RecordQuarantined as err:
            host.quarantine_unreadable(err)
            return
        except (ValueError, TypeError) as exc:  # its capacity handle does not parse
            host.quarantine(runstore.RUNS, run_id, reason_of(exc))
            return
        self._live[run_id] = live
        rebinding.bind(host, live)
        if row["deadline_at"] is not None and row["started_at"] is not None:
            # The run's own deadline outlives the node that set it; it may have passed already.
            live.deadline_ms = round((row["deadline_at"] - row["started_at"]) * 1000)
            remaining = max(0.0, row["deadline_at"] - host.clock())
            live.cancel_deadline = host.after(remaining, RunDeadline(run_id))
        checkpoints.adopt_pausing(host.db, live)
        _adopt_stopping(host.db, live)
        _owe_slot_start(host, live, row)
        host.record_event(run_id, "run.recovered", {"running": len(live.running)})


def _owe_slot_start(host: RestartHost, live: LiveRun, row: sqlite3.Row) -> None:
    """The node may have died after the run's children started but before its slot was marked
    started: that slot is unstarted still, and its TTL would free it while the run goes on, so
    a second run would pass max_active (R-CAP-7). The start is owed again (idempotent: a
    started slot stays as it is), ahead of any report of the run's end (the outbox keeps
    order); `adopted_slot_marked` hears the answer."""
    if live.handle is None:
        return
    source = row["source_run_id"]
    if source and checkpoints.parked(host.db, source):
        return  # a paused run's continuation: pauses.recover_parked asks it and decides
    mark: Request = (
        MarkWorkflowStarted(handle=live.handle)
        if live.mode == "workflow"
        else MarkStarted(handle=live.handle, runner_id=live.runner_id, pid=os.getpid())
    )
    host.owe(mark, live.run_id)


def adopted_slot_marked(host: RestartHost, run_id: str, outcome: Outcome) -> None:
    """The answer to an adopted run's owed start (`_owe_slot_start`). Refused, the slot was
    freed or handed on while no node ran (its TTL passed): the run holds no slot, so it may
    not go on; it is stopped, failed, and its children with it. Any other refusal (a slot
    record that cannot be read counts as held: fail closed) leaves the run going."""
    if not isinstance(outcome, CapacityOwnershipChanged):
        return
    live = host.live_run(run_id)
    if live is None or live.stop_state is not None or live.settling or not live.running:
        return  # it ended or is ending anyway (no child runs); its end report frees nothing
    reason = f"Its capacity slot was lost while the node was down: {outcome.message}"
    host.stop_live(live, "failed", reason)


def _adopt_stopping(db: sqlite3.Connection, live: LiveRun) -> None:
    """A stop begun before the restart is finished as that stop: the run ends in the state the
    stop named (`stopped` for a request), not `failed` because the node went away meanwhile."""
    if live.stop_state not in (None, "paused"):
        return
    found = runstore.events_of_kind(db, live.run_id, runrequests.STOPPING)
    if not found:
        return
    data = found[-1].data
    state = str(data.get("state") or "stopped")  # records from before the state was kept
    live.stop_state = state  # a stop that came while it paused wins over the pause
    if state == "failed":
        live.error = live.error or str(data.get("reason") or "")
    elif data.get("error"):  # a stop that says why (a forgotten worker's: runs.stop_released)
        live.error = live.error or str(data["error"])


def _discard(send: Callable[[], float | None]) -> None:
    send()  # as before on this path: no grace timer for what a dead shim left
