"""The `capacity_operator_releases` table: the audit of slots an operator's release freed. SQL only.

Owned by the CapacityLedger: only its connection, inside its transaction, calls these functions.
One row per freed slot, appended in the same transaction that deletes the slot (so a slot is
either still held or freed with its audit row, never neither nor both); rows are never updated
or deleted. `seq` (the rowid) orders them, and every read is an index range: the newest `limit`
rows, of all hosts or of one, and the highest generation an operator freed for one run (the
floor a fresh grant of that run starts above, so a report from the lost execution stays
fenced, DESIGN §3).
A row that does not parse is reported to the caller as (key, reason), never raised: the audit
is read by people, and one damaged row must not hide the others.
It must never decide anything: whether and what to release is the ledger's.
"""

from __future__ import annotations

import sqlite3

from pydantic import ValidationError

from subagents_node.actors.quarantine import reason_of
from subagents_node.messages.capacity import OPERATOR_PROOF, SlotRecord
from subagents_node.messages.capacity_hosts import OperatorRelease

TABLE = "capacity_operator_releases"

SCHEMA_V1 = """
CREATE TABLE capacity_operator_releases (
    seq INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    host TEXT NOT NULL,
    session_id TEXT NOT NULL,
    slot INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    kind TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'started')),
    runner_id TEXT,
    proof_state TEXT NOT NULL,
    reason TEXT NOT NULL,
    operator TEXT NOT NULL
);
CREATE INDEX capacity_operator_releases_host ON capacity_operator_releases (host, seq);
CREATE INDEX capacity_operator_releases_run
    ON capacity_operator_releases (session_id, run_id, generation)
"""

_COLUMNS: tuple[str, ...] = tuple(OperatorRelease.model_fields)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM capacity_operator_releases"
_INSERT = (
    f"INSERT INTO capacity_operator_releases ({', '.join(c for c in _COLUMNS if c != 'seq')}) "
    f"VALUES ({', '.join('?' for c in _COLUMNS if c != 'seq')})"
)


def record(db: sqlite3.Connection, slot: SlotRecord, at: float, reason: str, operator: str) -> None:
    """Append the audit row of `slot`, freed now by an operator (proof state `operator`)."""
    row = OperatorRelease(
        seq=0,  # the rowid SQLite assigns
        at=at,
        host=slot.host,
        session_id=slot.session_id,
        slot=slot.slot,
        run_id=slot.run_id,
        generation=slot.generation,
        kind=slot.kind,
        state="started" if slot.started else "reserved",
        runner_id=slot.runner_id,
        proof_state=OPERATOR_PROOF,
        reason=reason,
        operator=operator,
    ).model_dump()
    db.execute(_INSERT, tuple(row[c] for c in _COLUMNS if c != "seq"))


def newest(
    db: sqlite3.Connection, host: str | None, limit: int
) -> tuple[list[OperatorRelease], list[tuple[str, str]]]:
    """The newest `limit` rows (of `host`, when given), newest first; and (key, reason) of
    each of those rows that does not parse."""
    if host is None:
        rows = db.execute(f"{_SELECT} ORDER BY seq DESC LIMIT ?", (limit,))
    else:
        rows = db.execute(f"{_SELECT} WHERE host = ? ORDER BY seq DESC LIMIT ?", (host, limit))
    releases: list[OperatorRelease] = []
    unreadable: list[tuple[str, str]] = []
    for row in rows:
        try:
            releases.append(OperatorRelease.model_validate({c: row[c] for c in _COLUMNS}))
        except ValidationError as exc:
            unreadable.append((str(row["seq"]), reason_of(exc)))
    return releases, unreadable


def highest_generation(db: sqlite3.Connection, session_id: str, run_id: str) -> int | None:
    """The highest generation an operator freed for `run_id` in the session, or None."""
    (generation,) = db.execute(
        "SELECT MAX(generation) FROM capacity_operator_releases "
        "WHERE session_id = ? AND run_id = ? AND typeof(generation) = 'integer'",
        (session_id, run_id),
    ).fetchone()
    return None if generation is None else int(generation)
