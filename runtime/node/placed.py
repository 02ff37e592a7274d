"""PlacedRuns: which worker placed which run through its home (DESIGN §1 "Multi-host", §3).

Owns the `placed` table of the home's `members.db` (through the Members connection, whose
owner serialises every call): one row per run a worker's key had the home carry a nested launch
for, naming the host the run is on and the worker that placed it. A worker's key may follow
(`runs.watch`, `runs.show`, `runs.stop`) those runs and no other: it holds no right over the
home's runs, an operator's, or another worker's. The row is written when the launch's answer
comes back, before the answer goes on, so a run the worker heard of is one it may follow, after
a home restart too.

Growth is bounded: a worker keeps at most `MAX_PER_WORKER` rows (its oldest go first), a row
goes when its run is found gone (pruned on its host), and a worker's rows go when the operator
forgets it or revokes its key (the next key allowed under that name is no heir to them). A
worker that restarts and joins again keeps them: its children outlive its node and follow on.

It never decides whether a request is placeable (runtime/node/home.py does) and never asks an
owner anything.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable

#: Runs one worker may follow at once through its home; past it, its oldest placements go.
MAX_PER_WORKER = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS placed (
    host TEXT NOT NULL,
    run_id TEXT NOT NULL,
    worker TEXT NOT NULL,
    placed_at REAL NOT NULL,
    PRIMARY KEY (host, run_id)
)
"""
_BY_WORKER = "CREATE INDEX IF NOT EXISTS placed_by_worker ON placed (worker, placed_at)"


class PlacedRuns:
    def __init__(self, db: sqlite3.Connection, limit: int = MAX_PER_WORKER) -> None:
        self._db = db
        self._limit = limit
        db.execute(_SCHEMA)
        db.execute(_BY_WORKER)

    def record(self, worker: str, host: str, run_id: str) -> None:
        """Worker `worker` placed run `run_id` on `host` (a run id seen again, after its
        host's runs were reset, belongs to its latest launcher). Keeps the worker's newest
        `limit` rows, in one transaction with the insert."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT INTO placed(host, run_id, worker, placed_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(host, run_id) DO UPDATE SET worker=excluded.worker, "
                "placed_at=excluded.placed_at",
                (host, run_id, worker, time.time()),
            )
            db.execute(
                "DELETE FROM placed WHERE worker = ? AND rowid NOT IN (SELECT rowid FROM placed "
                "WHERE worker = ? ORDER BY placed_at DESC, rowid DESC LIMIT ?)",
                (worker, worker, self._limit),
            )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # sqlite may have rolled back itself (a full disk)
                db.execute("ROLLBACK")
            raise

    def placed_by(self, worker: str, host: str, run_id: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM placed WHERE host = ? AND run_id = ? AND worker = ?",
            (host, run_id, worker),
        ).fetchone()
        return row is not None

    def gone(self, host: str, run_id: str) -> None:
        """Run `run_id` is no more on `host` (its host answered run_not_found)."""
        self._db.execute("DELETE FROM placed WHERE host = ? AND run_id = ?", (host, run_id))

    def drop_worker(self, worker: str) -> None:
        """Every row of `worker` (forgotten, or its key revoked). Inside the caller's
        transaction when it has one."""
        self._db.execute("DELETE FROM placed WHERE worker = ?", (worker,))

    def keep_only(self, workers: Iterable[str]) -> None:
        """Drop the rows of every worker not in `workers` (the names still allowed)."""
        names = sorted(set(workers))
        marks = ", ".join("?" * len(names))
        self._db.execute(f"DELETE FROM placed WHERE worker NOT IN ({marks})", names)

    def count(self, worker: str) -> int:
        row = self._db.execute("SELECT COUNT(*) FROM placed WHERE worker = ?", (worker,)).fetchone()
        return int(row[0])
