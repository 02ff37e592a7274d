"""An owner's WAL is checkpointed on a thread of its own (runtime/node/checkpointer.py), never
inside the commit that answers a request: SQLite's own checkpoint, every 1,000 pages, stalled
that commit and every request behind it for milliseconds (the claims' p99 at 8 clients)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pykka
import pytest

from subagents_node.actors.context import ActorContext
from subagents_node.actors.fanout import FanoutBudget
from subagents_node.actors.inbox import Job
from subagents_node.messages.fanout import ClaimPaths, CreateBudget, FanoutDescriptor
from subagents_node.node.checkpointer import BACKSTOP_PAGES, WalCheckpointer
from subagents_node.node.store import WAL_SIZE_LIMIT_BYTES, Store
from tests.support.runs import wait_until


def _store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "owner.db")
    store.migrate({"t": ["CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)"]})
    return store


def _commit_rows(db: sqlite3.Connection, n: int, after: Any = None) -> None:
    for i in range(n):
        db.execute("BEGIN")
        db.execute("INSERT INTO t (v) VALUES (?)", ("x" * 2000 + str(i),))  # one page a row
        db.execute("COMMIT")
        if after is not None:
            after()


def _wal_bytes(store: Store) -> int:
    wal = store.path.with_name(store.path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def _burst_past_the_limit(
    store: Store, db: sqlite3.Connection, checkpointer: WalCheckpointer
) -> None:
    """2,000 one-page commits: ~8 MiB of WAL, twice the limit."""
    _commit_rows(db, 2000, after=checkpointer.committed)
    assert _wal_bytes(store) > 1.5 * WAL_SIZE_LIMIT_BYTES  # the burst took the WAL past it


def _db_pages(store: Store) -> int:
    """Pages in the database file itself (what checkpoints have copied out of the WAL)."""
    return store.path.stat().st_size // 4096


def test_with_the_backstop_set_the_owners_own_commits_never_checkpoint(tmp_path: Path) -> None:
    """The control: an owner connection with the backstop leaves 1,500 pages in the WAL,
    where SQLite's default checkpoint would have copied them at 1,000."""
    store = _store(tmp_path)
    before = _db_pages(store)
    db = store.connect(autocheckpoint=BACKSTOP_PAGES)
    try:
        _commit_rows(db, 1500)
        assert _db_pages(store) == before
    finally:
        db.close()


def test_the_checkpointer_copies_the_owners_commits_out_of_the_wal_on_its_own_thread(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    before = _db_pages(store)
    db = store.connect(autocheckpoint=BACKSTOP_PAGES)
    # No quiet tidy within the test: it counts the checkpoints owed by commits alone.
    checkpointer = WalCheckpointer(store.connect, "test", every_commits=100)
    try:
        _commit_rows(db, 99, after=checkpointer.committed)
        assert checkpointer.checkpoints == 0 and _db_pages(store) == before  # not yet due
        _commit_rows(db, 201, after=checkpointer.committed)
        # Due at 100, 200 and 300 commits; calls that come while one is due are one call.
        wait_until(lambda: checkpointer.checkpoints >= 1, timeout=20)
        wait_until(lambda: _db_pages(store) > before + 100, timeout=20)
        assert 1 <= checkpointer.checkpoints <= 3
    finally:
        checkpointer.stop()
        db.close()
    assert not any(t.name == "test-checkpoint" for t in threading.enumerate())


def test_a_failing_checkpoint_is_logged_once_and_the_next_one_goes_ahead(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store(tmp_path)
    refusals = [3]

    def connect() -> sqlite3.Connection:
        if refusals[0]:
            refusals[0] -= 1
            raise sqlite3.OperationalError("database or disk is full")
        return store.connect()

    checkpointer = WalCheckpointer(connect, "test", every_commits=1)
    db = store.connect(autocheckpoint=BACKSTOP_PAGES)
    try:
        with caplog.at_level(logging.INFO, logger="subagents_node.node.checkpointer"):
            for left in (2, 1, 0):  # three refused checkpoints, one commit each
                _commit_rows(db, 1, after=checkpointer.committed)
                wait_until(lambda left=left: refusals[0] == left, timeout=20)  # type: ignore[misc]
            _commit_rows(db, 1, after=checkpointer.committed)
            wait_until(lambda: checkpointer.checkpoints == 1, timeout=20)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "disk is full" in warnings[0].getMessage()
        assert any("work again" in r.getMessage() for r in caplog.records)
    finally:
        checkpointer.stop()
        db.close()


def test_every_commits_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every_commits"):
        WalCheckpointer(_store(tmp_path).connect, "test", every_commits=0)


def test_an_owner_tells_its_runtime_of_each_group_commit(tmp_path: Path) -> None:
    """The seam the checkpointer hangs on: `ActorContext.on_commit`, once per commit."""
    store = Store(tmp_path / "fanout.db")
    store.migrate({FanoutBudget.name: FanoutBudget.MIGRATIONS})
    commits: list[int] = []
    ref = FanoutBudget.start(
        ActorContext(open_db=store.connect, on_commit=lambda: commits.append(1))
    )

    def ask(request: Any) -> Any:
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        ref.tell(Job(request, future.set))
        return future.get(timeout=10)

    try:
        started = len(commits)
        desc = ask(CreateBudget(root_run_id="r", limit=5))
        assert isinstance(desc, FanoutDescriptor)
        ask(ClaimPaths(descriptor=desc, paths=["a"]))
        assert len(commits) == started + 2
    finally:
        ref.stop()


def test_an_owner_that_goes_on_writing_cuts_its_wal_back_to_the_limit_after_a_burst(
    tmp_path: Path,
) -> None:
    """The owner's own connection (`journal_size_limit`): its first commit after a checkpoint
    let the WAL start over cuts the file back, where SQLite would reuse it at its peak."""
    store = _store(tmp_path)
    db = store.connect(autocheckpoint=BACKSTOP_PAGES)
    # One checkpoint, owed at the burst's last commit.
    checkpointer = WalCheckpointer(store.connect, "test", every_commits=2000)
    try:
        _burst_past_the_limit(store, db, checkpointer)
        wait_until(lambda: checkpointer.checkpoints == 1, timeout=20)
        _commit_rows(db, 1)  # the WAL starts over: this commit truncates it
        assert _wal_bytes(store) <= WAL_SIZE_LIMIT_BYTES
        assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 2001
    finally:
        checkpointer.stop()
        db.close()
