"""`debug-run`: a run's lifecycle and capacity verdict, for people (R-DBG-1..3, R-STS-1).

Owns only formatting. It asks the supervisor for the run and the capacity ledger for the
slot that records it (`inspect`, which runs the release verdict), and prints what decides
whether the run still holds capacity. It never prints task text, environment values or child
output (R-DBG-3): only ids, states, paths, proofs and reasons. The --json details are built
field by field for the same reason (never a whole RunView, which carries output and errors).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from subagents_node.cli.common import lineage
from subagents_node.cli.tables import pause_text
from subagents_node.cli.terminal import one_line
from subagents_node.client.client import Client
from subagents_node.messages.capacity import CapacitySnapshot, Inspection, RunnerProof
from subagents_node.messages.session import SpawnSnapshot
from subagents_node.messages.supervisor import RunView


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _proof_state(run: RunView) -> str:
    """The run's process-terminal state (R-RUN-5): pending while it runs, then exactly what
    the supervisor's settlement reported to the capacity ledger."""
    if run.state in ("queued", "running", "paused"):
        return "pending"
    proofs = [c.proof_state for c in run.children if c.proof_state]
    return RunnerProof.of_children(proofs, run.runner_id, None, 0.0, "").state


def _run_proof(run: RunView) -> str:
    runner = f" · runner {run.runner_id}" if run.runner_id else ""
    return f"{_proof_state(run)}{runner}"


#: Errors the node writes itself; anything else (a child's stderr tail) may hold secrets.
_OWN_ERRORS = re.compile(
    r"Subagent timed out after \d+ ms\."
    r"|Run timed out after \d+ ms\."
    r"|External CLI exited with code -?\d+\."
    r"|External CLI was terminated by signal \d+\."
    r"|Stopped by request\."
    r"|The node restarted before (this child|every child) started\."
)


def _own_error(error: str) -> str:
    """The error only when it is, exactly, one the node writes itself (no child text)."""
    first = error.strip().splitlines()[0] if error.strip() else ""
    if _OWN_ERRORS.fullmatch(first):
        return first
    return "the child reported an error (see `subagents-node show` or its stderr log)"


def render(
    run: RunView, inspection: Inspection, spawn: SpawnSnapshot, capacity_line: str
) -> list[str]:
    lines = [
        "Debug run",
        spawn.text(),
        capacity_line,
        "Run lifecycle debug",
        f"run: {run.run_id}",
        *([f"host: {run.host}"] if run.host else []),
        f"dir: {run.run_dir}",
        f"status: store (runs table); summary file {run.run_dir}/summary.json",
        f"events file: {run.run_dir}/events.jsonl",
        f"session: {run.session_id}",
        f"state: {run.state}",
        f"mode: {run.mode}{' (background)' if run.background else ' (foreground)'}",
        f"parent run: {run.parent_run_id or '-'} · depth {run.depth} · root {run.root_run_id}",
    ]
    if run.workflow_key:
        lines.append(f"workflow key: {run.workflow_key}")
    lines += lineage(run)
    if pause_text(run):
        lines.append(pause_text(run))
    lines += [
        f"Status process terminal: {_run_proof(run)}",
        f"started: {_when(run.started_at)} · ended: {_when(run.ended_at)}",
    ]
    if run.error:
        lines.append(f"error: {one_line(_own_error(run.error))}")
    verdict = inspection.verdict
    lines.append(f"Active capacity: {verdict.verdict} — {verdict.reason}")
    owner = inspection.owner
    if owner is not None:
        lines += [
            f"Capacity owner: {inspection.relation} slot {owner.slot}, {owner.kind}, "
            f"generation {owner.generation}",
            f"  owner session: {owner.session_id}",
            f"  source run: {owner.source_run_id or '-'}",
            f"  async dir: {owner.async_dir or '-'}",
            f"  runner: {owner.runner_id or '-'} started {_when(owner.runner_started_at)}",
        ]
    lines.append("Children:")
    for child in run.children:
        code = "-" if child.exit_code is None else str(child.exit_code)
        lines.append(
            f"  {child.label} · {child.agent} · {child.state} · async "
            f"{'yes' if run.background else 'no'} · pid {child.pid or '-'} · exit {code} · "
            f"proof {child.proof_state or 'pending'}"
        )
    return lines


def details(
    run: RunView, inspection: Inspection, spawn: SpawnSnapshot, capacity: CapacitySnapshot
) -> dict[str, Any]:
    """R-STS-1 / R-DBG-3 details: the header snapshots, the proof and the verdict, by field."""
    owner = inspection.owner
    return {
        "run_id": run.run_id,
        "host": run.host,
        "session_id": run.session_id,
        "state": run.state,
        "mode": run.mode,
        "background": run.background,
        "parent_run_id": run.parent_run_id,
        "source_run_id": run.source_run_id,
        "source_kind": run.source_kind,
        "superseded_by": run.superseded_by,
        "paused": run.paused,
        "paused_step": run.paused_step,
        "resumed_by": run.resumed_by,
        "run_dir": run.run_dir,
        "spawn_budget": spawn.model_dump(mode="json"),
        "active_async_capacity": capacity.model_dump(mode="json"),
        "lifecycle_status": {
            "process_terminal": {"state": _proof_state(run), "runner_id": run.runner_id}
        },
        "capacity": {
            "relation": inspection.relation,
            "verdict": inspection.verdict.verdict,
            "reason": inspection.verdict.reason,
            "owner": None
            if owner is None
            else {
                "slot": owner.slot,
                "kind": owner.kind,
                "generation": owner.generation,
                "run_id": owner.run_id,
                "session_id": owner.session_id,
                "source_run_id": owner.source_run_id,
                "async_dir": owner.async_dir,
                "runner_id": owner.runner_id,
                "runner_started_at": owner.runner_started_at,
            },
        },
        "children": [
            {
                "label": c.label,
                "agent": c.agent,
                "state": c.state,
                "pid": c.pid,
                "exit_code": c.exit_code,
                "proof_state": c.proof_state,
            }
            for c in run.children
        ],
    }


@dataclass(frozen=True)
class DebugReport:
    lines: list[str]
    details: dict[str, Any]


def debug_run(client: Client, run_id: str, capacity_limit: int) -> DebugReport:
    # Exact id or unique prefix (R-DBG-2); on a home node, on whichever host the run is (the
    # ledgers asked below are the home's whatever host holds the run).
    _, run = client.hosts.find(run_id)
    inspection = client.capacity.inspect(run.run_id, run.session_id)
    spawn = client.session.spawn_snapshot(run.session_id)
    snap = client.capacity.snapshot(run.session_id, limit=capacity_limit)
    limit = "unlimited" if snap.limit == 0 else str(snap.limit)
    capacity_line = f"Active async capacity: {snap.used}/{limit} used"
    lines = render(run, inspection, spawn, capacity_line)
    return DebugReport(lines, {"lines": lines, **details(run, inspection, spawn, snap)})
