"""Attach as chain root (SPEC R-RES-6): a live background run becomes step 0 of a new chain.

Owns the rules, not the state. `attach_launch` turns `runs.resume` with `attach` steps into the
new chain's launch: a background chain of the attaching process in the source's session, cwd and
limits, whose step 0 is the source (`attached_run_id`) and whose own steps are chain[1],
chain[2], ... It is admitted like any launch: top-level, it **acquires** its own `runner` slot
(the source keeps its own); asked from inside a run (the caller's depth and route) it is nested
and takes no slot (R-TOP-1, R-TOP-7), and its route is charged one path (`attach[RUN]`: each
attach opens a new budget, so uncharged a child could open them without bound). Either way it
gets a **new** fan-out budget with its own static claims (R-FAN-10, A-12), and every admission
failure rolls the new slot back (R-ADM-2/3); nothing of the source changes.

The chain waits for its source: `wait_for` (when the chain is recorded) and `source_ended`
(when the source settles) hand it the source's output as its first step's `{previous}`, or fail
it when the source did not complete. A node restart while the chain waits fails it, as it fails
every run whose children had not started (liverun.adopt_from_store), and frees its slot.
It starts nothing itself and never stops the source.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.recovery import read_recovery
from subagents_node.messages.errors import RunNotResumable
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import Launch

ACTIVE = ("queued", "running", "paused")


def attach_launch(row: sqlite3.Row, request: Resume) -> Launch:
    """R-RES-1/6: only a live background run is attached; the new chain's launch."""
    run_id, state = str(row["run_id"]), str(row["state"])
    if state not in ACTIVE:
        raise RunNotResumable(
            f"Run '{run_id}' is {state}; only a live background run can be attached as a chain "
            "root. Resume it, or start a chain, instead.",
            run_id=run_id,
            reason=state,
        )
    if not row["background"]:
        raise RunNotResumable(
            f"Run '{run_id}' runs in the foreground; only a live background run can be "
            "attached as a chain root.",
            run_id=run_id,
            reason="foreground",
        )
    if request.workflow_key is not None or request.message:
        raise RunNotResumable(
            f"Run '{run_id}' cannot be attached with a message or as a workflow's resume item.",
            run_id=run_id,
            reason="attach",
        )
    source, _ = read_recovery(Path(row["run_dir"]), run_id)
    return source.model_copy(
        update={
            "mode": "chain",
            "background": True,
            "items": [],
            "chain": list(request.attach),
            "timeout_ms": None,  # the source's own deadline is its own
            "env": request.env,
            "depth": request.depth,
            "capacity_limit": request.capacity_limit,
            # A launch of the attaching process (R-RES-6): top-level, with a slot of its own,
            # unless that process is a run's child: its route makes the chain nested, with no
            # slot (R-TOP-1, R-TOP-7); it is charged one path, the budget is new (R-FAN-10).
            "inherited_fanout": request.inherited_fanout,
            "parent_run_id": None,
            "workflow_key": None,
            "fanout_admitted": False,
            "workflow_token": None,
            "attached_run_id": run_id,
        }
    )


def wait_for(chain: LiveRun, source: LiveRun | None, row: sqlite3.Row | None) -> None:
    """When the chain is recorded: wait for a source still going, else take its end now (it
    may have settled while the chain was admitted)."""
    if source is not None and not source.settling:
        chain.attached = source.run_id
    elif row is not None and str(row["state"]) in ACTIVE:
        chain.attached = str(row["run_id"])  # settling now: `source_ended` follows
    elif row is not None:
        _take_end(chain, str(row["run_id"]), str(row["state"]), str(row["output"]))


def source_ended(lives: Iterable[LiveRun], run_id: str, state: str, output: str) -> list[str]:
    """The source `run_id` settled: the chains attached to it may go on. Their run ids."""
    woken: list[str] = []
    for chain in lives:
        if chain.attached == run_id:
            chain.attached = None
            _take_end(chain, run_id, state, output)
            woken.append(chain.run_id)
    return woken


def _take_end(chain: LiveRun, run_id: str, state: str, output: str) -> None:
    chain.attached_output = output
    if state != "complete":  # a failed chain step ends the chain, step 0 included
        chain.failed = True
        chain.error = chain.error or f"Attached run {run_id} (chain step 0) ended {state}."
