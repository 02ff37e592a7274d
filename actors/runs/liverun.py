"""LiveRun: what the RunSupervisor keeps in memory about one run that is still going.

It holds the run's plan, its queue, its running children and what its settlement needs (outputs,
proofs, the first error); nothing in it is the truth, the supervisor's tables are. The two
constructors are the two ways a run becomes live: `new_live_run` writes a newly admitted run's
rows (in the supervisor's transaction) and `adopt_from_store` rebuilds a run a restarted node
adopts (with no launch, so it starts no new children and settles once its running ones have).
"""

from __future__ import annotations

import os
import sqlite3
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from subagents_node.actors.child.procfs import ProcessIdentity
from subagents_node.actors.context import Cancel
from subagents_node.actors.owner import ReplyFn
from subagents_node.actors.runs import runplan, runstore
from subagents_node.messages.capacity import ReportedState, SlotHandle
from subagents_node.messages.fanout import ClaimPaths, FanoutDescriptor, encode_descriptor
from subagents_node.messages.supervisor import ChainStep, Launch, Snapshots


@dataclass
class LiveRun:
    run_id: str
    session_id: str
    runner_id: str
    run_dir: Path
    handle: SlotHandle | None
    launch: Launch | None  # None for runs recovered after a node restart: no new children
    descriptor: FanoutDescriptor | None
    groups: list[list[runplan.ChildPlan]] = field(default_factory=list)
    next_group: int = 0
    queue: deque[runplan.ChildPlan] = field(default_factory=deque)
    running: dict[str, int] = field(default_factory=dict)  # child id -> child index
    outputs: dict[int, str] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    error: str = ""
    failed: bool = False
    #: "stopped" (by request), "failed" (run deadline), "paused" (R-RUN-2 interrupt-as-pause)
    #: or "rejected" (a checkpoint was rejected)
    stop_state: str | None = None
    proofs: list[str] = field(default_factory=list)  # proof states of ended children
    settling: bool = False
    cancel_deadline: Cancel | None = None
    deadline_ms: int | None = None  # the run-level deadline (R-TMO-5), if it has one
    #: The pid mark_started recorded for the run's runner (this node). None for a run adopted
    #: after a restart: the node that started it is gone, so its proof names the runner by id.
    runner_pid: int | None = None
    parent_run_id: str | None = None
    mode: str = ""
    pending_appends: int = 0
    pending_steps: int = 0
    #: Children whose shim was ordered but has not reported their pid yet, and the launch
    #: replies that wait for them (a launch is answered once its first children run).
    unstarted: set[str] = field(default_factory=set)
    launch_replies: list[ReplyFn] = field(default_factory=list)
    #: The embedded node its children's shims are bound to (actors/runs/binding.py): they stop
    #: their trees if that process dies; None: they outlive the node. Decided again for a run
    #: adopted after a restart (actors/runs/rebinding.py).
    ends_with: ProcessIdentity | None = None
    #: The foreground command the run belongs to (its own, or its parent run's), kept in its
    #: row: what decides, on each node that runs it, whether it is bound to that node.
    foreground: ProcessIdentity | None = None
    #: R-RES-6: the live source run this chain's step 0 is, until it ends; then its output.
    attached: str | None = None
    attached_output: str = ""
    #: Expand and checkpoint steps not yet materialized or decided, by group (R-FAN-21,
    #: R-RUN-2); `expanding` while a step's batch claim is out, `checkpoint` while the run
    #: waits at one for a decision.
    dynamic: dict[int, ChainStep] = field(default_factory=dict)
    expanding: bool = False
    expansion: list[runplan.ChildPlan] = field(default_factory=list)
    #: The batch claim out for the expansion (under its own claim id: sent again, when its
    #: answer is lost with the fan-out owner, it is counted once), and how often it was resent.
    expand_claim: ClaimPaths | None = None
    expand_resends: int = 0
    checkpoint: int | None = None
    #: Intercom messages this run holds (runrequests.intercom), counted once from the store
    #: on the first one this process takes, then kept here.
    intercom_sent: int | None = None

    @property
    def waiting(self) -> bool:
        """At a checkpoint, or for an expansion's claim: nothing starts, nothing settles."""
        return self.expanding or self.checkpoint is not None

    def previous_outputs(self, step: int) -> list[str]:
        """What a chain step's `{previous}` (or an expand step's input) refers to: the outputs
        of the nearest earlier step that ran children, else a resumed chain's seed."""
        for earlier in range(step - 1, -1, -1):
            group = self.groups[earlier]
            if group:
                return [self.outputs.get(c.index, "") for c in group]
        if self.launch is not None and self.launch.attached_run_id:
            return [self.attached_output]  # R-RES-6: step 0 is the attached run
        seed = self.launch.seed_previous if self.launch is not None else None
        return [seed] if seed else []

    def absolute_step(self, group: int) -> int:
        """The chain index of group `group` as the chain was first launched (R-FAN-12)."""
        return group + (self.launch.chain_offset if self.launch is not None else 0)

    def output(self) -> str:
        """The run's output: the last child's, or every task's, labelled, for parallel runs."""
        if not self.outputs:
            return ""
        if self.launch is not None and self.launch.mode == "parallel":
            return "\n\n".join(
                f"[{self.labels.get(i, i)}]\n{out.strip()}"
                for i, out in sorted(self.outputs.items())
            )
        for group in reversed(self.groups):  # a chain: its last step that ran children
            ran = [c.index for c in group if c.index in self.outputs]
            if ran:
                return self.outputs[ran[-1]]
        return self.outputs[max(self.outputs)]

    def final_state(self) -> ReportedState:
        if self.stop_state == "stopped":
            return "stopped"
        if self.stop_state == "paused":
            return "paused"
        if self.stop_state == "rejected":
            return "rejected"
        if self.stop_state == "failed" or self.failed:
            return "failed"
        return "complete"


def adopt_from_store(db: sqlite3.Connection, run_id: str) -> tuple[LiveRun, sqlite3.Row]:
    """After a node restart: the LiveRun of an unsettled run, rebuilt from its rows.

    It starts no new children (no launch): children still pending are marked stopped and the run
    will fail once the running ones have settled.
    """
    row = runstore.run_row(db, run_id)
    assert row is not None
    handle = SlotHandle.model_validate_json(row["capacity"]) if row["capacity"] else None
    live = LiveRun(
        run_id=run_id,
        session_id=row["session_id"],
        runner_id=row["runner_id"],
        run_dir=Path(row["run_dir"]),
        handle=handle,
        launch=None,
        descriptor=None,
        parent_run_id=row["parent_run_id"],
        mode=row["mode"],
    )
    if row["foreground_pid"] is not None and row["foreground_start"] is not None:
        live.foreground = ProcessIdentity(row["foreground_pid"], row["foreground_start"])
    children = db.execute(
        "SELECT child_id, idx, label, state, output, proof_state, error FROM run_children "
        "WHERE run_id=?",
        (run_id,),
    ).fetchall()
    for child_id, idx, label, state, output, proof_state, error in children:
        live.labels[idx] = label
        if state == "running":
            live.running[child_id] = idx
        elif state == "pending":
            runstore.update_child(
                db,
                run_id,
                idx,
                state="stopped",
                error="The node restarted before this child started.",
            )
            live.failed = True
            live.error = live.error or "The node restarted before every child started."
        else:
            # Settled before the restart (its settlement committed, the run's not yet): it
            # counts as it ended, for the run's state and for the proof of its slot.
            live.outputs[idx] = output
            if proof_state:
                live.proofs.append(proof_state)
            if state not in ("complete", "stopped"):
                live.failed = True
                live.error = live.error or error or f"child {label} failed"
    return live, row


def new_live_run(
    db: sqlite3.Connection,
    launch: Launch,
    run_id: str,
    runner_id: str,
    descriptor: FanoutDescriptor,
    handle: SlotHandle | None,
    snapshots: Snapshots,
    source_run_id: str | None,
    *,
    run_dir: Path,
    now: float,
    workflow_token: str,
    foreground: ProcessIdentity | None = None,
) -> LiveRun:
    """Write an admitted run and its pending children (one savepoint); its LiveRun."""
    groups = runplan.plan_children(launch)
    deadline_ms = runplan.run_deadline_ms(launch)
    first = next(c for group in groups for c in group).item.agent.name
    db.execute("SAVEPOINT record_run")
    runstore.insert_run(
        db,
        {
            "run_id": run_id,
            "session_id": launch.session_id,
            "mode": launch.mode,
            "background": int(launch.background),
            "state": "running",
            "label": first if launch.mode == "single" else f"{launch.mode}: {first}",
            "depth": launch.depth,
            "parent_run_id": launch.parent_run_id,
            "root_run_id": descriptor.root_run_id,
            "run_dir": str(run_dir),
            "created_at": now,
            "started_at": now,
            "deadline_at": runplan.deadline_at(launch, now),
            "runner_id": runner_id,
            "fanout": encode_descriptor(descriptor),
            "capacity": handle.model_dump_json() if handle else None,
            "snapshots": snapshots,
            "source_run_id": source_run_id,
            "workflow_key": launch.workflow_key,
            "workflow_token": workflow_token if launch.mode == "workflow" else None,
            "intercom": launch.intercom,
            "foreground_pid": None if foreground is None else foreground.pid,
            "foreground_start": None if foreground is None else foreground.start_time,
        },
    )
    for child in (c for group in groups for c in group):
        runstore.insert_child(
            db,
            {
                "run_id": run_id,
                "idx": child.index,
                "child_id": f"{run_id}-{child.index}",
                "step": child.step,
                "label": child.label,
                "agent": child.item.agent.name,
                "state": "pending",
            },
        )
    db.execute("RELEASE record_run")
    return LiveRun(
        run_id=run_id,
        session_id=launch.session_id,
        runner_id=runner_id,
        run_dir=run_dir,
        handle=handle,
        launch=launch,
        descriptor=descriptor,
        groups=groups,
        labels={c.index: c.label for g in groups for c in g},
        deadline_ms=deadline_ms,
        dynamic=runplan.dynamic_steps(launch),
        runner_pid=os.getpid(),
        parent_run_id=launch.parent_run_id,
        mode=launch.mode,
        foreground=foreground,
    )
