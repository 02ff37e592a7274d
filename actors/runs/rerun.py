"""Rerun (R-MISC-2's rerun contract) and the lineage a relaunch records about its source.

Owns two rules, not state:

- which relaunch a rerun admits: the source child's parameters with the new task, as a
  foreground single run, without the workflow-child linkage (`rerun_launch`);
- when a rerun supersedes its source: a live foreground run with one child is replaced by its
  rerun. The link (`superseded_by` on the source, `source_run_id`/`source_kind` on the rerun)
  are written in the same supervisor transaction as the rerun's record (`Lineage`, consumed by
  `RunSupervisor.record_and_start`); the source is stopped once that has committed, and a
  recovering node stops a linked source that still runs. So a crash at any step leaves either
  both runs as they were, or the link with the source stopped.

A finished source is never changed. It never stops a process itself: the supervisor's stop path
tells the source's shims.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from subagents_node.actors.records import Record, init_fields
from subagents_node.actors.runs.recovery import read_recovery
from subagents_node.messages.errors import BadRequest, RunNotResumable
from subagents_node.messages.lineage import Rerun
from subagents_node.messages.supervisor import Launch, SourceKind

ACTIVE = ("queued", "running", "paused")


class Lineage(Record):
    """Where an admitted run came from; recorded with the run itself."""

    __slots__ = ("kind", "source_run_id", "supersedes")
    source_run_id: str
    kind: SourceKind
    #: The source is live and this run replaces it (R-MISC-2): link it and stop it.
    supersedes: bool

    def __init__(self, source_run_id: str, kind: SourceKind, supersedes: bool = False) -> None:
        init_fields(self, source_run_id=source_run_id, kind=kind, supersedes=supersedes)


def superseded_reason(new_run_id: str) -> str:
    return f"Superseded by rerun {new_run_id}."


def rerun_lineage(row: sqlite3.Row) -> Lineage:
    """A rerun of a live run supersedes it; a rerun of a finished one only names it."""
    return Lineage(str(row["run_id"]), "rerun", supersedes=str(row["state"]) in ACTIVE)


def _check_rerunnable(row: sqlite3.Row, children: int) -> None:
    run_id, state = str(row["run_id"]), str(row["state"])
    if state not in ACTIVE:
        return
    if row["background"]:
        raise RunNotResumable(
            f"Run '{run_id}' is still {state}; rerun needs a finished run or a live "
            "foreground child.",
            run_id=run_id,
            reason=state,
        )
    if row["superseded_by"]:
        raise RunNotResumable(
            f"Run '{run_id}' was already superseded by rerun {row['superseded_by']}.",
            run_id=run_id,
            reason="superseded",
        )
    if children != 1:
        raise RunNotResumable(
            f"Run '{run_id}' is still {state} with {children} children; only a live foreground "
            "run with one child can be rerun (wait for it to finish to rerun one of them).",
            run_id=run_id,
            reason=state,
        )


def rerun_launch(row: sqlite3.Row, request: Rerun) -> Launch:
    """R-MISC-2's rerun contract: the same parameters, a new task, in the foreground."""
    run_id = str(row["run_id"])
    launch, _ = read_recovery(Path(row["run_dir"]), run_id)
    if launch.mode == "workflow":
        raise RunNotResumable(
            f"Run '{run_id}' is a workflow; run its script again instead.",
            run_id=run_id,
            reason="workflow",
        )
    items = launch.items or [i for step in launch.chain for i in step.items]
    _check_rerunnable(row, len(items))
    if request.child >= len(items):
        raise BadRequest(
            f"run '{run_id}' has {len(items)} {'child' if len(items) == 1 else 'children'}; "
            f"there is no child {request.child}",
            reason="child",
        )
    item = items[request.child].model_copy(update={"task": request.task})
    return launch.model_copy(
        update={
            "mode": "single",
            "env": request.env,
            "items": [item],
            "chain": [],
            "background": False,
            "parent_run_id": None,
            "workflow_key": None,
            "fanout_admitted": False,
            "workflow_token": None,
            "foreground_pid": request.foreground_pid,  # the rerunning command follows it
        }
    )


def link_superseded(db: sqlite3.Connection, source_run_id: str, new_run_id: str) -> None:
    """`supersededByRunId` on the source (the rerun's `source_run_id` is its own row's)."""
    db.execute("UPDATE runs SET superseded_by=? WHERE run_id=?", (new_run_id, source_run_id))
