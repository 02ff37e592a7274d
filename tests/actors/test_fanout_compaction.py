"""How long the fan-out owner keeps claim rows (actors/fanout/compaction.py).

Every child ever launched left one `fanout_claims` row for good, and nothing bounded
`fanout.db` (the original's budget stores were never collected either: SPEC §17). A budget
idle for the retention period (`run_retention_days`) loses its claim rows; its count and its
reservations' records stay, so no decision and no answer changes (R-FAN-15: nothing is
refunded).

The owner runs on a real store with a hand-moved clock (tests/support/fanout_owner.py): moving
time fires its timer at once, so nothing here waits on wall time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subagents_node.actors.fanout import FanoutBudget
from subagents_node.actors.fanout.compaction import (
    BUDGETS_PER_PASS,
    CLAIMS_PER_PASS,
    RECHECK_S,
    ClaimCompaction,
)
from subagents_node.messages.errors import (
    FanoutLimitExceeded,
    FanoutReservationExpired,
    RecordQuarantined,
)
from subagents_node.messages.fanout import MAX_PATHS, FanoutDescriptor, FanoutSnapshot
from subagents_node.node.store import Store
from tests.support.fanout_owner import OwnerHarness

DAY = 86_400.0


@pytest.fixture
def owner() -> Iterator[OwnerHarness]:
    harness = OwnerHarness(settings={"run_retention_days": 1})
    yield harness
    harness.close()


def claim_rows(owner: OwnerHarness, desc: FanoutDescriptor) -> int:
    (row,) = owner.rows("SELECT COUNT(*) FROM fanout_claims WHERE budget_id = ?", desc.budget_id)
    return int(str(row[0]))


def compacted(owner: OwnerHarness, desc: FanoutDescriptor) -> bool:
    (row,) = owner.rows(
        "SELECT claims_compacted_at FROM fanout_budgets WHERE budget_id = ?", desc.budget_id
    )
    return row[0] is not None


def settle(check: Callable[[], bool], owner: OwnerHarness, rounds: int = 50) -> None:
    """Sync with the owner until `check` holds: a pass that had more to do queues the next
    one behind the requests already waiting, so it can land after one sync."""
    for _ in range(rounds):
        owner.sync()
        if check():
            return
    raise AssertionError("the owner did not get there")


def test_r_fan_15_an_idle_budget_loses_its_claim_rows_but_keeps_its_count(
    owner: OwnerHarness,
) -> None:
    desc = owner.fanout.create("r1", 5)
    owner.fanout.claim(desc, ["a", "b", "c"])
    owner.time.advance(DAY - 1)
    owner.sync()
    assert claim_rows(owner, desc) == 3  # not idle long enough yet
    owner.time.advance(2)
    owner.sync()
    assert (claim_rows(owner, desc), compacted(owner, desc)) == (0, True)
    assert owner.fanout.snapshot(desc) == FanoutSnapshot(used=3, limit=5, remaining=2)
    # Every later decision is the one it would have been: 3 more do not fit, 2 do.
    with pytest.raises(FanoutLimitExceeded) as caught:
        owner.fanout.claim(desc, ["d", "e", "f"])
    rejection = caught.value.rejection
    assert (rejection.used, rejection.remaining, rejection.path) == (3, 2, "f")
    assert owner.fanout.claim(desc, ["d", "e"]).used == 5
    # A tree that claims again keeps its new rows until it is idle again.
    assert (claim_rows(owner, desc), compacted(owner, desc)) == (2, False)
    owner.time.advance(DAY + 1)
    settle(lambda: compacted(owner, desc), owner)
    assert claim_rows(owner, desc) == 0
    assert owner.fanout.snapshot(desc).used == 5


def test_a_budget_claimed_within_the_retention_keeps_every_claim_row(
    owner: OwnerHarness,
) -> None:
    desc = owner.fanout.create("r1", 10)
    owner.fanout.claim(desc, ["a"])
    owner.time.advance(DAY / 2)
    last_claim = owner.time.now
    owner.fanout.claim(desc, ["b"])  # the tree is still launching
    owner.time.advance(DAY / 2 + 1)  # a day after its creation, half a day after its last claim
    owner.sync()
    assert (claim_rows(owner, desc), compacted(owner, desc)) == (2, False)
    # The skipped budget is looked at again when it can first have been idle long enough.
    assert owner.time.armed() == [last_claim + DAY]
    owner.time.advance(last_claim + DAY - owner.time.now - 1)
    owner.sync()
    assert (claim_rows(owner, desc), compacted(owner, desc)) == (2, False)
    owner.time.advance(1)
    owner.sync()
    assert (claim_rows(owner, desc), compacted(owner, desc)) == (0, True)
    assert owner.time.armed() == []  # nothing left to compact: no timer


@pytest.fixture
def short() -> Iterator[OwnerHarness]:
    """Retention shorter than a reservation's longest TTL (an hour)."""
    harness = OwnerHarness(settings={"run_retention_days": 600 / DAY})
    yield harness
    harness.close()


def test_r_fan_14_a_pending_reservation_keeps_its_budget_whole_and_a_settled_one_its_answer(
    short: OwnerHarness,
) -> None:
    owner = short
    desc = owner.fanout.create("r1", 5)
    owner.fanout.claim(desc, ["a"])
    pending = owner.fanout.reserve(desc, ["b", "c"], ttl_s=3000)
    done = owner.fanout.reserve(desc, ["d"], ttl_s=60)
    done.commit()
    owner.time.advance(601)
    owner.sync()
    assert (claim_rows(owner, desc), compacted(owner, desc)) == (4, False)
    # Its claims are still there to release: abort gives them back.
    assert pending.abort().used == 2
    owner.time.advance(RECHECK_S)
    owner.sync()
    assert (claim_rows(owner, desc), compacted(owner, desc)) == (0, True)
    assert owner.fanout.snapshot(desc).used == 2
    # The reservations' records stay: a late settle is answered exactly as before it.
    assert done.commit().used == 2
    assert pending.abort().used == 2
    with pytest.raises(FanoutReservationExpired) as caught:
        pending.commit()
    assert caught.value.state == "aborted"


def test_a_quarantined_budget_is_never_compacted(owner: OwnerHarness) -> None:
    broken = owner.fanout.create("r1", 5)
    owner.fanout.claim(broken, ["a"])
    fine = owner.fanout.create("r2", 5)
    owner.fanout.claim(fine, ["a"])
    owner.stop()
    with sqlite3.connect(owner.store.path) as conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")  # as a foreign writer would
        conn.execute(
            "UPDATE fanout_budgets SET used = 'lots' WHERE budget_id = ?", (broken.budget_id,)
        )
    owner.time.advance(DAY + 1)
    owner.start()
    owner.sync()
    assert (claim_rows(owner, broken), compacted(owner, broken)) == (1, False)
    assert (claim_rows(owner, fine), compacted(owner, fine)) == (0, True)
    with pytest.raises(RecordQuarantined):
        owner.fanout.claim(broken, ["b"])


def test_retention_passed_while_the_owner_was_down_compacts_at_its_start(
    owner: OwnerHarness,
) -> None:
    desc = owner.fanout.create("r1", 5)
    owner.fanout.claim(desc, ["a", "b"])
    owner.stop()
    owner.time.advance(3 * DAY)
    owner.start()
    owner.sync()
    assert (claim_rows(owner, desc), compacted(owner, desc)) == (0, True)
    assert owner.fanout.snapshot(desc).used == 2


def test_a_pass_looks_at_a_bounded_number_of_budgets_and_the_next_passes_finish(
    owner: OwnerHarness,
) -> None:
    budgets = [owner.fanout.create(f"r{i}", 2) for i in range(BUDGETS_PER_PASS + 40)]
    for desc in budgets:
        owner.fanout.claim(desc, ["a"])
    owner.time.advance(DAY + 1)
    settle(lambda: all(compacted(owner, d) for d in budgets), owner)
    (row,) = owner.rows("SELECT COUNT(*) FROM fanout_claims")
    assert row == (0,)


def test_retention_zero_keeps_every_claim_and_arms_no_timer() -> None:
    harness = OwnerHarness(settings={"run_retention_days": 0})
    try:
        desc = harness.fanout.create("r1", 5)
        harness.fanout.claim(desc, ["a"])
        assert harness.time.armed() == []
        harness.time.advance(365 * DAY)
        harness.sync()
        assert (claim_rows(harness, desc), compacted(harness, desc)) == (1, False)
    finally:
        harness.close()


def test_a_budget_with_more_claims_than_a_pass_deletes_is_compacted_over_several_passes(
    owner: OwnerHarness,
) -> None:
    total = CLAIMS_PER_PASS * 2 + 500
    desc = owner.fanout.create("big", total)
    for start in range(0, total, MAX_PATHS):
        owner.fanout.claim(desc, [f"c{i}" for i in range(start, min(total, start + MAX_PATHS))])
    owner.time.advance(DAY + 1)
    settle(lambda: compacted(owner, desc), owner)
    assert claim_rows(owner, desc) == 0
    assert owner.fanout.snapshot(desc) == FanoutSnapshot(used=total, limit=total, remaining=0)


def test_one_pass_deletes_at_most_claims_per_pass_rows_and_asks_for_the_next_at_once(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "fanout.db")
    store.migrate({FanoutBudget.name: FanoutBudget.MIGRATIONS})
    db = store.connect()
    total = CLAIMS_PER_PASS + 700
    db.execute(
        "INSERT INTO fanout_budgets(budget_id, root_run_id, claim_limit, used, next_seq, "
        "created_at) VALUES ('b', 'r', ?, ?, ?, 0)",
        (total, total, total),
    )
    db.executemany(
        "INSERT INTO fanout_claims(budget_id, seq, path, claimed_at) VALUES ('b', ?, 'p', 0)",
        [(i,) for i in range(total)],
    )
    asked: list[float] = []

    def after(delay: float, tick: object) -> Callable[[], None]:
        asked.append(delay)
        return lambda: None

    def one(sql: str) -> tuple[object, ...]:
        return tuple(db.execute(sql).fetchone())

    compaction = ClaimCompaction(DAY, after, lambda: 2 * DAY)
    assert compaction.due(db) == 0  # not done with it yet
    assert one("SELECT COUNT(*), MIN(seq) FROM fanout_claims") == (700, CLAIMS_PER_PASS)
    assert asked == [0.0]
    assert compaction.due(db) == 1
    assert one("SELECT COUNT(*) FROM fanout_claims") == (0,)
    assert one("SELECT used FROM fanout_budgets") == (total,)
    db.close()
