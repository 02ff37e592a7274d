"""Relaunch: what a resume of a finished or paused run launches, and what it reuses
(SPEC §10: R-RES-1..4, R-RES-7, R-TMO-8; a workflow's `resume` item, R-WF-5, R-FAN-10).

Owns the rules, not the state: from the source's row and its recovery descriptor it builds the
relaunch (`resume_launch`, `as_resume` for a paused run's continuation) and the ResumePlan that
admission follows (the budget reused, whether a slot moves). Whether the caller is top-level or
nested (R-TOP-1) is the request's: its depth and route go into the relaunch as they are. It
never admits, writes a row or asks an owner anything (the RunSupervisor does).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from subagents_node.actors.runs import runstore
from subagents_node.actors.runs.admission import ResumePlan
from subagents_node.actors.runs.recovery import read_recovery
from subagents_node.messages.domains import MAX_TASK_CHARS
from subagents_node.messages.errors import RunNotResumable
from subagents_node.messages.fanout import (
    FanoutDescriptor,
    decode_descriptor,
    encode_descriptor,
    extend,
)
from subagents_node.messages.lineage import Resume
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import Launch, TaskItem


def _with_message(run_id: str, item: TaskItem, message: str) -> TaskItem:
    """The item's task with the resume's follow-up. Refused past the task cap: model_copy does
    not validate, so the relaunch would run an over-long task and persist a recovery.json that
    no later resume or rerun could read (it is validated on read)."""
    if not message:
        return item
    task = f"{item.task}\n\n{message}"
    if len(task) > MAX_TASK_CHARS:
        raise RunNotResumable(
            f"Run '{run_id}' cannot be resumed with this message: its task and the message "
            f"come to {len(task)} characters, over the {MAX_TASK_CHARS}-character task limit.",
            run_id=run_id,
            reason="task_too_long",
        )
    return item.model_copy(update={"task": task})


def with_follow_up(run_id: str, launch: Launch, message: str) -> Launch:
    """`launch` with the resume's follow-up appended to its first task: every item of a single
    or parallel launch, the first step's items of a chain (for a paused run's continuation,
    the step it goes on from)."""
    if not message:
        return launch
    if launch.items:
        return launch.model_copy(
            update={"items": [_with_message(run_id, i, message) for i in launch.items]}
        )
    if not launch.chain or not launch.chain[0].items:
        return launch
    head = launch.chain[0]
    items = [_with_message(run_id, i, message) for i in head.items]
    return launch.model_copy(
        update={"chain": [head.model_copy(update={"items": items}), *launch.chain[1:]]}
    )


def workflow_route(db: sqlite3.Connection, request: Resume) -> FanoutDescriptor | None:
    """R-FAN-10: the descriptor a workflow's `resume` item runs under, the workflow's own
    extended by `workflow[key]` (R-FAN-12), whatever tree its source ran in. None for any
    other resume, or when there is no such workflow (the token check refuses it, R-FAN-24)."""
    if request.workflow_key is None or request.parent_run_id is None:
        return None
    parent = runstore.run_row(db, request.parent_run_id)
    if parent is None or parent["mode"] != "workflow" or not parent["fanout"]:
        return None
    return extend(decode_descriptor(parent["fanout"]), f"workflow[{request.workflow_key}]")


def resume_launch(
    row: sqlite3.Row, request: Resume, route: FanoutDescriptor | None = None
) -> tuple[Launch, ResumePlan]:
    """R-RES-1..4: the relaunch of a finished run and what it reuses.

    A workflow resumes as a new workflow run of the same script (its host reuses the source's
    finished steps, R-WF-5); a workflow's `resume` item relaunches a child under that workflow
    (no capacity, R-RES-3; its source's claim, R-FAN-23; the workflow's `route`, R-FAN-10),
    awaited when it is a foreground one.
    """
    run_id, state = str(row["run_id"]), str(row["state"])
    as_child = request.workflow_key is not None
    if state not in TERMINAL_RUN_STATES:  # queued, running (paused ones continue: pauses.py)
        raise RunNotResumable(
            f"Run '{run_id}' is still {state}; it cannot be resumed while it runs.",
            run_id=run_id,
            reason=state,
        )
    if state == "stopped":
        raise RunNotResumable(
            f"Run '{run_id}' was stopped and cannot be resumed. Start a new run instead.",
            run_id=run_id,
            reason="stopped",
        )
    if not row["background"] and not as_child and row["mode"] != "workflow":
        # Our choice for R-RES-3's foreground source: a resume is a background relaunch, so a
        # foreground run (whose caller saw it end) is rerun, not resumed. A workflow's own
        # children (foreground by default) and a workflow itself are resumed.
        raise RunNotResumable(
            f"Run '{run_id}' ran in the foreground; only background runs can be resumed. "
            f"Use `rerun {run_id} --task TASK` to run it again.",
            run_id=run_id,
            reason="foreground",
        )
    launch, descriptor = read_recovery(Path(row["run_dir"]), run_id)
    if as_child and route is not None:
        descriptor = route  # nested launches of the relaunched child charge this tree
    if launch.mode == "workflow":
        # A fresh `workflow` slot (R-TOP-4): a transfer hands over a `runner` one (R-CAP-19).
        plan = ResumePlan(source_run_id=run_id, descriptor=descriptor, transfer=False)
        return _workflow_relaunch(run_id, launch, request), plan
    update: dict[str, object] = {
        "env": request.env,
        "background": request.background if as_child else True,
        "depth": request.depth,
        "capacity_limit": request.capacity_limit,
        # The resuming process's route: none makes a top-level resume (R-TOP-1, R-RES-3), one
        # a nested resume that takes no capacity; either way the budget is the recovery
        # descriptor's (R-RES-4). A workflow's resume item's route is its workflow's (R-FAN-10).
        "inherited_fanout": (
            encode_descriptor(descriptor) if as_child else request.inherited_fanout
        ),
        "parent_run_id": request.parent_run_id if as_child else None,
        "workflow_key": request.workflow_key,
        # A workflow's resume item reuses its source's claim: nothing is claimed (R-FAN-23).
        "fanout_admitted": as_child,
        "workflow_token": request.workflow_token if as_child else None,
    }
    if request.intercom is not None:  # R-RES-7: the call's setting, else the persisted one
        update["intercom"] = request.intercom
    relaunch = with_follow_up(run_id, launch.model_copy(update=update), request.message)
    # Only a top-level relaunch takes capacity (admission's capacity_eligible): a nested one
    # neither transfers nor acquires, whatever this says.
    plan = ResumePlan(
        source_run_id=run_id,
        descriptor=descriptor,
        transfer=row["capacity"] is not None and not as_child,
    )
    return relaunch, plan


def as_resume(
    launch: Launch,
    env: dict[str, str] | None,
    depth: int,
    capacity_limit: int,
    route: str | None = None,
) -> Launch:
    """A relaunch as a background launch of the resuming process (R-RES-3): top-level unless
    that process has a nested-run `route` or a depth (R-TOP-1). Its budget comes from the
    recovery descriptor (R-RES-4), never from the route."""
    return launch.model_copy(
        update={
            "env": env,
            "background": True,
            "depth": depth,
            "capacity_limit": capacity_limit,
            "inherited_fanout": route,
            "parent_run_id": None,
            "workflow_key": None,
            "fanout_admitted": False,
            "workflow_token": None,
        }
    )


def _workflow_relaunch(run_id: str, launch: Launch, request: Resume) -> Launch:
    """R-WF-5 resume: the same script under the same budget; the new host learns its source
    from its run (`source_run_id`) and reuses what the source's children finished."""
    # Its host reads the intercom setting from its own arguments, fixed at the launch.
    if request.message or request.workflow_key is not None or request.intercom is not None:
        raise RunNotResumable(
            f"Run '{run_id}' is a workflow: it resumes as a whole, with no message, with its "
            "own intercom setting and not as a workflow's resume item.",
            run_id=run_id,
            reason="workflow",
        )
    return launch.model_copy(
        update={
            "env": request.env,
            "background": True,
            "depth": request.depth,
            "capacity_limit": request.capacity_limit,
            # R-RES-4: the recovery descriptor's budget; the caller's route only makes the
            # resume nested (no `workflow` slot, R-TOP-1/4).
            "inherited_fanout": request.inherited_fanout,
            "parent_run_id": None,
        }
    )
