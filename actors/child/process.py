"""The ChildActor's process plumbing: the spawn, liveness after a restart, and the outcome rules.

Owns the rules that turn what was observed about a process into a ChildExited event and its
proof (R-EXT-3, R-RUN-5), and the spawn itself. Only ChildActor calls these. Never logs argv,
env or stdin: they may hold the task (R-MISC-1).
"""

from __future__ import annotations

import os
import queue
import subprocess
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import pykka

from subagents_node.actors.child.process_tree import (
    ProcessIdentity,
    boot_id,
    is_alive,
    start_time_of,
    wall_clock,
)
from subagents_node.actors.child.rows import ChildRecord
from subagents_node.actors.owner import Job
from subagents_node.messages.base import Message
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.runs import (
    ENDED_EXIT_CODE,
    REASON_EXITED,
    REASON_NOT_STARTED,
    REASON_TREE_UNVERIFIED,
    UNKNOWN_EXIT_ERROR,
    ChildExited,
    ChildSpec,
    ChildStarted,
    ChildState,
    ProcessProof,
    exit_error,
    output_tail,
    signal_error,
)

SPAWN_ERRORS = (OSError, ValueError, subprocess.SubprocessError)

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


# -- the spawn -------------------------------------------------------------------------------


def spawn(spec: ChildSpec) -> subprocess.Popen[bytes]:
    """Start the process in a new session (its own process group), output into the logs."""
    out = _open_log(spec.stdout_path)
    try:
        err = _open_log(spec.stderr_path)
        try:
            stdin: Any = open(spec.stdin_path, "rb") if spec.stdin_path else subprocess.DEVNULL  # noqa: SIM115
            try:
                return subprocess.Popen(
                    spec.argv,
                    cwd=spec.cwd,
                    env=spec.env,
                    stdin=stdin,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                )
            finally:
                if stdin is not subprocess.DEVNULL:
                    stdin.close()
        finally:
            os.close(err)
    finally:
        os.close(out)


def _open_log(path: str) -> int:
    Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


def describe_spawn_error(spec: ChildSpec, exc: BaseException) -> str:
    """One line naming what could not be used (the command, the cwd or a file), never argv."""
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        filename = None if exc.filename is None else str(exc.filename)
        if filename == spec.cwd:
            return f"cannot start the child: working directory {spec.cwd}: {what}"
        if filename in (spec.stdin_path, spec.stdout_path, spec.stderr_path):
            return f"cannot start the child: {filename}: {what}"
        return f"cannot start {spec.argv[0]}: {what}"
    return f"cannot start {spec.argv[0]}: {exc}"


def stamp_identity(record: ChildRecord, pid: int, now: float) -> None:
    """Record who our fresh child is. It cannot vanish before we reap it, so its start time
    is readable even if it already exited."""
    started = start_time_of(pid, zombies=True)
    record.pid = pid
    record.identity_start = now if started is None else started
    record.start_time = now if started is None else wall_clock(started)
    record.boot_id = boot_id()


def answer_queued_jobs(inbox: object, outcome: Message | SubagentsError) -> None:
    """Answer every request still queued in a stopping actor's inbox (pykka would drop them
    silently); anything else there (timer ticks) no longer matters."""
    if not isinstance(inbox, queue.Queue):
        return
    while True:
        try:
            envelope = inbox.get_nowait()
        except queue.Empty:
            return
        message = getattr(envelope, "message", None)
        if isinstance(message, Job):
            message.reply(outcome)


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


def tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    """Deliver from a watch thread; an actor that already stopped no longer cares."""
    with suppress(pykka.ActorDeadError):
        ref.tell(message)


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
    if end_reason is not None:
        state = "stopped" if end_reason == "stopped" else "failed"
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
        stopped=end_reason == "stopped",
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
