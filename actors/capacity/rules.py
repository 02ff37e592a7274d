"""The capacity ledger's decisions as pure functions of a SlotRecord (SPEC §4).

Owns the rules, not the state: lowest free index (R-CAP-10), handle identity (R-CAP-4),
transferability (R-CAP-18 with A-2 resolved) and the release verdicts (R-CAP-21/22), adapted to
this design: the status and proof facts a verdict needs come from the run supervisor's
`capacity.report_terminal` (stored on the record as `terminal`), never from files.
It must never touch the store or the clock.
"""

from __future__ import annotations

import hashlib
from typing import Any

from subagents_node.messages.capacity import (
    TERMINAL_STATES,
    RunnerProof,
    SlotHandle,
    SlotRecord,
    TerminalFacts,
    Verdict,
)

RELEASED_STARTUP_FAILURE = "run failed before child startup completed"
RELEASED_OBSERVED = "matching observed process-terminal proof is present"
RELEASED_WORKFLOW = (
    "workflow is terminal, controller is gone, and async children have observed proof"
)
NO_RUNNER_IDENTITY = "runner process identity has not been recorded"
NO_SLOT = "no active-capacity slot records this run"


def session_key(session_id: str) -> str:
    """R-CAP-1's pool digest: lower-case hex SHA-256 of the session identity (for display)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def lowest_free(occupied: list[int], limit: int) -> int | None:
    """R-CAP-10: the lowest index in [0, limit) missing from the ascending `occupied`.

    None when `used >= limit` (R-CAP-9): slots at indices at or above a lowered limit still
    count (R-CAP-3, A-17), so they block new grants until they drain.
    """
    if len(occupied) >= limit:
        return None
    index = 0
    for slot in occupied:
        if slot != index:
            break
        index += 1
    return index if index < limit else None


def mismatch(record: SlotRecord, handle: SlotHandle) -> str:
    """Why the handle does not name this record (R-CAP-4), or '' when it does."""
    if record.token != handle.token:
        return "token_mismatch"
    if record.run_id != handle.run_id:
        return "run_mismatch"
    if record.generation != handle.generation:
        return "generation_mismatch"
    if record.kind != handle.kind:
        return "kind_mismatch"
    return ""


def foreign(record: SlotRecord, host: str) -> bool:
    """Whether worker `host` asks about a slot another host holds ("" = the home node or its
    operators, who may act on any slot)."""
    return bool(host) and record.host != host


def started(record: SlotRecord, **runner: Any) -> SlotRecord:
    """The record once started: runner fields set, no TTL, and no way back to a transfer
    source, since a rollback after a start is refused forever (R-CAP-17)."""
    return record.model_copy(update={**runner, "expires_at": None, "prev_record": None})


def transfer_refusal(source: SlotRecord) -> str | None:
    """A-2 resolved: a source must be terminal, or paused with no live process.

    Returns why the source is not transferable, or None when it is.
    """
    facts = source.terminal
    if facts is None:
        return "run is still running"
    if facts.live_process:
        return f"run is {facts.state} but its process is still live"
    return None


def proof_matches(record: SlotRecord, proof: RunnerProof) -> bool:
    """A proof for another runner execution, or another process, reads as `unknown`."""
    if record.runner_id is None or proof.runner_id != record.runner_id:
        return False
    if proof.pid is not None and record.pid is not None and proof.pid != record.pid:
        return False
    return (
        proof.process_start_time is None
        or record.process_start_time is None
        or proof.process_start_time == record.process_start_time
    )


def reported(record: SlotRecord, facts: TerminalFacts) -> SlotRecord:
    """The record once the run supervisor reported `facts` about its run (R-CAP-21/22)."""
    return record.model_copy(
        update={
            "terminal_state": facts.state,
            "proof_state": proof_state(record, facts.proof),
            "terminal": facts,
        }
    )


def proof_state(record: SlotRecord, proof: RunnerProof | None) -> str:
    """The proof state as R-CAP-21 reads it: missing, or unknown when it is not this run's."""
    if proof is None:
        return "missing"
    return proof.state if proof_matches(record, proof) else "unknown"


def verdict_of(record: SlotRecord) -> Verdict:
    """R-CAP-21 (runner) or R-CAP-22 (workflow); the first matching rule wins."""
    return workflow_verdict(record) if record.kind == "workflow" else runner_verdict(record)


def runner_verdict(record: SlotRecord) -> Verdict:
    """R-CAP-21. Rules 1, 3 and 4 (status missing or of another session or run) cannot arise:
    a report is matched to its slot by session and run id, and no report means 'running'."""
    facts = record.terminal
    if record.runner_id is None:
        return _retained(NO_RUNNER_IDENTITY)
    if facts is None:
        return _retained("run is still running")
    if facts.state not in TERMINAL_STATES:
        return _retained(f"run is still {facts.state}")
    if facts.live_process:
        return _retained("runner process is still live")
    proof = facts.proof
    if proof is not None and proof_matches(record, proof):
        if proof.state == "not-started" and proof.error.strip():
            return Verdict(verdict="releasable", reason=RELEASED_STARTUP_FAILURE)
        if proof.state == "observed":
            return Verdict(verdict="releasable", reason=RELEASED_OBSERVED)
    return _retained(f"process-terminal proof is {proof_state(record, proof)}")


def workflow_verdict(record: SlotRecord) -> Verdict:
    """R-CAP-22. The per-child checks of rule 7 are the run supervisor's: it reports whether
    every async child has matching observed proof, and why not."""
    facts = record.terminal
    if facts is None:
        return _retained("workflow is still running")
    if facts.state not in TERMINAL_STATES:
        return _retained(f"workflow is still {facts.state}")
    if facts.live_process:
        return _retained("workflow controller is still live")
    if not facts.workflow_children_proven:
        return _retained(
            facts.reason or "async workflow children lack observed process-terminal proof"
        )
    return Verdict(verdict="releasable", reason=RELEASED_WORKFLOW)


def _retained(reason: str) -> Verdict:
    return Verdict(verdict="retained", reason=reason)
