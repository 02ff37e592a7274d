"""What every run view and listing asks of the run supervisor's store is answered by an index,
never by a scan of the whole run history: the supervisor is single-threaded, and with tens of
thousands of runs kept (30 days by default) a scan per view made `runs` take seconds and held
every launch and child report behind it. Checked on SQLite's own query plans, on a real store
migrated as the supervisor migrates it."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subagents_node.actors.child import rows as child_rows
from subagents_node.actors.runs import checkpoints, runschema, runstore
from subagents_node.actors.runs.retention import RunRetention
from subagents_node.node.store import Store


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    store = Store(tmp_path / "runs.db")
    store.migrate({"supervisor": runschema.MIGRATIONS, "children": child_rows.MIGRATIONS})
    conn = store.connect()
    yield conn
    conn.close()


def _plans(
    db: sqlite3.Connection,
    ask: Callable[[sqlite3.Connection], object],
    tables: tuple[str, ...] = ("runs",),
) -> list[str]:
    """The query plan of every SELECT on one of `tables` that `ask` runs."""
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    try:
        ask(db)
    finally:
        db.set_trace_callback(None)
    return [
        " / ".join(str(row[3]) for row in db.execute(f"EXPLAIN QUERY PLAN {sql}"))
        for sql in statements
        if sql.lstrip().upper().startswith("SELECT")
        and any(f" FROM {table} " in f"{sql} " for table in tables)
    ]


ASKS: dict[str, Callable[[sqlite3.Connection], object]] = {
    "resumed by (every view)": lambda db: runstore.resumed_by(db, "r1"),
    "continued by (resume, approve)": lambda db: checkpoints.successor(db, "r1"),
    "runs, newest first": lambda db: runstore.list_runs(db, None, False, 50),
    "active runs": lambda db: runstore.list_runs(db, None, True, 50),
    "one session's runs": lambda db: runstore.list_runs(db, "s1", False, 50),
    "one run tree's runs": lambda db: runstore.list_runs(db, None, False, 50, root_run_id="r1"),
    "one run's children": lambda db: runstore.list_runs(db, None, False, 50, parent_run_id="r1"),
    "the next page of a run's children": lambda db: runstore.list_runs(
        db, None, False, 50, parent_run_id="r1", after_run_id="r9"
    ),
    "the next page of runs": lambda db: runstore.list_runs(db, None, False, 50, after_run_id="r9"),
    "one session's active runs (capacity)": lambda db: runstore.list_runs(db, "s1", True, 50),
}


@pytest.mark.parametrize("what", list(ASKS))
def test_a_view_or_listing_never_scans_the_run_history(db: sqlite3.Connection, what: str) -> None:
    plans = _plans(db, ASKS[what])
    assert plans, f"{what}: no SELECT on runs was traced"
    for plan in plans:
        # Walking an index in its order up to the LIMIT is fine (`runs` lists the newest
        # first); reading every row, or sorting all of them, is not.
        assert not re.search(r"SCAN runs(?! USING (COVERING )?INDEX)", plan), f"{what}: {plan}"
        assert "SCAN" not in plan or "TEMP B-TREE" not in plan, f"{what}: {plan}"


def test_paging_a_listing_by_its_last_run_skips_and_repeats_no_run_even_at_one_instant(
    db: sqlite3.Connection,
) -> None:
    """Children created in one instant (one batch) share created_at: run_id orders them, so a
    page that ends among them goes on with the next one."""
    times = [1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 2.0]
    for n, created in enumerate(times):
        db.execute(
            "INSERT INTO runs (run_id, session_id, mode, background, state, label, depth, "
            "parent_run_id, root_run_id, run_dir, created_at, runner_id, snapshots) "
            "VALUES (?, 's1', 'single', 0, 'complete', '', 1, 'p', 'p', '', ?, '', '{}')",
            (f"c{n}", created),
        )
    pages: list[list[str]] = []
    after: str | None = None
    while not pages or len(pages[-1]) == 2:
        pages.append(runstore.list_runs(db, None, False, 2, parent_run_id="p", after_run_id=after))
        after = pages[-1][-1] if pages[-1] else None

    listed = [run_id for page in pages for run_id in page]
    assert listed == ["c5", "c6", "c4", "c3", "c2", "c1", "c0"]


def _retention(db: sqlite3.Connection) -> RunRetention:
    """Retention of one day, its timer never firing (only its queries are looked at)."""
    return RunRetention(
        runs_root=lambda: Path("/nonexistent"),
        retention_s=86_400.0,
        after=lambda delay, tick: lambda: None,
        after_commit=lambda then: None,
        clock=lambda: 1e9,
        announce=lambda pruned: None,
    )


#: What the supervisor asks at every start and on retention's timer: bounded by the runs that
#: may still be going, or by the page of runs pruned, never by the history.
BOUNDED: dict[str, Callable[[sqlite3.Connection], object]] = {
    "recovery: unreadable runs and their children": runstore.unreadable,
    "recovery: unreadable child processes": lambda db: child_rows.unreadable(db, ["r1"]),
    "recovery: settled workflows awaiting a child": runstore.workflows_awaiting_children,
    "retention: the oldest end (its timer)": lambda db: _retention(db).arm(db),
    "retention: the runs past the cutoff": lambda db: _retention(db).prunable(
        db, 1e9, lambda run_id: False
    ),
}


@pytest.mark.parametrize("what", list(BOUNDED))
def test_recovery_and_retention_never_read_every_finished_run(
    db: sqlite3.Connection, what: str
) -> None:
    """A node with tens of thousands of finished runs starts, and arms retention, by index:
    each query searches an index (no scan, no sort of every row)."""
    plans = _plans(db, BOUNDED[what], ("runs", "run_children", "children"))
    assert plans, f"{what}: no SELECT was traced"
    for plan in plans:
        assert "SCAN" not in plan, f"{what}: {plan}"
        assert "TEMP B-TREE" not in plan, f"{what}: {plan}"
        if what.startswith("retention"):  # from the oldest end, up to what it needs
            assert "runs_by_end" in plan, f"{what}: {plan}"


def test_a_sessions_active_runs_are_read_without_its_finished_ones(db: sqlite3.Connection) -> None:
    """`capacity` and `runs --session --active` walk an index of the session's runs that may
    still be going, not every run the session ever had (a fleet's session keeps thousands)."""
    (plan,) = _plans(db, lambda db: runstore.list_runs(db, "s1", True, 50))
    assert "runs_active_by_session" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def _run(db: sqlite3.Connection, run_id: str) -> None:
    db.execute(
        "INSERT INTO runs (run_id, session_id, mode, background, state, label, depth, "
        "root_run_id, run_dir, created_at, runner_id, snapshots) "
        "VALUES (?, 's1', 'single', 0, 'complete', '', 0, ?, '', 1.0, '', '{}')",
        (run_id, run_id),
    )


def test_a_run_id_prefix_is_resolved_by_a_range_of_the_key_not_a_scan(
    db: sqlite3.Connection,
) -> None:
    """`show`, `logs`, `wait` and `stop` take a prefix of a run id: it is looked up on the
    primary key, so naming a run by its first characters costs the same with any history."""
    for run_id in ("0abc12345678", "0abd00000000", "a_b%c\\d0000", "ffff\U0010ffff", "zz\ud7ffx"):
        _run(db, run_id)
    plans = _plans(db, lambda db: runstore.resolve_run_id(db, "0abc"))
    assert len(plans) == 2, plans  # the exact id, then the prefix
    for plan in plans:
        assert "SCAN" not in plan, plan
    assert runstore.resolve_run_id(db, "0abc") == "0abc12345678"
    assert runstore.resolve_run_id(db, "0ABC") == "0abc12345678"  # the node's ids are lowercase
    assert runstore.resolve_run_id(db, "a_b%") == "a_b%c\\d0000"  # no wildcards in a prefix
    assert runstore.resolve_run_id(db, "a%") is None
    assert runstore.resolve_run_id(db, "ffff\U0010ffff") == "ffff\U0010ffff"
    assert runstore.resolve_run_id(db, "ffff") == "ffff\U0010ffff"
    assert runstore.resolve_run_id(db, "zz\ud7ff") == "zz\ud7ffx"  # above it: U+E000
    with pytest.raises(LookupError):
        runstore.resolve_run_id(db, "0ab")
    assert runstore.resolve_run_id(db, "0abe") is None


def test_settled_workflows_awaiting_a_child_are_found_from_the_live_runs(
    db: sqlite3.Connection,
) -> None:
    """R-CAP-22 after a restart: a settled workflow holding a slot while a child of its runs."""
    rows = [  # run_id, mode, state, capacity, parent
        ("w1", "workflow", "complete", "slot", None),
        ("c1", "single", "running", None, "w1"),
        ("c2", "single", "queued", None, "w1"),
        ("w2", "workflow", "complete", "slot", None),
        ("c3", "single", "complete", None, "w2"),
        ("w3", "workflow", "running", "slot", None),
        ("c4", "single", "running", None, "w3"),
        ("w4", "workflow", "failed", "", None),
        ("c5", "single", "paused", None, "w4"),
        ("p1", "single", "complete", "slot", None),
        ("c6", "single", "running", None, "p1"),
    ]
    for run_id, mode, state, capacity, parent in rows:
        db.execute(
            "INSERT INTO runs (run_id, session_id, mode, background, state, label, depth, "
            "parent_run_id, root_run_id, run_dir, created_at, runner_id, snapshots, capacity) "
            "VALUES (?, 's1', ?, 1, ?, '', 0, ?, ?, '', 1.0, '', '{}', ?)",
            (run_id, mode, state, parent, parent or run_id, capacity),
        )
    assert runstore.workflows_awaiting_children(db) == ["w1"]
