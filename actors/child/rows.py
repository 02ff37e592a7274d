"""The `children` table: its schema and the statements the run supervisor runs on it.

Owns the row layout and nothing else: only the RunSupervisor (through actors/child/keeper.py)
calls these, inside the transaction its OwnerActor base opened, so the table has one writer and
group commit. A row never holds argv, env or stdin (they may hold the task, R-MISC-1, R-MISC-2):
only identities (the child's and its shim's), times, states and proof.
A row that breaks its invariants (`CHECKS`, in SQL) is left out of recovery (`running_child_ids`)
and listed by `unreadable`, for the supervisor to quarantine: its child is never adopted.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from subagents_node.actors import quarantine
from subagents_node.messages.runs import (
    ChildEvent,
    ChildExited,
    ChildSpec,
    ChildStarted,
    ProcessProof,
)

SCHEMA = """
CREATE TABLE children (
    child_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    session_id TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL CHECK (state IN ('running', 'complete', 'failed', 'stopped')),
    pid INTEGER,
    process_start_time REAL,
    identity_start REAL,
    boot_id TEXT NOT NULL DEFAULT '',
    started_at REAL,
    ended_at REAL,
    deadline_at REAL,
    timeout_s REAL,
    grace_s REAL NOT NULL,
    stdout_path TEXT NOT NULL,
    stderr_path TEXT NOT NULL,
    end_reason TEXT,
    end_message TEXT,
    exit_code INTEGER,
    signal INTEGER,
    proof TEXT
);
CREATE INDEX children_running ON children(state) WHERE state = 'running';
CREATE INDEX children_by_run ON children(run_id)
"""

#: Version 2: the child shim. A row is written when the shim is ordered (pid still unknown),
#: and carries the shim's identity and the directory of its records.
SHIM_COLUMNS = """
ALTER TABLE children ADD COLUMN shim_pid INTEGER;
ALTER TABLE children ADD COLUMN shim_start REAL;
ALTER TABLE children ADD COLUMN record_dir TEXT NOT NULL DEFAULT ''
"""

#: Version 3: the processes left when the leader exited ([[pid, start], ...] as JSON), the
#: proof of the tree's end should its shim die.
DESCENDANTS_COLUMN = """
ALTER TABLE children ADD COLUMN descendants TEXT NOT NULL DEFAULT '[]'
"""

MIGRATIONS = (SCHEMA, SHIM_COLUMNS, DESCENDANTS_COLUMN)

TABLE = "children"
CHECKS = (
    *(quarantine.text(c) for c in ("run_id", "session_id", "stdout_path", "stderr_path")),
    *(quarantine.text(c) for c in ("boot_id", "record_dir")),
    quarantine.one_of("state", ("running", "complete", "failed", "stopped")),
    quarantine.number("grace_s"),
    *(
        quarantine.number(c, nullable=True)
        for c in (
            "process_start_time",
            "identity_start",
            "started_at",
            "ended_at",
            "deadline_at",
            "timeout_s",
            "shim_start",
        )
    ),
    *(quarantine.integer(c, nullable=True) for c in ("pid", "shim_pid", "exit_code", "signal")),
    quarantine.json("proof", nullable=True),
)
_PROBLEM = quarantine.problem(CHECKS)


def read_checked(db: sqlite3.Connection, child_id: str) -> tuple[sqlite3.Row | None, str | None]:
    """The child's row and why it cannot be trusted (None when it can, or when there is no
    such row), in one statement: a shim's report needs both."""
    row: sqlite3.Row | None = db.execute(
        f"SELECT *, {_PROBLEM} AS row_problem FROM children WHERE child_id = ?", (child_id,)
    ).fetchone()
    if row is None or row["row_problem"] is None:
        return row, None
    return row, str(row["row_problem"])


def unreadable(db: sqlite3.Connection, run_ids: Iterable[str]) -> list[tuple[str, str]]:
    """(child id, reason) of every row that breaks its invariants among the rows recovery
    adopts: the running children and every child of the runs `run_ids` (those that may still
    be going). By index, never a scan of the children of the whole run history."""
    found = quarantine.broken_rows(db, TABLE, "child_id", CHECKS, "state = 'running'")
    for run_id in run_ids:
        found += quarantine.broken_rows(
            db, TABLE, "child_id", CHECKS, "run_id = ? AND state != 'running'", (run_id,)
        )
    return found


@dataclass
class ChildRecord:
    """What the store keeps about one child (and what a restart needs to adopt it)."""

    child_id: str
    run_id: str
    session_id: str
    stdout_path: str
    stderr_path: str
    grace_s: float
    timeout_s: float | None = None
    pid: int | None = None
    #: psutil's create_time (wall clock, for people and the proof).
    start_time: float | None = None
    #: The identity clock of process_tree.start_time_of, and the boot it counts from.
    identity_start: float | None = None
    boot_id: str = ""
    started_at: float | None = None
    deadline_at: float | None = None
    shim_pid: int | None = None
    shim_start: float | None = None
    record_dir: str = ""

    @classmethod
    def from_spec(cls, spec: ChildSpec) -> ChildRecord:
        return cls(
            child_id=spec.child_id,
            run_id=spec.run_id,
            session_id=spec.session_id,
            stdout_path=spec.stdout_path,
            stderr_path=spec.stderr_path,
            grace_s=spec.grace_s,
            timeout_s=spec.deadline_s,
            record_dir=spec.records,
        )

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> ChildRecord:
        return cls(
            child_id=row["child_id"],
            run_id=row["run_id"],
            session_id=row["session_id"],
            stdout_path=row["stdout_path"],
            stderr_path=row["stderr_path"],
            grace_s=row["grace_s"],
            timeout_s=row["timeout_s"],
            pid=row["pid"],
            start_time=row["process_start_time"],
            identity_start=row["identity_start"],
            boot_id=row["boot_id"],
            started_at=row["started_at"],
            deadline_at=row["deadline_at"],
            shim_pid=row["shim_pid"],
            shim_start=row["shim_start"],
            record_dir=row["record_dir"],
        )


def read_row(db: sqlite3.Connection, child_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = db.execute(
        "SELECT * FROM children WHERE child_id = ?", (child_id,)
    ).fetchone()
    return row


def settled_exit(db: sqlite3.Connection, child_id: str, output: str) -> ChildExited | None:
    """The exit a settled child reported (rebuilt from its row), or None if it is not settled.

    Replayed after a restart for a child whose settlement was committed here but never reached
    the supervisor (the node died in between), so its run can settle too.
    """
    row = read_row(db, child_id)
    if row is None or row["state"] == "running" or not row["proof"]:
        return None
    return ChildExited(
        child_id=child_id,
        run_id=row["run_id"],
        state=row["state"],
        proof=ProcessProof.model_validate_json(row["proof"]),
        exit_code=row["exit_code"],
        output=output,
        error=row["end_message"] or None,
        timed_out=row["end_reason"] == "timed_out",
        stopped=row["end_reason"] == "stopped",
        started_at=row["started_at"],
        ended_at=row["ended_at"] or row["started_at"] or 0.0,
    )


def running_child_ids(db: sqlite3.Connection) -> list[str]:
    rows = db.execute(
        f"SELECT child_id FROM children WHERE state = 'running' AND {_PROBLEM} IS NULL "
        "ORDER BY started_at"
    ).fetchall()
    return [str(r[0]) for r in rows]


def deadlines(db: sqlite3.Connection) -> list[tuple[str, float]]:
    """Running children with a deadline and no end recorded yet: (child id, the moment their
    deadline and grace are over)."""
    rows = db.execute(
        "SELECT child_id, deadline_at + grace_s FROM children WHERE state = 'running' "
        f"AND deadline_at IS NOT NULL AND end_reason IS NULL AND {_PROBLEM} IS NULL"
    ).fetchall()
    return [(str(r[0]), float(r[1])) for r in rows]


def insert_ordered(db: sqlite3.Connection, record: ChildRecord) -> None:
    """The row of a child whose shim has been ordered: running, its pid not known yet."""
    db.execute(
        "INSERT INTO children (child_id, run_id, session_id, state, started_at, deadline_at, "
        "timeout_s, grace_s, stdout_path, stderr_path, record_dir) "
        "VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
        (
            record.child_id,
            record.run_id,
            record.session_id,
            record.started_at,
            record.deadline_at,
            record.timeout_s,
            record.grace_s,
            record.stdout_path,
            record.stderr_path,
            record.record_dir,
        ),
    )


def record_started(db: sqlite3.Connection, record: ChildRecord) -> None:
    """The child's and its shim's identities, from the shim's first report."""
    db.execute(
        "UPDATE children SET pid = ?, process_start_time = ?, identity_start = ?, boot_id = ?, "
        "shim_pid = ?, shim_start = ? WHERE child_id = ?",
        (
            record.pid,
            record.start_time,
            record.identity_start,
            record.boot_id,
            record.shim_pid,
            record.shim_start,
            record.child_id,
        ),
    )


def record_exit(
    db: sqlite3.Connection,
    child_id: str,
    exit_code: int | None,
    signum: int | None,
    descendants: list[tuple[int, float]],
) -> None:
    """The leader's exit, and who was left; the row stays running until its tree has ended."""
    db.execute(
        "UPDATE children SET exit_code = ?, signal = ?, descendants = ? WHERE child_id = ?",
        (exit_code, signum, json.dumps(descendants), child_id),
    )


def descendants_of(row: sqlite3.Row) -> list[tuple[int, float]]:
    """The processes recorded as left when the leader exited (none when it does not parse)."""
    try:
        return [(int(pid), float(start)) for pid, start in json.loads(row["descendants"])]
    except (ValueError, TypeError):
        return []


def record_end(db: sqlite3.Connection, child_id: str, reason: str, message: str) -> None:
    db.execute(
        "UPDATE children SET end_reason = ?, end_message = ? WHERE child_id = ?",
        (reason, message, child_id),
    )


def write_settlement(db: sqlite3.Connection, record: ChildRecord, event: ChildExited) -> None:
    """The terminal state and its proof, in the caller's transaction (one row, upserted: a
    child that never started has no row yet)."""
    proof = event.proof
    db.execute(
        "INSERT INTO children (child_id, run_id, session_id, state, pid, process_start_time, "
        "started_at, ended_at, deadline_at, timeout_s, grace_s, stdout_path, stderr_path, "
        "exit_code, signal, proof) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(child_id) DO UPDATE SET state = excluded.state, "
        "ended_at = excluded.ended_at, exit_code = excluded.exit_code, "
        "signal = excluded.signal, proof = excluded.proof",
        (
            record.child_id,
            record.run_id,
            record.session_id,
            event.state,
            record.pid,
            record.start_time,
            record.started_at,
            event.ended_at,
            record.deadline_at,
            record.timeout_s,
            record.grace_s,
            record.stdout_path,
            record.stderr_path,
            proof.exit_code,
            proof.signal,
            proof.model_dump_json(),
        ),
    )


def committed(event: ChildEvent, row: sqlite3.Row | None) -> bool:
    """Did the state this event reports reach the store?"""
    if row is None:
        return False
    return isinstance(event, ChildStarted) or row["state"] != "running"
