"""The owner-actor rules every ledger relies on (actors/base.py): a store failure answers the
message with a typed error and restarts the owner from the store; it never ends the actor."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pykka

from subagents_node.actors.context import ActorContext
from subagents_node.actors.fanout import FanoutBudget
from subagents_node.actors.inbox import Job
from subagents_node.messages.errors import Internal
from subagents_node.messages.fanout import CreateBudget, FanoutDescriptor
from subagents_node.node.store import Store


def ask(ref: pykka.ActorRef[Any], request: Any) -> Any:
    future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    ref.tell(Job(request, future.set))
    return future.get(timeout=10)


def test_a_locked_store_answers_internal_and_the_owner_keeps_serving(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.migrate({FanoutBudget.name: FanoutBudget.MIGRATIONS})
    crashes: list[str] = []

    def open_db() -> sqlite3.Connection:
        conn = store.connect()
        conn.execute("PRAGMA busy_timeout=50")  # give up on a held lock after 50 ms
        return conn

    ctx = ActorContext(open_db=open_db, report_crash=lambda name, exc: crashes.append(name))
    ref = FanoutBudget.start(ctx)
    blocker = store.connect()
    try:
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds the database
        refused = ask(ref, CreateBudget(root_run_id="r", limit=5))
        assert isinstance(refused, Internal)
        assert crashes == ["fanout"]  # counted against the restart intensity
        blocker.execute("ROLLBACK")

        created = ask(ref, CreateBudget(root_run_id="r", limit=5))
        assert isinstance(created, FanoutDescriptor) and created.limit == 5
        assert ref.is_alive()
    finally:
        blocker.close()
        ref.stop()


def test_a_read_only_query_is_answered_while_another_writer_holds_the_store(
    tmp_path: Path,
) -> None:
    """Queries never take the write lock: they are answered even while another connection
    holds it (a write would wait for it, or fail after its busy timeout)."""
    from subagents_node.actors.capacity.ledger import CapacityLedger
    from subagents_node.messages.capacity import CapacitySnapshot, Snapshot

    store = Store(tmp_path / "state.db")
    store.migrate({CapacityLedger.name: CapacityLedger.MIGRATIONS})

    def open_db() -> sqlite3.Connection:
        conn = store.connect()
        conn.execute("PRAGMA busy_timeout=50")
        return conn

    ref = CapacityLedger.start(ActorContext(open_db=open_db))
    blocker = store.connect()
    try:
        blocker.execute("BEGIN IMMEDIATE")
        answer = ask(ref, Snapshot(session_id="s", limit=4))
        assert answer == CapacitySnapshot(used=0, limit=4)
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
        ref.stop()
