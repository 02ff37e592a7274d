"""Row checks for quarantine: the SQL that says why a stored row cannot be trusted.

An owner describes the invariants of a table as (condition, reason) pairs in SQL; `problem`
folds them into one `CASE` expression that is NULL for a sound row and names the first broken
invariant otherwise. Reads select it next to the columns they use, and `recover()` finds every
broken row with `broken_rows` in one scan inside SQLite (no row is parsed in Python, so a scan
of a large table stays cheap). SQLite stores any value in any column, so these checks are the
types and domains the owner's code relies on, not a repeat of the schema's constraints.

It owns no table and decides nothing: the owner quarantines (`OwnerActor.quarantine`) and
fails closed. It imports nothing of ours.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

import pydantic

Check = tuple[str, str]


def problem(checks: Sequence[Check]) -> str:
    """One SQL expression: NULL when every check passes, else the reason of the first that
    fails. A check is `(sql condition that holds for a BROKEN row, reason)`."""
    whens = " ".join(
        f"WHEN {condition} THEN '{reason.replace(chr(39), chr(39) * 2)}'"
        for condition, reason in checks
    )
    return f"(CASE {whens} END)"


def integer(
    column: str, low: int | None = None, high: int | None = None, nullable: bool = False
) -> Check:
    """`column` holds an integer within [low, high] (or NULL when allowed)."""
    bounds = [f"typeof({column}) != 'integer'"]
    if low is not None:
        bounds.append(f"{column} < {low}")
    if high is not None:
        bounds.append(f"{column} > {high}")
    lo, hi = ("" if v is None else str(v) for v in (low, high))
    domain = f" in {lo}..{hi}" if lo or hi else ""
    broken = " OR ".join(bounds)
    if nullable:
        broken = f"{column} IS NOT NULL AND ({broken})"
    return broken, f"{column} is not an integer{domain}"


def none_of(expression: str, values: Sequence[str]) -> str:
    """SQL that holds when `expression` is none of the literal `values`: `e != 'a' AND e !=
    'b'`, which is `e NOT IN ('a', 'b')` (NULL for a NULL `e` alike), without the IN list. An
    IN list of literals makes SQLite build a temporary b-tree of them at each execution of the
    statement (OP_Once is per execution): with the nine lists of the children table's check, a
    checked row read cost 19 µs in a node's store (160-240 µs in some), the comparisons 6.5 µs;
    the run supervisor reads a child's checked row at each report of its shim."""
    quoted = [f"'{v.replace(chr(39), chr(39) * 2)}'" for v in values]
    return "(" + " AND ".join(f"{expression} != {q}" for q in quoted) + ")"


def number(column: str, nullable: bool = False) -> Check:
    """`column` holds a number (a REAL or an INTEGER), or NULL when allowed."""
    kinds = ["integer", "real"] + (["null"] if nullable else [])
    return none_of(f"typeof({column})", kinds), f"{column} is not a number"


def text(column: str, nullable: bool = False) -> Check:
    kinds = ["text"] + (["null"] if nullable else [])
    return none_of(f"typeof({column})", kinds), f"{column} is not text"


def json(column: str, nullable: bool = False) -> Check:
    """`column` holds well-formed JSON text (or NULL when allowed)."""
    present = f"{column} IS NOT NULL AND " if nullable else ""
    return f"{present}json_valid({column}) IS NOT 1", f"{column} is not JSON"


def one_of(column: str, values: Iterable[str], nullable: bool = False) -> Check:
    """`column` holds one of `values` (or NULL when allowed)."""
    names = sorted(values)
    missing = "" if nullable else f"{column} IS NULL OR "
    return (
        f"{missing}{none_of(column, names)}",
        f"{column} is not one of {', '.join(names)}",
    )


def broken_rows(
    db: sqlite3.Connection,
    table: str,
    key: str,
    checks: Sequence[Check],
    where: str = "1",
    args: Sequence[object] = (),
) -> list[tuple[str, str]]:
    """(key, reason) of every row of `table` that breaks a check (only among the rows `where`,
    an SQL condition with `args`, selects); `key` is an SQL expression naming the row (e.g.
    "session_id || '/' || slot")."""
    why = problem(checks)
    rows = db.execute(
        f"SELECT {key}, {why} FROM {table} WHERE ({where}) AND {why} IS NOT NULL", args
    ).fetchall()
    return [(str(k), str(reason)) for k, reason in rows]


def reason_of(exc: Exception) -> str:
    """One line on why a stored value did not parse (the first field pydantic names)."""
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "record"
        return f"{where}: {first['msg']}"
    return f"{type(exc).__name__}: {exc}"
