"""The row checks' SQL (actors/quarantine.py): what it finds, and what it costs a read.

Every owner reads its rows with their checks beside them (the run supervisor reads a child's
checked row at each report of its shim, and every child row of a run for each view of it).
Written with `NOT IN ('a', 'b')` lists, each check made SQLite build a temporary b-tree of its
list at every execution of the statement: 19 µs a checked child row in a node's store (160-240
µs in some), where the comparisons cost 6.5 µs.
"""

from __future__ import annotations

import sqlite3
from typing import get_args

from subagents_node.actors import quarantine
from subagents_node.actors.child import rows
from subagents_node.actors.fanout import schema as fanout_schema
from subagents_node.actors.runs import runstore
from subagents_node.messages.runs import ProofState

STRANGE = [None, 0, 1, -1, 2.5, "", "text", "running", "complete", "o'q", b"blob", "[]", "{"]


def _opcodes(db: sqlite3.Connection, sql: str) -> set[str]:
    return {str(row[1]) for row in db.execute(f"EXPLAIN {sql}")}


def test_a_checked_row_read_builds_no_temporary_table_per_execution() -> None:
    db = sqlite3.connect(":memory:")
    for migration in rows.MIGRATIONS:
        db.executescript(migration)
    sql = f"SELECT *, {rows._PROBLEM} FROM children WHERE child_id = 'c'"
    assert "OpenEphemeral" not in _opcodes(db, sql)
    for checks in (runstore.RUN_CHECKS, runstore.CHILD_CHECKS, fanout_schema.BUDGET_CHECKS):
        assert " IN (" not in quarantine.problem(checks)


def test_the_checks_name_the_same_rows_as_in_lists_would() -> None:
    """`e != 'a' AND e != 'b'` is `e NOT IN ('a', 'b')` in SQL's three-valued logic."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a)")
    db.executemany("INSERT INTO t VALUES (?)", [(v,) for v in STRANGE])
    cases = [
        (quarantine.text("a"), "typeof(a) NOT IN ('text')"),
        (quarantine.text("a", nullable=True), "typeof(a) NOT IN ('text', 'null')"),
        (quarantine.number("a"), "typeof(a) NOT IN ('integer', 'real')"),
        (quarantine.number("a", nullable=True), "typeof(a) NOT IN ('integer', 'real', 'null')"),
        (
            quarantine.one_of("a", ("running", "complete")),
            "a IS NULL OR a NOT IN ('complete', 'running')",
        ),
        (
            quarantine.one_of("a", get_args(ProofState), nullable=True),
            "a NOT IN ({})".format(", ".join(f"'{v}'" for v in sorted(get_args(ProofState)))),
        ),
        (quarantine.one_of("a", ("o'q",)), "a IS NULL OR a NOT IN ('o''q')"),
    ]
    for (check, _reason), listed in cases:
        got = db.execute(f"SELECT rowid, ({check}) FROM t ORDER BY rowid").fetchall()
        want = db.execute(f"SELECT rowid, ({listed}) FROM t ORDER BY rowid").fetchall()
        assert got == want, check
