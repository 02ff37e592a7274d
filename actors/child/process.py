"""The outcome rules: what was observed about a child's tree becomes a ChildExited and its proof.

Owns the rules that turn a shim's facts (exit code or signal, how the child was ended, whether
its tree was seen to end) into a ChildExited event and its process-terminal proof (R-EXT-3,
R-RUN-5), and liveness from a recorded identity after a restart. Only the supervisor-side
keeper calls these. Pure apart from reading the log tails; never logs argv, env or stdin.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from subagents_node.actors.child.procfs import ProcessIdentity, boot_id, is_alive, start_time_of
from subagents_node.actors.child.rows import ChildRecord
from subagents_node.messages.runs import (
    ENDED_EXIT_CODE,
    REASON_EXITED,
    REASON_NOT_STARTED,
    REASON_TREE_UNVERIFIED,
    UNKNOWN_EXIT_ERROR,
    ChildExited,
    ChildStarted,
    ChildState,
    EndedBy,
    ProcessProof,
    exit_error,
    output_tail,
    signal_error,
    timeout_error,
)

STOPPED = "Stopped by request."
#: Why a child whose shim died settles as it does (the keeper's shim_gone and recovery).
REASON_SHIM_GONE = "the shim died; every process it reported is gone"
REASON_SHIM_GONE_EARLY = "the shim died before it reported its child; nothing of its tree lives"
REASON_SHIM_GONE_LIVE = (
    "process-tree-unverified: the shim died before its child was known to have started"
)
NOT_STARTED_BY_RESTART = "the node stopped before the child's shim started it"
NOT_STARTED_SHIM_GONE = (
    "no shim started the child: its shim, or the shim template forking it, was killed first"
)
#: A foreground command that embedded its node was killed (-9) without stopping its run: the
#: shims, bound to that node at spawn, stopped each tree as its stop would have.
NODE_GONE = "Stopped: the foreground command that ran it (and its embedded node) was killed."

Liveness = Literal["alive", "gone", "reused"]


@dataclass(frozen=True)
class ExitFacts:
    """How the leader's end was learnt: the proof's reason, exit code or signal, and when."""

    reason: str = REASON_EXITED
    exit_code: int | None = None
    signal: int | None = None
    at: float | None = None

    def observed(self, returncode: int | None, now: float) -> ExitFacts:
        if returncode is None:
            return replace(self, at=now)
        if returncode < 0:
            return replace(self, signal=-returncode, at=now)
        return replace(self, exit_code=returncode, at=now)


def leader_identity(record: ChildRecord) -> ProcessIdentity:
    assert record.pid is not None and record.identity_start is not None
    return ProcessIdentity(record.pid, record.identity_start)


def liveness(record: ChildRecord) -> Liveness:
    """Does the recorded process (pid + start time, same boot) still run? `reused`: the pid now
    names another process, so neither it nor a group with its id is ours to signal."""
    if record.pid is None or record.identity_start is None:
        return "gone"
    if start_time_of(record.pid) is None:
        return "gone"
    if record.boot_id != boot_id():
        return "reused"  # recorded before a reboot: whatever has that pid now is not ours
    return "alive" if is_alive(leader_identity(record)) else "reused"


# -- outcomes --------------------------------------------------------------------------------


def started_event(record: ChildRecord, adopted: bool = False) -> ChildStarted:
    assert record.pid is not None and record.start_time is not None
    return ChildStarted(
        child_id=record.child_id,
        run_id=record.run_id,
        pid=record.pid,
        process_start_time=record.start_time,
        started_at=record.started_at or 0.0,
        adopted=adopted,
    )


def shim_end(ended_by: EndedBy, timeout_s: float | None) -> tuple[str | None, str | None]:
    """The end reason and message of a tree its shim ended by itself (no stop was recorded):
    its deadline, a SIGTERM to the shim, or the death of the embedded node it was bound to."""
    if ended_by == "deadline":
        return "timed_out", timeout_error(timeout_s or 0.0)
    if ended_by == "stop":
        return "stopped", STOPPED
    if ended_by == "node_gone":
        return "node_gone", NODE_GONE
    return None, None


def outcome(
    record: ChildRecord,
    facts: ExitFacts,
    end_reason: str | None,
    end_message: str | None,
    unverified: bool,
    now: float,
) -> ChildExited:
    """R-EXT-3: exit 0 is success; a non-zero exit's error is the stderr tail, else `External
    CLI exited with code {n}.`; a timeout or stop reports exit code 1 and its message."""
    ended_at = facts.at if facts.at is not None else now
    proof = ProcessProof(
        state="unknown" if unverified else "observed",
        run_id=record.run_id,
        runner_id=record.child_id,
        pid=record.pid,
        process_start_time=record.start_time,
        exit_code=facts.exit_code,
        signal=facts.signal,
        observed_at=ended_at,
        reason=REASON_TREE_UNVERIFIED if unverified else facts.reason,
    )
    state: ChildState
    exit_code: int | None
    stopped = end_reason in ("stopped", "node_gone")
    if end_reason is not None:
        state = "stopped" if stopped else "failed"
        error: str | None = end_message
        exit_code = ENDED_EXIT_CODE
    elif facts.exit_code == 0:
        state, error, exit_code = "complete", None, 0
    elif facts.exit_code is not None:
        state, exit_code = "failed", facts.exit_code
        error = output_tail(record.stderr_path) or exit_error(facts.exit_code)
    elif facts.signal is not None:
        state, exit_code = "failed", None
        error = output_tail(record.stderr_path) or signal_error(facts.signal)
    else:
        state, error, exit_code = "failed", UNKNOWN_EXIT_ERROR, None
    return ChildExited(
        child_id=record.child_id,
        run_id=record.run_id,
        state=state,
        proof=proof,
        exit_code=exit_code,
        output=output_tail(record.stdout_path),
        error=error,
        timed_out=end_reason == "timed_out",
        stopped=stopped,
        node_gone=end_reason == "node_gone",
        started_at=record.started_at,
        ended_at=ended_at,
    )


def not_started(record: ChildRecord, error: str, now: float) -> ChildExited:
    """R-RUN-5 not-started: no process ever existed, so the proof says so."""
    proof = ProcessProof(
        state="not-started",
        run_id=record.run_id,
        runner_id=record.child_id,
        observed_at=now,
        reason=REASON_NOT_STARTED,
        error=error,
    )
    return ChildExited(
        child_id=record.child_id,
        run_id=record.run_id,
        state="failed",
        proof=proof,
        exit_code=None,
        error=error,
        ended_at=now,
    )
