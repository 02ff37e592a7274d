"""`debug-run`: a run's lifecycle and capacity verdict, for people (R-DBG-1..3, R-STS-1).

Owns only formatting. It asks the supervisor for the run and the capacity ledger for the
slot that records it (`inspect`, which runs the release verdict), and prints what decides
whether the run still holds capacity. It never prints task text, environment values or child
output (R-DBG-3): only ids, states, paths, proofs and reasons.
"""

from __future__ import annotations

import time

from messages.capacity import Inspection
from messages.session import SpawnSnapshot
from messages.supervisor import RunView
from runtime.client import Client


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _run_proof(run: RunView) -> str:
    """The run's process-terminal state as the status carries it (R-RUN-5)."""
    proofs = [c.proof_state for c in run.children if c.proof_state]
    if run.state in ("queued", "running", "paused"):
        state = "pending"
    elif proofs and all(p == "not-started" for p in proofs):
        state = "not-started"
    elif proofs and all(p in ("observed", "not-started") for p in proofs):
        state = "observed"
    else:
        state = "unknown"
    runner = f" · runner {run.runner_id}" if run.runner_id else ""
    return f"{state}{runner}"


#: Errors the node writes itself; anything else (a child's stderr tail) may hold secrets.
_OWN_ERRORS = (
    "Subagent timed out",
    "Run timed out",
    "External CLI exited with code",
    "External CLI was terminated by signal",
    "Stopped by request",
    "The node restarted",
    "Failed to create run storage",
)


def _own_error(error: str) -> str:
    first = error.strip().splitlines()[0] if error.strip() else ""
    if first.startswith(_OWN_ERRORS):
        return first[:200]
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
        f"dir: {run.run_dir}",
        f"status: store (runs table); summary file {run.run_dir}/summary.json",
        f"events file: {run.run_dir}/events.jsonl",
        f"session: {run.session_id}",
        f"state: {run.state}",
        f"mode: {run.mode}{' (background)' if run.background else ' (foreground)'}",
        f"parent run: {run.parent_run_id or '-'} · depth {run.depth} · root {run.root_run_id}",
        f"Status process terminal: {_run_proof(run)}",
        f"started: {_when(run.started_at)} · ended: {_when(run.ended_at)}",
    ]
    if run.error:
        lines.append(f"error: {_own_error(run.error)}")
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


def debug_run(client: Client, run_id: str, capacity_limit: int) -> list[str]:
    run = client.runs.show(run_id)  # exact id or unique prefix (R-DBG-2)
    inspection = client.capacity.inspect(run.run_id, run.session_id)
    spawn = client.session.spawn_snapshot(run.session_id)
    snap = client.capacity.snapshot(run.session_id, limit=capacity_limit)
    limit = "unlimited" if snap.limit == 0 else str(snap.limit)
    capacity_line = f"Active async capacity: {snap.used}/{limit} used"
    return render(run, inspection, spawn, capacity_line)
