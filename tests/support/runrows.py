"""Run rows written behind a node's back: more runs than a test could launch in its time.

What it owns: copies of one real run's `runs` and `run_children` rows in a state dir's
runs.db (SQLite, as the run supervisor stores them), written while no node runs or as rows of
runs the running node does not drive (it reads them in its listings, never supervises them).
Launching over a thousand runs would take minutes; copying their rows takes a moment. It never
starts or stops a process and never asks a node anything.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from subagents_node.client.paths import owner_db


def copy_run(state_dir: Path, source: str, count: int, **columns: Any) -> list[str]:
    """`count` copies of run `source` (its row and its children's rows) with `columns` set,
    each created a moment after the last, written behind the node's back (while no node runs,
    or as rows of runs it does not drive); their ids, newest last.
    The copy made halfway is unreadable (a broken snapshots record), so the owner leaves it
    out of its page and that page comes back short (it is not among the returned ids)."""
    db = sqlite3.connect(owner_db(state_dir, "supervisor"))
    try:
        made: list[str] = []
        for table in ("runs", "run_children"):
            names = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            row = db.execute(f"SELECT * FROM {table} WHERE run_id=?", (source,)).fetchall()
            for n in range(count):
                run_id = f"{source}-copy{n:05d}"
                for values in row:
                    record = dict(zip(names, values, strict=True), run_id=run_id)
                    if table == "runs":
                        record.update(columns, created_at=record["created_at"] + (n + 1) * 1e-3)
                        if n == count // 2:
                            record["snapshots"] = '{"fanout":'
                    else:
                        record["child_id"] = f"{record['child_id']}-copy{n:05d}"
                    marks = ", ".join("?" * len(record))
                    db.execute(
                        f"INSERT INTO {table} ({', '.join(record)}) VALUES ({marks})",
                        list(record.values()),
                    )
                if table == "runs" and n != count // 2:
                    made.append(run_id)
        db.commit()
    finally:
        db.close()
    return made


def remove_copies(state_dir: Path, source: str) -> None:
    """Every copy `copy_run` made of run `source` (the unreadable one too), rows and all."""
    db = sqlite3.connect(owner_db(state_dir, "supervisor"), timeout=30)
    try:
        for table in ("run_children", "runs"):
            db.execute(f"DELETE FROM {table} WHERE run_id LIKE ?", (f"{source}-copy%",))
        db.commit()
    finally:
        db.close()
