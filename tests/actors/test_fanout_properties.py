"""Properties of the fan-out budget owner (SPEC §16 INV-FAN-*), and its reservation deadlines.

The owner runs as a real actor on a real SQLite store, but with a hand-moved clock and timer
queue injected through its ActorContext: a test moves time forward and the owner's expiry timer
fires at once, so deadlines are tested exactly and nothing waits on wall time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
)

from subagents_node.actors.context import ActorContext
from subagents_node.messages.errors import (
    FanoutDescriptorMismatch,
    FanoutLimitExceeded,
    FanoutReservationCommitted,
    FanoutReservationExpired,
)
from subagents_node.messages.fanout import (
    MAX_LIMIT,
    FanoutDescriptor,
    FanoutSnapshot,
    decode_descriptor,
    encode_descriptor,
    extend,
    qualify,
)
from tests.support.fanout_owner import OwnerHarness


@pytest.fixture
def owner() -> Iterator[OwnerHarness]:
    harness = OwnerHarness()
    yield harness
    harness.close()


# -- reservation deadlines (SPEC §0.4, DESIGN §2) ---------------------------------------------


def test_r_fan_14_a_reservation_not_settled_by_its_deadline_is_aborted_by_the_owner(
    owner: OwnerHarness,
) -> None:
    desc = owner.fanout.create("r1", 3)
    res = owner.fanout.reserve(desc, ["a", "b"], ttl_s=30)
    assert res.expires_at == owner.time.now + 30
    owner.time.advance(29.5)
    owner.sync()
    assert owner.fanout.snapshot(desc).used == 2
    owner.time.advance(0.5)
    owner.sync()
    assert owner.rows(
        "SELECT state FROM fanout_reservations WHERE reservation_id = ?", res.reservation_id
    ) == [("expired",)]
    assert owner.rows("SELECT COUNT(*) FROM fanout_claims WHERE budget_id = ?", desc.budget_id) == [
        (0,)
    ]
    before = owner.fanout.snapshot(desc)
    assert before == FanoutSnapshot(used=0, limit=3, remaining=3)
    with pytest.raises(FanoutReservationExpired) as caught:
        res.commit()
    assert caught.value.state == "expired"
    assert owner.fanout.snapshot(desc) == before


def test_r_fan_14_a_commit_after_the_deadline_is_refused_even_before_the_timer_fires(
    owner: OwnerHarness,
) -> None:
    desc = owner.fanout.create("r1", 3)
    res = owner.fanout.reserve(desc, ["a"], ttl_s=10)
    owner.stop()  # nobody hears the timer
    owner.time.advance(10)
    owner.ctx = ActorContext(open_db=owner.store.connect, clock=owner.time.clock)  # no timers
    owner.start()
    with pytest.raises(FanoutReservationExpired):
        res.commit()
    assert owner.fanout.claim(desc, ["b", "c", "d"]).used == 3


def test_r_fan_14_recover_rearms_the_earliest_pending_deadline_after_a_restart(
    owner: OwnerHarness,
) -> None:
    desc = owner.fanout.create("r1", 5)
    soon = owner.fanout.reserve(desc, ["a"], ttl_s=10)
    later = owner.fanout.reserve(desc, ["b", "c"], ttl_s=100)
    owner.restart()
    owner.sync()
    assert owner.time.armed() == [soon.expires_at]  # one timer, at the earliest deadline
    owner.time.advance(10)
    owner.sync()
    assert owner.time.armed() == [later.expires_at]
    states = dict(owner.rows("SELECT reservation_id, state FROM fanout_reservations"))
    assert (states[soon.reservation_id], states[later.reservation_id]) == ("expired", "pending")
    owner.restart()
    owner.time.advance(90)
    owner.sync()
    assert owner.overdue_pending() == 0
    assert owner.fanout.snapshot(desc).used == 0


def test_r_fan_14_a_deadline_that_passed_while_the_owner_was_down_aborts_at_once(
    owner: OwnerHarness,
) -> None:
    desc = owner.fanout.create("r1", 2)
    res = owner.fanout.reserve(desc, ["a", "b"], ttl_s=5)
    committed = owner.fanout.reserve(desc, [], ttl_s=5)
    committed.commit()
    owner.stop()
    owner.time.advance(60)
    owner.start()
    owner.sync()
    assert owner.overdue_pending() == 0
    assert owner.rows(
        "SELECT state FROM fanout_reservations WHERE reservation_id = ?", res.reservation_id
    ) == [("expired",)]
    assert owner.fanout.snapshot(desc).used == 0


# -- INV-FAN-7: encoding and qualification ----------------------------------------------------

_text = st.text(min_size=1, max_size=40)
_segment = st.text(min_size=1, max_size=20).filter(lambda s: s == s.strip() and "/" not in s)

descriptors = st.builds(
    FanoutDescriptor,
    root_run_id=_text,
    budget_id=_text,
    limit=st.integers(1, MAX_LIMIT),
    parent_path=st.text(max_size=40),
    node=st.text(max_size=40),
)


@given(descriptors)
def test_inv_fan_7_decode_of_encode_is_the_descriptor(desc: FanoutDescriptor) -> None:
    encoded = encode_descriptor(desc)
    assert decode_descriptor(encoded) == desc
    assert encoded.isascii() and "=" not in encoded


def test_inv_fan_7_decode_of_encode_equals_validate(owner: OwnerHarness) -> None:
    base = owner.fanout.create("r1", 9)

    @settings(max_examples=40, deadline=None)
    @given(parent=st.text(max_size=30), node=st.text(max_size=30))
    def check(parent: str, node: str) -> None:
        desc = FanoutDescriptor.model_validate(
            {**base.model_dump(), "parent_path": parent, "node": node}
        )
        assert owner.fanout.validate(desc) == decode_descriptor(encode_descriptor(desc)) == desc

    check()


@given(a=_segment, b=_segment, path=_segment)
def test_inv_fan_7_qualification_composes(a: str, b: str, path: str) -> None:
    root = FanoutDescriptor(root_run_id="r", budget_id="b", limit=1)
    child = extend(extend(root, a), b)
    assert child.parent_path == f"{a}/{b}"
    assert qualify(child.parent_path, path) == f"{a}/{b}/{path}"


# -- the owner against a reference model (INV-FAN-1..8) ---------------------------------------


@dataclass
class ModelReservation:
    budget_id: str
    claims: int
    deadline: float
    state: str = "pending"


@dataclass
class ModelBudget:
    limit: int
    permanent: int = 0


class FanoutMachine(RuleBasedStateMachine):
    budgets = Bundle("budgets")
    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        self.owner = OwnerHarness()
        self.model: dict[str, ModelBudget] = {}
        self.held: dict[str, ModelReservation] = {}

    def teardown(self) -> None:
        self.owner.close()

    def pending_claims(self, budget_id: str) -> int:
        return sum(
            r.claims
            for r in self.held.values()
            if r.budget_id == budget_id and r.state == "pending"
        )

    def stored_counts(self) -> list[tuple[Any, ...]]:
        """(budget id, its `used`, its claim rows) of every stored budget."""
        return self.owner.rows(
            "SELECT b.budget_id, b.used, (SELECT COUNT(*) FROM fanout_claims c "
            "WHERE c.budget_id = b.budget_id) FROM fanout_budgets b"
        )

    def expected(self, budget_id: str) -> FanoutSnapshot:
        used = self.model[budget_id].permanent + self.pending_claims(budget_id)
        return FanoutSnapshot.of(used, self.model[budget_id].limit)

    def expect_rejection(
        self, desc: FanoutDescriptor, paths: list[str], call: Callable[[], object]
    ) -> None:
        before = self.expected(desc.budget_id)
        with pytest.raises(FanoutLimitExceeded) as caught:
            call()
        rejection = caught.value.rejection
        # INV-FAN-6
        assert rejection.requested == len(paths)
        assert (rejection.used, rejection.limit, rejection.remaining) == (
            before.used,
            before.limit,
            before.remaining,
        )
        assert rejection.used + rejection.remaining == rejection.limit
        assert rejection.path == qualify(desc.parent_path, paths[rejection.remaining])

    @rule(
        target=budgets,
        limit=st.integers(1, 6),
        segment=st.sampled_from(["", "workflow[scan]", "r1", "chain[0].parallel[1]"]),
    )
    def create(self, limit: int, segment: str) -> FanoutDescriptor:
        desc = self.owner.fanout.create("root", limit)
        self.model[desc.budget_id] = ModelBudget(limit)
        return extend(desc, segment) if segment else desc

    @rule(desc=budgets, n=st.integers(0, 4))
    def claim(self, desc: FanoutDescriptor, n: int) -> None:
        paths = [f"tasks[{i}]" for i in range(n)]
        before = self.expected(desc.budget_id)
        if n > before.remaining:
            self.expect_rejection(desc, paths, lambda: self.owner.fanout.claim(desc, paths))
            return
        snap = self.owner.fanout.claim(desc, paths)
        self.model[desc.budget_id].permanent += n
        assert snap.used == before.used + n  # INV-FAN-2

    @rule(target=reservations, desc=budgets, n=st.integers(0, 3), ttl=st.integers(1, 20))
    def reserve(self, desc: FanoutDescriptor, n: int, ttl: int) -> object:
        paths = [f"chain[{i}]" for i in range(n)]
        before = self.expected(desc.budget_id)
        if n > before.remaining:
            self.expect_rejection(
                desc, paths, lambda: self.owner.fanout.reserve(desc, paths, ttl_s=ttl)
            )
            return multiple()
        res = self.owner.fanout.reserve(desc, paths, ttl_s=ttl)
        assert res.snapshot.used == before.used + n
        self.held[res.reservation_id] = ModelReservation(
            desc.budget_id, n, self.owner.time.now + ttl
        )
        return res.reservation_id

    @rule(reservation_id=reservations)
    def commit(self, reservation_id: str) -> None:
        held = self.held[reservation_id]
        if held.state in ("aborted", "expired"):
            with pytest.raises(FanoutReservationExpired) as caught:
                self.owner.fanout.commit(reservation_id)
            assert caught.value.state == held.state
            return
        self.owner.fanout.commit(reservation_id)
        if held.state == "pending":
            held.state = "committed"
            self.model[held.budget_id].permanent += held.claims

    @rule(reservation_id=reservations)
    def abort(self, reservation_id: str) -> None:
        held = self.held[reservation_id]
        if held.state == "committed":
            with pytest.raises(FanoutReservationCommitted):
                self.owner.fanout.abort(reservation_id)
            return
        self.owner.fanout.abort(reservation_id)
        if held.state == "pending":
            held.state = "aborted"

    @rule(seconds=st.integers(0, 15))
    def advance(self, seconds: int) -> None:
        self.owner.time.advance(seconds)
        for held in self.held.values():
            if held.state == "pending" and held.deadline <= self.owner.time.now:
                held.state = "expired"
        self.owner.sync()
        assert self.owner.overdue_pending() == 0  # the timer did it, not a request

    @rule()
    def restart(self) -> None:
        self.owner.restart()
        self.owner.sync()

    @rule(desc=budgets, raise_by=st.integers(1, 3))
    def forged_limit_is_refused(self, desc: FanoutDescriptor, raise_by: int) -> None:
        forged = desc.model_copy(update={"limit": desc.limit + raise_by})
        with pytest.raises(FanoutDescriptorMismatch):  # INV-FAN-8
            self.owner.fanout.claim(forged, ["x"])

    @invariant()
    def snapshots_match_the_model(self) -> None:
        for budget_id in self.model:
            desc = FanoutDescriptor(
                root_run_id="root", budget_id=budget_id, limit=self.model[budget_id].limit
            )
            snap = self.owner.fanout.snapshot(desc)
            assert snap == self.expected(budget_id)
            assert snap.used <= snap.limit  # INV-FAN-1

    @invariant()
    def used_equals_the_stored_claims(self) -> None:
        rows = self.stored_counts()
        for budget_id, used, claims in rows:
            assert used == claims, budget_id


FanoutMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_inv_fan_owner_matches_the_reference_model = FanoutMachine.TestCase


class CompactingFanoutMachine(FanoutMachine):
    """The same model with claim compaction on: a retention of 30 s against steps of up to
    15 s, so idle budgets lose their claim rows between steps (compaction.py). Every decision
    and snapshot still matches the model (R-FAN-15: a compacted budget keeps its count), no
    claim row of a pending reservation is ever deleted, and no budget keeps more rows than its
    count."""

    def __init__(self) -> None:
        super().__init__()
        self.owner.close()
        self.owner = OwnerHarness(settings={"run_retention_days": 30 / 86_400})

    @invariant()
    def used_equals_the_stored_claims(self) -> None:
        rows = self.stored_counts()
        for budget_id, used, claims in rows:
            assert claims <= used, budget_id
            if claims < used:
                event("a budget's claim rows were compacted")
        for reservation_id, held in self.held.items():
            if held.state == "pending":
                kept = self.owner.rows(
                    "SELECT COUNT(*) FROM fanout_claims WHERE reservation_id = ?", reservation_id
                )
                assert kept == [(held.claims,)], reservation_id


CompactingFanoutMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_r_fan_15_compaction_changes_no_decision_of_the_reference_model = (
    CompactingFanoutMachine.TestCase
)
