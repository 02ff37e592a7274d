"""The pause requests (R-RUN-2): `runs.pause`, `runs.approve`, `runs.reject`, and what `resume`,
`stop` and a restarted node do with a paused run.

Owns the order of each request's steps, not their rules (checkpoints.py) or the moves inside a
live run (steps.py). A run paused in this node's memory (waiting at a checkpoint) is decided in
place; a run that holds no process (interrupt-paused, or a checkpoint whose execution a node
restart ended) goes on in a new run launched like a resume: the source's budget (nothing
claimed, R-FAN-23), its slot (transferred, R-CAP-18: a paused source with no live process is
transferable, SPEC §0.4 / A-2) and its absolute deadline (R-TMO-8). Once that run has its slot
(after mark_started), the source is `stopped` with a link to it; a rollback before that leaves
the source paused with its slot restored (R-CAP-16). A nested resume (R-TOP-1) takes no slot:
once its run started, the source ends `stopped` and reports so, which frees the slot it held.
It never blocks on another owner.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from subagents_node.actors.runs import (
    checkpoints,
    management,
    relaunch,
    runplan,
    runstore,
    steps,
)
from subagents_node.actors.runs.admission import ResumePlan
from subagents_node.actors.runs.approvals import Approval
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.recovery import read_recovery
from subagents_node.actors.runs.workflowkeys import KeyedLaunch
from subagents_node.messages.base import Message, Request
from subagents_node.messages.capacity import MarkStarted, ReportedState, ReportTerminal, SlotHandle
from subagents_node.messages.errors import LaunchIdConflict, SubagentsError
from subagents_node.messages.lineage import Resume
from subagents_node.messages.pauses import Approve, Pause, Reject
from subagents_node.messages.supervisor import (
    IntercomMode,
    Launch,
    LaunchResult,
    PauseKind,
    RunView,
)


class PauseHost(steps.StepHost, Protocol):
    """What the pause requests need from the RunSupervisor, beyond the StepHost's moves."""

    def resolve(self, run_id: str) -> str: ...

    def live_run(self, run_id: str) -> LiveRun | None: ...

    def relaunch(
        self,
        launch: Launch,
        plan: ResumePlan,
        on_started: Callable[[RunView], None],
        keyed: KeyedLaunch | None = None,
    ) -> Message: ...

    def track(self, session_id: str, run_id: str, state: Any) -> None:
        """Owe the session owner the run's state (durable, sent until answered)."""

    def report_terminal(self, report: ReportTerminal) -> None:
        """Owe the capacity owner this report about the run's slot (durable, as `track`)."""

    def owe(self, request: Request, run_id: str) -> None:
        """Owe another owner `request` for `run_id` (durable, as `track`)."""

    def stop_live(self, live: LiveRun, state: str, reason: str) -> None: ...

    def parked_ended(self, run_id: str, state: str, output: str) -> None:
        """A paused run that holds no process ended: the chains attached to it go on."""

    def continuing(self, run_id: str) -> str | None:
        """The run being admitted to go on with paused run `run_id`, if any."""

    def after_commit(self, effect: Callable[[], None]) -> None: ...

    def launched_by_key(self, keyed: KeyedLaunch) -> Message | None:
        """The answer to a launch under `keyed` that launched already (or is being admitted),
        None when it launched nothing (runs/launches.py)."""


def _view(host: PauseHost, run_id: str) -> RunView:
    view = runstore.view(host.db, run_id)
    assert view is not None
    return view


def _row(host: PauseHost, run_id: str) -> sqlite3.Row:
    row = runstore.run_row(host.db, run_id)
    assert row is not None
    return row


def pause(host: PauseHost, request: Pause) -> Message:
    """Interrupt-as-pause: answered at once; the run settles `paused` once its tree ended."""
    run_id = host.resolve(request.run_id)
    live = host.live_run(run_id)
    row = _row(host, run_id)
    if checkpoints.pausing(host.db, row, live):
        # Asked for already (this pause's answer was lost, or another's came first): the run
        # as it is, pausing or paused, as the first pause was answered.
        return _view(host, run_id)
    checkpoints.check_pausable(row, live)
    assert live is not None
    steps.pause(host, live)
    return _view(host, run_id)


def _at_checkpoint(live: LiveRun | None) -> bool:
    return live is not None and live.checkpoint is not None and live.stop_state is None


def approve(host: PauseHost, request: Approve) -> Message:
    run_id = host.resolve(request.run_id)
    # Under an approve id, sent again after its answer was lost: the run that went on.
    approval = Approval.of(run_id, request)
    made = approval.made(host.db) if approval is not None else None
    if made is not None:
        return made
    live = host.live_run(run_id)
    if _at_checkpoint(live):
        assert live is not None and live.checkpoint is not None
        step = live.absolute_step(live.checkpoint)
        steps.approve(host, live)
        if approval is not None:
            approval.record(host.db, step, host.clock())
        # Tests: die once the decision is durable, before it is answered.
        host.after_commit(lambda: host.crash_point("approve_recorded"))
        return LaunchResult(run=_view(host, run_id))
    keyed = approval.keyed() if approval is not None else None
    if approval is not None and keyed is not None:
        try:
            going = host.launched_by_key(keyed)
        except LaunchIdConflict:
            raise approval.conflict() from None
        if going is not None:
            return going
    row = _row(host, run_id)
    checkpoints.waiting_checkpoint(host.db, row)
    # A node restart ended the execution that paused: a new run goes on after the checkpoint.
    # From inside a run (a route, or a depth) it is a nested resume: no slot (R-TOP-1).
    return continue_paused(
        host,
        row,
        "checkpoint",
        request.depth,
        request.capacity_limit,
        request.env,
        route=request.inherited_fanout,
        keyed=keyed,
    )


def reject(host: PauseHost, request: Reject) -> Message:
    run_id = host.resolve(request.run_id)
    if checkpoints.rejected(host.db, run_id):
        # Rejected already (this reject's answer was lost, or another's came first): the run
        # as it is, not "is rejected, not waiting at a checkpoint" to a caller left guessing.
        return _view(host, run_id)
    live = host.live_run(run_id)
    if _at_checkpoint(live):
        assert live is not None
        steps.reject(host, live, request.reason)
    else:
        row = _row(host, run_id)
        checkpoints.waiting_checkpoint(host.db, row)
        going = host.continuing(run_id)
        if going is not None:  # approved: rejected now, it would end while its steps ran on
            raise checkpoints.refuse(
                run_id, f"was approved: it is being continued as run {going}.", "continued"
            )
        report = steps.reject_parked(host, row, request.reason)
        if report is not None:
            host.report_terminal(report)
        host.track(row["session_id"], run_id, "rejected")
        host.parked_ended(run_id, "rejected", str(row["output"]))
    return _view(host, run_id)


def resume_paused(
    host: PauseHost, row: sqlite3.Row, request: Resume, keyed: KeyedLaunch | None = None
) -> Message:
    """`resume` of an interrupt-paused run: it goes on from the interrupted step; `keyed`, the
    launch id it came under (or a workflow's key), names the run that goes on."""
    return continue_paused(
        host,
        row,
        "interrupt",
        request.depth,
        request.capacity_limit,
        request.env,
        request.intercom,
        request.inherited_fanout,
        request.message,
        keyed,
    )


def continue_paused(
    host: PauseHost,
    row: sqlite3.Row,
    kind: PauseKind,
    depth: int,
    capacity_limit: int,
    env: dict[str, str] | None,
    intercom: IntercomMode | None = None,
    route: str | None = None,
    message: str = "",
    keyed: KeyedLaunch | None = None,
) -> Message:
    """Launch the run that goes on with paused run `row` from its pause point; `intercom`
    overrides the setting persisted with it (R-RES-7), `route` is the caller's nested-run
    route (R-TOP-1: with one, or a depth, the new run takes no capacity), `message` a resume's
    follow-up, appended to the task of the step it goes on from."""
    source_id = str(row["run_id"])
    checkpoints.check_continuable(host.db, row, kind)
    source, descriptor = read_recovery(Path(row["run_dir"]), source_id)
    launch = checkpoints.continuation(host.db, row, source, kind, host.clock())
    launch = relaunch.with_follow_up(source_id, launch, message)
    launch = relaunch.as_resume(launch, env, depth, capacity_limit, route)
    if intercom is not None:
        launch = launch.model_copy(update={"intercom": intercom})
    if keyed is not None and keyed.launch_id is not None:
        launch = launch.model_copy(update={"launch_id": keyed.launch_id})
    moves = row["capacity"] is not None and runplan.capacity_eligible(launch)
    plan = ResumePlan(source_id, descriptor, transfer=moves)
    return host.relaunch(
        launch, plan, lambda view: continued(host, source_id, view.run_id, moved=moves), keyed
    )


def continued(host: PauseHost, source_id: str, run_id: str, moved: bool = True) -> None:
    """The paused source is over: it gave its slot to the run that goes on with it, or, when
    that run is nested and takes no capacity (R-TOP-7, R-RES-3), it ends like a stopped
    paused run (R-CAP-25): its terminal report lets the owner release the slot it holds."""
    row = runstore.run_row(host.db, source_id)
    if row is None or row["state"] != "paused":
        return
    output = f"Continued as run {run_id}."
    now = host.clock()
    runstore.update_run(host.db, source_id, state="stopped", ended_at=now, output=output)
    report = None if moved else steps.parked_report(host.db, row, "stopped", now)
    if report is not None:
        host.report_terminal(report)
    host.record_event(source_id, "run.continued", {"by": run_id})
    host.track(row["session_id"], source_id, "stopped")
    host.parked_ended(source_id, "stopped", output)


def end_parked(host: PauseHost, run_id: str, state: ReportedState, reason: str) -> None:
    """A paused run that holds no process ends (stop): its slot is reported free."""
    row = _row(host, run_id)
    if checkpoints.successor(host.db, run_id) is not None:
        return
    now = host.clock()
    runstore.update_run(host.db, run_id, state=state, ended_at=now)
    host.record_event(run_id, f"run.{state}", {"reason": reason})
    report = steps.parked_report(host.db, row, state, now)
    if report is not None:
        host.report_terminal(report)
    host.track(row["session_id"], run_id, state)
    host.parked_ended(run_id, state, str(row["output"]))


def recover_parked(host: PauseHost, run_id: str) -> None:
    """A paused run found after a restart is not adopted (it holds no process). One already
    continued by another run gives way to it (the node died before it said so); any other is
    reported paused with no live process (again: the report is idempotent), so its slot can
    move to the run that goes on with it (A-2)."""
    row = _row(host, run_id)
    successor = checkpoints.successor(host.db, run_id)
    if successor is not None:
        going = _row(host, successor)
        if going["capacity"] and going["state"] in management.ACTIVE:
            # The node died while `successor` was admitted, maybe before its mark_started: had
            # the slot's TTL given it back to this run, ending this run here would leave it held
            # ("still paused") for good. Asked again (idempotent); continuation_marked decides.
            handle = SlotHandle.model_validate_json(going["capacity"])
            mark = MarkStarted(handle=handle, runner_id=going["runner_id"], pid=os.getpid())
            host.owe(mark, successor)
            return
        continued(host, run_id, successor)
        return
    report = steps.parked_report(host.db, row, "paused", host.clock())
    if report is not None:
        host.report_terminal(report)


def parked_deadline(host: PauseHost, run_id: str) -> float | None:
    """The deadline of paused run `run_id` (interrupt-paused, or waiting at a checkpoint with
    no live execution); None when it has none, or was decided, stopped or continued (or is
    being continued: that admission's end times it again, runs/launches.py)."""
    row = runstore.run_row(host.db, run_id)
    if row is None or row["state"] != "paused" or row["started_at"] is None:
        return None
    if checkpoints.pause_record(host.db, run_id) is None:
        return None
    if checkpoints.successor(host.db, run_id) or host.continuing(run_id):
        return None
    return None if row["deadline_at"] is None else float(row["deadline_at"])


def expire_parked(host: PauseHost, run_id: str) -> None:
    """R-RUN-2, R-TMO-7: a paused run's deadline (its absolute `deadline_at`) keeps counting
    while it holds no process, whether `pause` stopped it or it waits at a checkpoint a node
    restart left, and across node restarts (runs/restart.py times it again): once it passes,
    the run can never go on (R-TMO-8), so it fails as a live one would and its slot is
    reported free (its proof: no process). Nothing happens if it was decided, stopped or
    continued meanwhile."""
    if parked_deadline(host, run_id) is None:
        return
    row = _row(host, run_id)
    report = steps.expire_parked(host, row)
    if report is not None:
        host.report_terminal(report)
    host.track(row["session_id"], run_id, "failed")
    host.parked_ended(run_id, "failed", str(row["output"]))


def continuation_marked(host: PauseHost, run_id: str, outcome: Message | SubagentsError) -> bool:
    """The answer to a recovered continuation's mark_started (recover_parked). Taken: the
    source is over, unless its continuation has already failed (then the source stays paused,
    resumable; the slot is the continuation's, freed by its end). Refused: the slot went back
    to the source, which stays paused with it, and the continuation fails as a launch whose
    mark_started is refused fails (R-ADM-5). False when `run_id` is no paused run's
    continuation: the answer is then an adopted run's (runs/restart.py)."""
    row = runstore.run_row(host.db, run_id)
    source = (
        runstore.run_row(host.db, row["source_run_id"]) if row and row["source_run_id"] else None
    )
    if row is None or source is None or source["state"] != "paused":
        return False
    if not isinstance(outcome, SubagentsError):
        if row["state"] not in ("failed", "stopped"):
            continued(host, str(source["run_id"]), run_id)
        return True
    live = host.live_run(run_id)
    if live is not None and live.stop_state is None:
        reason = f"Its capacity slot went back to run {source['run_id']}: {outcome.message}"
        host.stop_live(live, "failed", reason)
    return True
