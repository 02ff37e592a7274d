"""Dynamic chain steps and pauses as the RunSupervisor drives them (R-FAN-21, R-RUN-2).

Owns the moves, not the rules (actors/runs/expansion.py and checkpoints.py have those): opening
an `expand` step (its items claimed as one batch before any starts; a rejection fails the step
and the run with the rejection's text), stopping at a `checkpoint` (the run is `paused` until
approved or rejected), interrupt-as-pause (the child tree is stopped, the run settles `paused`
and keeps its slot for the resume that continues it), and the decisions on a checkpoint.

Crash points (tests, a node started with faults): `expand_claim` (the node dies with the
claim's event committed but the claim not answered), `expand_record` (claims answered, rows not
written), `pause_settle` (children stopped, pause not settled) and `checkpoint_decide`. A
restarted node never leaves a run stuck: see checkpoints.adopt_pausing and recover_parked.
It never blocks on another owner: the claim is a call whose answer is an `Answer` tick.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from typing import Any, Protocol

from subagents_node.actors.pipelines import MAX_RESENDS, Durable, unanswered
from subagents_node.actors.runs import checkpoints, expansion, runstore
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.ticks import CallKey, Expand
from subagents_node.messages.base import Message, Request
from subagents_node.messages.capacity import ReportedState, ReportTerminal, RunnerProof, SlotHandle
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.fanout import ClaimPaths, FanoutSnapshot

log = logging.getLogger(__name__)


class StepHost(Protocol):
    """What these moves need from the RunSupervisor."""

    @property
    def db(self) -> sqlite3.Connection: ...

    def clock(self) -> float: ...

    def crash_point(self, point: str) -> None: ...

    def record_event(self, run_id: str, kind: str, data: dict[str, Any]) -> None: ...

    def call(self, key: CallKey, request: Request | Durable) -> None: ...

    def advance(self, live: LiveRun) -> None: ...

    def stop_live(self, live: LiveRun, state: str, reason: str) -> None: ...


def open_dynamic(host: StepHost, live: LiveRun, group: int) -> bool:
    """Group `group` is an expand or checkpoint step about to open: True while the run waits
    (for the batch claim, or for a decision), False once the step is done with (an empty
    expansion, or a failure that ends the run)."""
    step = live.dynamic[group]
    if step.kind == "checkpoint":
        _stop_at_checkpoint(host, live, group, step.note)
        return True
    if live.descriptor is None:
        _fail(host, live, group, expansion.MISSING_DESCRIPTOR)
        return False
    launch = live.launch
    assert launch is not None
    try:
        items = expansion.split_items(expansion.step_input(live, group, launch.cwd))
        plans = expansion.plan_expansion(live, group, step, items)
    except expansion.ExpansionFailed as exc:
        _fail(host, live, group, str(exc))
        return False
    if not plans:
        del live.dynamic[group]  # nothing to claim and nothing to start
        data = {"step": live.absolute_step(group), "items": 0}
        host.record_event(live.run_id, expansion.EXPANDED, data)
        return False
    live.expanding = True
    live.expansion = plans
    absolute = live.absolute_step(group)
    host.record_event(live.run_id, expansion.EXPANDING, {"step": absolute, "items": len(plans)})
    host.crash_point("expand_claim")
    # Sent once the event is durable: a node that dies after the claim knows it expanded.
    # Under an id of its own: a batch whose answer was lost with its fan-out owner (killed, and
    # back within a second) is sent again and counted once; it failed the step and the run.
    claim = ClaimPaths(
        descriptor=live.descriptor, paths=[p.label for p in plans], claim_id=uuid.uuid4().hex
    )
    live.expand_claim, live.expand_resends = claim, 0
    host.call(Expand(live.run_id, group), Durable(request=claim))
    return True


def expanded(host: StepHost, live: LiveRun, group: int, outcome: Message | SubagentsError) -> None:
    """The batch claim's answer: every item's child becomes pending and the step starts, or
    the rejection fails the step and the run (nothing of the batch started). One lost with its
    owner is sent again first (MAX_RESENDS)."""
    claim = live.expand_claim
    if claim is not None and unanswered(outcome) and live.expand_resends < MAX_RESENDS:
        live.expand_resends += 1
        log.warning("%s to %s went unanswered; sending it again", claim.type, claim.target)
        host.call(Expand(live.run_id, group), claim)
        return
    live.expand_claim = None
    plans, live.expansion, live.expanding = live.expansion, [], False
    absolute = live.absolute_step(group)
    if isinstance(outcome, SubagentsError):
        host.record_event(
            live.run_id,
            "step.rejected",
            {"step": absolute, "code": outcome.code, "error": outcome.message},
        )
        _fail(host, live, group, outcome.message)
        host.advance(live)
        return
    assert isinstance(outcome, FanoutSnapshot)
    host.crash_point("expand_record")
    if live.stop_state is not None:
        host.advance(live)  # stopped while the claim was out: the claims stay (R-FAN-15)
        return
    expansion.record_expansion(host.db, live, group, plans)
    del live.dynamic[group]
    host.record_event(
        live.run_id,
        expansion.EXPANDED,
        {"step": absolute, "items": len(plans), "fanout_used": outcome.used},
    )
    host.advance(live)


def _fail(host: StepHost, live: LiveRun, group: int, error: str) -> None:
    live.failed = True
    live.error = live.error or error
    live.dynamic.pop(group, None)


# -- checkpoints and pauses -----------------------------------------------------------------------


def _stop_at_checkpoint(host: StepHost, live: LiveRun, group: int, note: str) -> None:
    """R-RUN-2: the run waits, paused, for approve or reject; its execution stays (no process
    runs), so its slot stays with it and its deadline keeps counting."""
    live.checkpoint = group
    runstore.update_run(host.db, live.run_id, state="paused")
    data = {"kind": "checkpoint", "step": live.absolute_step(group), "note": note}
    host.record_event(live.run_id, checkpoints.PAUSED, data)


def pause(host: StepHost, live: LiveRun) -> None:
    """Interrupt-as-pause: record where the run goes on from, then stop its child tree; the
    run settles `paused` once no child of it runs (settle_paused)."""
    step = live.absolute_step(checkpoints.pause_point(live))
    host.record_event(live.run_id, checkpoints.PAUSING, {"kind": "interrupt", "step": step})
    host.stop_live(live, "paused", "Paused by request.")


def settle_paused(host: StepHost, live: LiveRun) -> None:
    """The paused run's last child ended: it holds no process now (SPEC §0.4 transfer)."""
    host.crash_point("pause_settle")
    record = checkpoints.pause_record(host.db, live.run_id) or {}
    data = {"kind": "interrupt", "step": record.get("step", 0)}
    host.record_event(live.run_id, checkpoints.PAUSED, data)


def approve(host: StepHost, live: LiveRun) -> None:
    """The checkpoint's decision is yes: the run goes on with the step after it."""
    group = live.checkpoint
    assert group is not None
    host.crash_point("checkpoint_decide")
    live.checkpoint = None
    del live.dynamic[group]
    runstore.update_run(host.db, live.run_id, state="running")
    host.record_event(live.run_id, checkpoints.APPROVED, {"step": live.absolute_step(group)})
    host.advance(live)


def reject(host: StepHost, live: LiveRun, reason: str) -> None:
    """The checkpoint's decision is no: the run ends `rejected` (terminal, R-RUN-3)."""
    group = live.checkpoint
    assert group is not None
    host.crash_point("checkpoint_decide")
    live.checkpoint = None
    live.dynamic.pop(group, None)
    live.error = rejection_error(reason)
    host.record_event(
        live.run_id, checkpoints.REJECTED, {"step": live.absolute_step(group), "reason": reason}
    )
    host.stop_live(live, "rejected", live.error)


def rejection_error(reason: str) -> str:
    return f"Checkpoint rejected: {reason}" if reason else "Checkpoint rejected."


def reject_parked(host: StepHost, row: sqlite3.Row, reason: str) -> ReportTerminal | None:
    """Reject a checkpoint whose execution a node restart ended: the run ends `rejected` and
    the capacity report that frees its slot is returned (None when it holds none)."""
    run_id, now = str(row["run_id"]), host.clock()
    host.crash_point("checkpoint_decide")
    error = rejection_error(reason)
    runstore.update_run(host.db, run_id, state="rejected", ended_at=now, error=error)
    step = (checkpoints.pause_record(host.db, run_id) or {}).get("step")
    host.record_event(run_id, checkpoints.REJECTED, {"step": step, "reason": reason})
    host.record_event(run_id, "run.rejected", {"error": error})
    return parked_report(host.db, row, "rejected", now)


def expire_parked(host: StepHost, row: sqlite3.Row) -> ReportTerminal | None:
    """The deadline of a paused run that holds no process (interrupt-paused, or a checkpoint
    wait a node restart left: no live run's timer holds it) passed: the run fails as a live
    one would, and the capacity report that frees its slot is returned (None: it holds none)."""
    run_id, now = str(row["run_id"]), host.clock()
    budget_ms = round((row["deadline_at"] - row["started_at"]) * 1000)
    error = f"Run timed out after {budget_ms} ms."
    runstore.update_run(host.db, run_id, state="failed", ended_at=now, error=error)
    host.record_event(run_id, "run.failed", {"error": error})
    return parked_report(host.db, row, "failed", now)


def parked_report(
    db: sqlite3.Connection, row: sqlite3.Row, state: ReportedState, now: float
) -> ReportTerminal | None:
    """What the capacity owner is told about a run that holds no process (no live runner)."""
    if not row["capacity"]:
        return None
    handle = SlotHandle.model_validate_json(row["capacity"])
    # Children that never started have no proof to give (their rows are pending or stopped).
    proofs = [p for p in runstore.proof_states(db, str(row["run_id"])) if p is not None]
    return ReportTerminal(
        session_id=row["session_id"],
        run_id=row["run_id"],
        generation=handle.generation,
        state=state,
        live_process=False,
        proof=RunnerProof.of_children(proofs, row["runner_id"], None, now, row["error"]),
    )
