"""Settlement: what the capacity ledger is told when a run ends (R-RUN-5, R-CAP-21/22).

Owns the run-level process-terminal proof (observed only when every child's process tree was
seen to end; not-started when no child process ever existed) and the workflow report, whose
children verdict keeps a workflow's slot until every background child has proof. It decides
nothing about releasing: the ledger applies its verdict to these reports.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from subagents_node.actors.runs import runstore
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.messages import statefiles
from subagents_node.messages.capacity import (
    SETTLED_PROOFS,
    ReportedState,
    ReportTerminal,
    RunnerProof,
    SlotHandle,
)
from subagents_node.messages.supervisor import RunView

log = logging.getLogger(__name__)


def terminal_report(
    live: LiveRun,
    state: ReportedState,
    now: float,
    children_verdict: tuple[bool, str] = (False, ""),
) -> ReportTerminal:
    """The report for a run that just settled (children_verdict: workflows only)."""
    assert live.handle is not None
    proven, why = children_verdict
    return ReportTerminal(
        session_id=live.session_id,
        run_id=live.run_id,
        generation=live.handle.generation,
        state=state,
        live_process=False,
        workflow_children_proven=proven,
        reason=why,
        proof=RunnerProof.of_children(
            live.proofs, live.runner_id, live.runner_pid, now, live.error
        ),
    )


def workflow_rereport(
    row: sqlite3.Row, children_verdict: tuple[bool, str], proofs: list[str | None], now: float
) -> ReportTerminal:
    """R-CAP-22: a settled workflow's slot, re-judged once one of its children settled."""
    handle = SlotHandle.model_validate_json(row["capacity"])
    proven, why = children_verdict
    observed = all(p in SETTLED_PROOFS for p in proofs)
    return ReportTerminal(
        session_id=row["session_id"],
        run_id=row["run_id"],
        generation=handle.generation,
        state=row["state"],
        live_process=False,
        workflow_children_proven=proven,
        reason=why,
        proof=RunnerProof(
            state="observed" if observed else "unknown",
            runner_id=row["runner_id"],
            observed_at=now,
            reason="workflow host process tree observed to end",
        ),
    )


def write_summary(view: RunView) -> None:
    """`runs/<id>/summary.json`, for people and post-mortems (the store stays the truth)."""
    try:
        # A fresh temp file (messages/statefiles.py): a fixed `summary.tmp` that a child made
        # a symlink had the summary written through it, and the link renamed into place.
        path = Path(view.run_dir) / "summary.json"
        statefiles.replace_file(path, view.model_dump_json(indent=2).encode(), sync=False)
    except OSError as exc:
        log.warning("could not write the summary of run %s: %s", view.run_id, exc)


def proofs_of(db: sqlite3.Connection, run_id: str) -> list[str | None]:
    return runstore.proof_states(db, run_id)
