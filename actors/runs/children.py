"""A run's children as the RunSupervisor drives them: which start when, and what the shims'
reports change.

Owns the moves between admission and settlement: `advance` starts what may start now (groups in
order, a parallel run under its concurrency cap, a chain step only once the previous one ended,
an `expand` or `checkpoint` step opened through steps.py) and hands a run with nothing running
and nothing left to start to `finish`; `child_report` applies a shim's report (refused while
the child's row cannot be read, so the shim resends it once it is repaired) and each started or
exited child is written to its run's row, its events and its live run. It never kills a process
(a shim ends its tree when the keeper tells it), never writes the `children` rows itself (the
ChildKeeper does), never settles a run (the host's `finish` does: runs/settle.py) and never
blocks on another owner: a shim is forked only after the transaction that ordered it commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ParamSpec, Protocol

from subagents_node.actors.child import rows as child_rows
from subagents_node.actors.child.keeper import ChildKeeper
from subagents_node.actors.inbox import Tick
from subagents_node.actors.runs import child_launch, runplan, runstore, steps
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.ticks import Advance, ShimNotLaunched
from subagents_node.messages.base import Ack, Message
from subagents_node.messages.constants import WORKFLOW_RESULT_FILE
from subagents_node.messages.errors import RecordQuarantined, SubagentsError
from subagents_node.messages.runs import ChildEvent, ChildExited, ChildReport, ChildStarted
from subagents_node.messages.supervisor import Launch

log = logging.getLogger(__name__)

P = ParamSpec("P")


class ChildHost(steps.StepHost, Protocol):
    """What the children's moves need from the RunSupervisor, beyond the StepHost's."""

    @property
    def keeper(self) -> ChildKeeper: ...

    @property
    def node_address(self) -> str:
        """Where a child (a workflow's host, a nested launch) reaches this node."""

    @property
    def faults(self) -> bool:
        """A node started with faults (tests): its crash points are live."""

    def live_run(self, run_id: str) -> LiveRun | None: ...

    def after_commit(self, effect: Callable[[], None]) -> None: ...

    def to_self(self, make: Callable[P, Tick]) -> Callable[P, None]:
        """A callback (run on another thread) that delivers the tick `make` builds to us."""

    def finish(self, live: LiveRun) -> None:
        """Nothing runs and nothing may start: settle the run (runs/settle.py)."""

    def answer_launches(self, live: LiveRun) -> None:
        """Answer the launches waiting for the run's first children, once they all run."""


def advance(host: ChildHost, live: LiveRun) -> None:
    """Start what may start now; settle the run when nothing runs and nothing may start."""
    if live.attached is not None and live.stop_state is None:
        return  # R-RES-6: step 0 is a live run; nothing starts before it ends
    launch = live.launch
    may_start = (
        launch is not None
        and live.stop_state is None
        and (not live.failed or launch.mode == "parallel")  # a failed chain step ends it
    )
    if live.waiting and live.stop_state is None:
        return  # an expansion's claim is out, or a checkpoint waits for its decision
    if may_start:
        assert launch is not None
        # `while`: an attached chain's step 0 (R-RES-6) is a group with no child.
        while not live.queue and not live.running and live.next_group < len(live.groups):
            if live.next_group in live.dynamic:
                if steps.open_dynamic(host, live, live.next_group):
                    return
                if live.failed:
                    advance(host, live)
                    return
            live.queue.extend(live.groups[live.next_group])
            live.next_group += 1
        # Parallel runs honour the concurrency cap; a chain's parallel step starts at once.
        limit = launch.concurrency if launch.mode == "parallel" else max(1, len(live.queue))
        while live.queue and len(live.running) < limit:
            _start_child(host, live, launch, live.queue.popleft())
    nothing_left = (
        not live.queue and live.next_group >= len(live.groups) and not live.pending_appends
    )
    if not live.running and (not may_start or nothing_left):
        host.finish(live)


def take_up(host: ChildHost, live: LiveRun) -> None:
    """After a full disk undid a group (RunSupervisor.group_undone): the children it had
    started in memory are `pending` again in the store and their shims, forked only after a
    commit, never were: start them again, or the run waits for good on children that do not
    exist; those it had settled are waited for again. Then advance (a run whose settlement
    was undone settles again, from what its children's rows say)."""
    # Settled in memory only: the run waits for it again (its shim resends its report).
    for child_id, idx in host.db.execute(
        "SELECT child_id, idx FROM run_children WHERE run_id=? AND state='running'",
        (live.run_id,),
    ):
        live.running.setdefault(child_id, idx)
    plans = {plan.index: plan for group in live.groups for plan in group}
    for child_id in sorted(live.unstarted):
        idx = live.running.get(child_id)
        row = host.db.execute(
            "SELECT state FROM run_children WHERE run_id=? AND idx=?", (live.run_id, idx)
        ).fetchone()
        if live.launch is None or row is None or row[0] != "pending" or idx not in plans:
            continue  # started in a group that committed (its shim will report), or gone
        del live.running[child_id]
        live.unstarted.discard(child_id)
        _start_child(host, live, live.launch, plans[idx])
    advance(host, live)


def _start_child(host: ChildHost, live: LiveRun, launch: Launch, child: runplan.ChildPlan) -> None:
    token = None
    if launch.mode == "workflow":
        row = runstore.run_row(host.db, live.run_id)
        token = str(row["workflow_token"]) if row is not None else None
    address = host.node_address
    try:
        spec = child_launch.child_spec(live, launch, child, address, token)
    except SubagentsError as err:
        # Admission checked the command and cwd; one that vanished since fails this child
        # (no process ever existed: not-started) instead of the supervisor.
        _child_not_started(host, live, child, err.message)
        return
    host.keeper.order(host.db, spec, host.clock())
    not_launched = host.to_self(ShimNotLaunched)
    keeper = host.keeper

    crash_point = host.crash_point

    def fork_shim() -> None:
        crash_point("fork_shim")
        error = keeper.launch(spec, live.ends_with)
        if error is not None:
            not_launched(spec.child_id, error)
            return
        crash_point("shim_launched")  # its child runs: the slot's mark_started is not sent yet

    host.after_commit(fork_shim)
    live.running[spec.child_id] = child.index
    live.unstarted.add(spec.child_id)
    runstore.update_child(
        host.db,
        live.run_id,
        child.index,
        state="running",
        stdout_path=spec.stdout_path,
        stderr_path=spec.stderr_path,
    )


def _child_not_started(
    host: ChildHost, live: LiveRun, child: runplan.ChildPlan, error: str
) -> None:
    now = host.clock()
    runstore.update_child(
        host.db,
        live.run_id,
        child.index,
        state="failed",
        ended_at=now,
        error=error,
        proof_state="not-started",
    )
    host.record_event(live.run_id, "child.exited", {"child": child.index, "state": "failed"})
    live.proofs.append("not-started")
    live.failed = True
    live.error = live.error or error
    advance = host.to_self(Advance)
    host.after_commit(lambda: advance(live.run_id))


def child_report(host: ChildHost, report: ChildReport) -> Message:
    """A shim's report: applied, committed, then acknowledged (the group commit's rule), so
    an acknowledged report is never lost; a resent one changes nothing. A report about a
    child whose row cannot be read is refused (the shim keeps it and resends it), so it
    is applied once the row is repaired."""
    host.crash_point(f"report_{report.kind}_received")
    row, problem = child_rows.read_checked(host.db, report.child_id)
    if problem is not None:
        raise RecordQuarantined.of(runstore.OWNER, child_rows.TABLE, report.child_id, problem)
    apply_events(host, host.keeper.apply(host.db, report, host.clock(), row=row))
    if host.faults:  # committed, not yet acknowledged: the shim must resend it
        crash_point, point = host.crash_point, f"report_{report.kind}_committed"
        host.after_commit(lambda: crash_point(point))
    return Ack()


def apply_events(host: ChildHost, events: list[ChildEvent]) -> None:
    for event in events:
        apply_event(host, event)


def _child_index(host: ChildHost, event: ChildStarted | ChildExited) -> tuple[str, int] | None:
    """(run id, index) of the event's child: from its live run when it is running there
    (no statement per event), else from the store (a run recovered after a restart)."""
    live = host.live_run(event.run_id)
    if live is not None and (idx := live.running.get(event.child_id)) is not None:
        return event.run_id, idx
    row = host.db.execute(
        "SELECT run_id, idx FROM run_children WHERE child_id=?", (event.child_id,)
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def apply_event(host: ChildHost, event: ChildStarted | ChildExited) -> None:
    found = _child_index(host, event)
    if found is None:
        log.warning("event for unknown child %s", event.child_id)
        return
    run_id, idx = found
    if isinstance(event, ChildStarted):
        runstore.update_child(
            host.db, run_id, idx, pid=event.pid, started_at=event.started_at, state="running"
        )
        host.record_event(run_id, "child.started", {"child": idx, "pid": event.pid})
        started = host.live_run(run_id)
        if started is not None:
            started.unstarted.discard(event.child_id)
            host.answer_launches(started)
        return
    live = host.live_run(run_id)
    state, error = event.state, event.error
    if live is not None and _workflow_without_result(live, state):
        state, error = "failed", NO_WORKFLOW_RESULT
    runstore.update_child(
        host.db,
        run_id,
        idx,
        state=state,
        exit_code=event.exit_code,
        signal=event.proof.signal,
        started_at=event.started_at,
        ended_at=event.ended_at,
        error=error or "",
        output=event.output,
        proof_state=event.proof.state,
    )
    host.record_event(
        run_id,
        "child.exited",
        {"child": idx, "state": state, "exit_code": event.exit_code},
    )
    if live is None:
        return
    live.running.pop(event.child_id, None)
    live.unstarted.discard(event.child_id)
    host.answer_launches(live)
    live.outputs[idx] = event.output
    live.proofs.append(event.proof.state)
    if event.node_gone and live.stop_state is None:  # as if its command had stopped it
        live.stop_state = "stopped"
    if state != "complete" and live.stop_state is None:
        live.failed = True
        live.error = live.error or (error or f"child {live.labels.get(idx)} failed")
    advance(host, live)


#: A workflow host that exited 0 without its result file: the script ended the process
#: (`os._exit`) before main(runs) returned, so nothing says what it did (R-RUN-7).
NO_WORKFLOW_RESULT = (
    "The workflow host exited without writing its result: the script ended the process "
    "before main(runs) returned."
)


def _workflow_without_result(live: LiveRun, state: str) -> bool:
    return (
        live.mode == "workflow"
        and state == "complete"
        and not (live.run_dir / WORKFLOW_RESULT_FILE).exists()
    )
