"""The `capacity_given_up` table: acquire ids their callers gave up (`capacity.rollback_acquire`).
SQL only.

Owned by the CapacityLedger: only its connection, inside its transaction, calls these functions.
A caller that never learned an acquire's answer (a worker whose home was lost with the acquire
in flight) gives it up by its id: the grant it made, if any, is undone, and the id is kept here,
so that the same acquire arriving after its rollback is refused instead of taking a slot that no
run will ever hold. That happens when the acquire was still on its way: sent on a connection the
worker dropped when it found its home lost, whose kernel sends it again once a partition heals
(an orphaned tcp socket keeps retransmitting), while the rollback went over the worker's next
connection and was applied first. Rows are kept KEEP_S (far beyond any retransmission), pruned
as new ones are written; one row per id.

It never frees or grants a slot: it only refuses an acquire whose id was given up (the ledger
asks it to, before it takes a slot).
"""

from __future__ import annotations

import sqlite3

from subagents_node.messages.capacity import Acquire
from subagents_node.messages.errors import BadRequest

TABLE = "capacity_given_up"
#: How long a given-up id is remembered: an orphaned socket stops retransmitting after about
#: two minutes (tcp_orphan_retries), and a TTL is 60 s by default.
KEEP_S = 3600.0

SCHEMA_V1 = """
CREATE TABLE capacity_given_up (
    acquire_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX capacity_given_up_at ON capacity_given_up (at)
"""


def record(
    db: sqlite3.Connection, acquire_id: str, session_id: str, run_id: str, at: float
) -> None:
    """Remember that `acquire_id` was given up, and forget ids given up more than KEEP_S ago."""
    db.execute(f"DELETE FROM {TABLE} WHERE at < ?", (at - KEEP_S,))
    db.execute(
        f"INSERT OR REPLACE INTO {TABLE} (acquire_id, session_id, run_id, at) VALUES (?, ?, ?, ?)",
        (acquire_id, session_id, run_id, at),
    )


def refuse(db: sqlite3.Connection, req: Acquire) -> None:
    """Refuse `req` (BadRequest, reason `acquire_given_up`; nothing taken) when its caller gave
    its acquire id up before it arrived: no run would ever hold the slot it took."""
    if req.acquire_id is None:
        return
    row = db.execute(
        f"SELECT 1 FROM {TABLE} WHERE acquire_id = ? AND session_id = ? AND run_id = ?",
        (req.acquire_id, req.session_id, req.run_id),
    ).fetchone()
    if row is not None:
        raise BadRequest(
            f"acquire {req.acquire_id} of run {req.run_id} was given up by its caller "
            "(capacity.rollback_acquire); nothing was taken. Acquire under a new id",
            reason="acquire_given_up",
            run_id=req.run_id,
        )
