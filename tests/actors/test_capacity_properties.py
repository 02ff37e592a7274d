"""Capacity invariants (SPEC §16 INV-CAP-*) against a reference model, on a hand-driven clock.

The CapacityLedger runs as a real actor on a real store, but its clock and timer are a
`ManualClock`: time moves only when a test says so, and the TTL ticks it fires go through the
actor's inbox exactly as the node's timer thread would deliver them. `Harness.settle()` waits
until every tick that fired (including ticks armed while handling ticks) has been handled.
"""

from __future__ import annotations

import heapq
import itertools
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from subagents_node.actors.capacity.ledger import CapacityLedger
from subagents_node.actors.context import ActorContext
from subagents_node.messages.capacity import TERMINAL_STATES, RunnerProof, SlotHandle, SlotRecord
from subagents_node.messages.errors import (
    CapacityExhausted,
    CapacityNotTransferable,
    CapacityOwnershipChanged,
    CapacityRunAlreadyHeld,
)
from subagents_node.node.store import Store
from tests.support.nodes import short_dir
from tests.support.owners import LoopHost

# -- a ledger on a manual clock -------------------------------------------------------------


class ManualClock:
    """Wall clock and timer for one actor; `advance` fires what became due, in deadline order."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.fired = 0
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()  # the actor arms timers from its own thread

    def clock(self) -> float:
        return self.now

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            heapq.heappush(self._due, (self.now + delay_s, next(self._seq), fn))
        self._fire_due()
        return lambda: None

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
        self._fire_due()

    def _fire_due(self) -> None:
        while True:
            with self._lock:
                if not self._due or self._due[0][0] > self.now:
                    return
                _, _, fn = heapq.heappop(self._due)
                self.fired += 1
            fn()


class Harness:
    """A CapacityLedger on its own store, reached through the real client API."""

    def __init__(self, directory: Path) -> None:
        store = Store(directory / "state.db")
        store.migrate({CapacityLedger.name: CapacityLedger.MIGRATIONS})
        self.time = ManualClock()
        ctx = ActorContext(
            open_db=store.connect, schedule=self.time.schedule, clock=self.time.clock
        )
        # The owner runs on the loop an owner process runs, reached over its own socket;
        # ticks are posted to its inbox, many at once when the clock jumps (its mailbox bound,
        # backpressure for clients, is not what these tests are about).
        self.host = LoopHost(CapacityLedger, ctx, directory).start()
        self.client = self.host.client

    def advance(self, seconds: float) -> None:
        self.time.advance(seconds)
        self.settle()

    def settle(self) -> None:
        """Return once every fired tick, and every tick those armed at once, was handled."""
        while True:
            fired = self.time.fired
            self.client.capacity.snapshot("barrier")  # the inbox is FIFO: ticks come first
            if self.time.fired == fired:
                return

    def stop(self) -> None:
        self.host.close()


@pytest.fixture
def harness() -> Iterator[Harness]:
    directory = short_dir()
    running = Harness(directory)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(directory, ignore_errors=True)


# -- TTL fencing ----------------------------------------------------------------------------


def test_ttl_tick_never_frees_a_slot_that_has_started(harness: Harness) -> None:
    handle = harness.client.capacity.acquire(session_id="s", limit=2, run_id="a", ttl_s=10)
    assert handle is not None
    harness.advance(5)
    handle.mark_started(runner_id="runner-a")
    harness.advance(60)
    assert harness.client.capacity.snapshot("s").used == 1


def test_r_cap_21_a_report_repeated_after_its_runner_started_is_judged_again(
    harness: Harness,
) -> None:
    """Found by the state machine below: a report whose facts were stored while the slot had
    no runner yet was taken, when sent again after the runner started, for a replay. The
    verdict said releasable (the proof matched the runner now) but the slot was never freed."""
    capacity = harness.client.capacity
    handle = capacity.acquire(session_id="s", limit=1, run_id="a", ttl_s=10)
    assert handle is not None
    proof = RunnerProof(state="observed", runner_id="runner-a")
    first = capacity.report_terminal("s", "a", "failed", live_process=False, proof=proof)
    assert first.verdict != "releasable"  # no runner on the slot: the proof matches nobody
    handle.mark_started(runner_id="runner-a")
    again = capacity.report_terminal("s", "a", "failed", live_process=False, proof=proof)
    assert again.verdict == "releasable"
    assert capacity.snapshot("s").used == 0


def test_ttl_tick_never_frees_a_slot_that_changed_hands(harness: Harness) -> None:
    capacity = harness.client.capacity
    first = capacity.acquire(session_id="s", limit=1, run_id="a", ttl_s=10)
    assert first is not None and first.rollback()
    harness.advance(5)
    second = capacity.acquire(session_id="s", limit=1, run_id="b", ttl_s=10)
    assert second is not None and second.slot == first.slot
    harness.advance(6)  # the first grant's deadline passes: its tick is fenced off
    assert capacity.inspect("b", "s").relation == "current"
    harness.advance(4)  # the second grant's own deadline
    assert capacity.snapshot("s").used == 0


def test_ttl_expiry_exactly_at_the_deadline_frees_the_slot(harness: Harness) -> None:
    assert harness.client.capacity.acquire(session_id="s", limit=1, run_id="a", ttl_s=10)
    harness.advance(9.5)
    assert harness.client.capacity.snapshot("s").used == 1
    harness.advance(0.5)
    assert harness.client.capacity.snapshot("s").used == 0


def test_rollback_of_a_transfer_whose_source_took_another_slot_frees_it(
    harness: Harness,
) -> None:
    capacity = harness.client.capacity
    source = capacity.acquire(session_id="s", limit=3, run_id="a")
    assert source is not None
    source.mark_started(runner_id="runner-a")
    capacity.report_terminal("s", "a", "failed")
    moved = capacity.transfer(session_id="s", limit=3, source_run_id="a", run_id="b")
    assert moved is not None
    again = capacity.acquire(session_id="s", limit=3, run_id="a")
    assert again is not None and again.slot == 1
    assert moved.rollback() is True
    assert moved.run_id == "b"  # nothing was restored: the source is represented elsewhere
    assert capacity.snapshot("s").used == 1
    owner = capacity.inspect("a", "s").owner
    assert owner is not None and owner.slot == 1


# -- the reference model --------------------------------------------------------------------

RUNNER_OK = "runner-ok"
RUNNER_OTHER = "runner-other"
TTLS = (5.0, 20.0)
STEPS = (1.0, 5.0, 30.0)


@dataclass(frozen=True)
class Slot:
    """What the model knows about one occupied slot."""

    run_id: str
    token: str
    generation: int
    kind: str
    expires_at: float | None
    runner_id: str | None = None
    start_time_set: bool = False
    reported: tuple[str, bool] | None = None  # (state, live process)
    source_run_id: str | None = None
    prev: Slot | None = None
    #: The ledger's record before the transfer that created this slot (exact-restore check).
    prev_record: SlotRecord | None = None

    @property
    def started(self) -> bool:
        return self.runner_id is not None or self.start_time_set

    def names(self, handle: SlotHandle) -> bool:
        return (self.token, self.run_id, self.generation, self.kind) == (
            handle.token,
            handle.run_id,
            handle.generation,
            handle.kind,
        )


def _releasable(slot: Slot, state: str, live: bool, proof: str, children_proven: bool) -> bool:
    """R-CAP-21/22 as the model predicts them for a report about `slot`'s run."""
    ended = state in TERMINAL_STATES and not live
    if slot.kind == "workflow":
        return ended and children_proven
    proven = proof in ("observed", "not-started")
    return ended and proven and slot.runner_id == RUNNER_OK


def _lowest_free(slots: dict[int, Slot], limit: int) -> int | None:
    if len(slots) >= limit:
        return None
    return next(i for i in range(limit) if i not in slots)


class CapacityModel(RuleBasedStateMachine):
    """Drives one session of the ledger and predicts every answer (INV-CAP-1..6, 8)."""

    harness: Harness

    def __init__(self) -> None:
        super().__init__()
        self.sid = f"s-{uuid.uuid4().hex[:10]}"
        self.api = self.harness.client.capacity
        self.slots: dict[int, Slot] = {}
        self.handles: list[SlotHandle] = []
        self.runs: list[str] = []
        self.limit = 3
        self._names = itertools.count()

    # -- helpers --------------------------------------------------------------------------

    def _fresh_run(self) -> str:
        run = f"r{next(self._names)}"
        self.runs.append(run)
        return run

    def _pick_run(self, pick: int, weight: int) -> str:
        """Mostly a run that holds a slot (where the interesting rules apply), else any run."""
        held = [s.run_id for _, s in sorted(self.slots.items())]
        held += [s.prev.run_id for _, s in sorted(self.slots.items()) if s.prev and weight > 2]
        pool = held if weight and held else self.runs
        return pool[pick % len(pool)]

    def _pick_handle(self, pick: int, recent: bool) -> SlotHandle:
        """Often one of the newest handles (likely current), else any (likely stale)."""
        pool = self.handles[-3:] if recent else self.handles
        return pool[pick % len(pool)]

    def _held(self, run_id: str) -> int | None:
        return next((i for i, s in self.slots.items() if s.run_id == run_id), None)

    def _lent(self, run_id: str) -> int | None:
        """The slot an unstarted transfer took from `run_id` (its record waits as `prev`)."""
        return next(
            (
                i
                for i, s in self.slots.items()
                if not s.started and s.prev is not None and s.prev.run_id == run_id
            ),
            None,
        )

    def _now(self) -> float:
        return self.harness.time.now

    def _settle(self) -> None:
        """Apply §0.4 to the model: unstarted slots past their deadline are rolled back."""
        self.harness.settle()
        while True:
            due = [
                i
                for i, s in self.slots.items()
                if not s.started and s.expires_at is not None and s.expires_at <= self._now()
            ]
            if not due:
                return
            for index in due:
                self._undo(index)

    def _undo(self, index: int) -> None:
        slot = self.slots.pop(index)
        if slot.prev is None:
            return
        self.slots[index] = slot.prev
        if slot.prev.started or (slot.prev.expires_at or 0) > self._now():
            restored = self.api.inspect(slot.prev.run_id, self.sid).owner
            assert restored == slot.prev_record, "INV-CAP-4: rollback restores the exact record"

    def _grant(self, run_id: str, kind: str, ttl: float, handle: Any) -> None:
        index = _lowest_free(self.slots, self.limit)
        assert index is not None and handle is not None, "INV-CAP-1: granted only below limit"
        assert handle.slot == index, "R-CAP-10: lowest free index"
        assert (handle.run_id, handle.generation, handle.kind) == (run_id, 0, kind)
        self.slots[index] = Slot(run_id, handle.token, 0, kind, self._now() + ttl)
        self.handles.append(handle.wire)

    def _expect_refusal(self, predicted: type[Exception] | None, outcome: Any) -> bool:
        """True when the call succeeded as predicted; asserts a predicted refusal."""
        if predicted is None:
            assert not isinstance(outcome, Exception), f"unexpected refusal {outcome!r}"
            return True
        assert isinstance(outcome, predicted), f"expected {predicted.__name__}, got {outcome!r}"
        return False

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (
            CapacityExhausted,
            CapacityOwnershipChanged,
            CapacityNotTransferable,
            CapacityRunAlreadyHeld,
        ) as err:
            return err

    def teardown(self) -> None:
        """Let this example's deadlines pass, so the next one starts with no timers pending."""
        self.harness.advance(max(TTLS) + max(STEPS))

    # -- rules ----------------------------------------------------------------------------

    @rule(limit=st.integers(min_value=0, max_value=4))
    def set_limit(self, limit: int) -> None:
        """A-17: the cap may be lowered or raised between calls."""
        self.limit = limit

    @rule(kind=st.sampled_from(["runner", "workflow"]), ttl=st.sampled_from(TTLS))
    def acquire(self, kind: str, ttl: float) -> None:
        run_id = self._fresh_run()
        used = len(self.slots)
        outcome = self._call(
            lambda: self.api.acquire(
                session_id=self.sid, limit=self.limit, run_id=run_id, kind=kind, ttl_s=ttl
            )
        )
        if self.limit == 0:
            assert outcome is None, "INV-CAP-6: unlimited records nothing"
        elif used >= self.limit:
            assert isinstance(outcome, CapacityExhausted)
            assert (outcome.used, outcome.limit) == (used, self.limit)
        else:
            self._grant(run_id, kind, ttl, outcome)
        self._settle()

    @precondition(lambda self: self.slots)
    @rule(pick=st.integers(min_value=0))
    def acquire_for_a_run_that_holds_a_slot(self, pick: int) -> None:
        run_id = sorted(s.run_id for s in self.slots.values())[pick % len(self.slots)]
        limit = max(self.limit, 1)
        outcome = self._call(
            lambda: self.api.acquire(session_id=self.sid, limit=limit, run_id=run_id)
        )
        assert isinstance(outcome, CapacityRunAlreadyHeld)

    @precondition(lambda self: self.handles)
    @rule(
        pick=st.integers(min_value=0),
        recent=st.booleans(),
        same_runner=st.integers(0, 3),
        forge=st.integers(0, 4),
    )
    def mark_started(self, pick: int, recent: bool, same_runner: int, forge: int) -> None:
        handle = self._pick_handle(pick, recent)
        if not forge:
            handle = handle.model_copy(update={"generation": handle.generation + 1})
        runner = RUNNER_OK if same_runner else RUNNER_OTHER
        slot = self.slots.get(handle.slot)
        current = slot is not None and slot.names(handle)
        conflict = current and slot is not None and slot.runner_id not in (None, runner)
        outcome = self._call(lambda: self.api.handle(handle).mark_started(runner_id=runner, pid=7))
        if self._expect_refusal(
            None if current and not conflict else CapacityOwnershipChanged, outcome
        ):
            assert slot is not None
            if slot.runner_id is None:
                self.slots[handle.slot] = replace(
                    slot,
                    runner_id=runner,
                    start_time_set=True,
                    expires_at=None,
                    prev=None,
                    prev_record=None,
                )
        self._settle()

    @precondition(lambda self: self.handles)
    @rule(pick=st.integers(min_value=0), recent=st.booleans())
    def mark_workflow_started(self, pick: int, recent: bool) -> None:
        handle = self._pick_handle(pick, recent)
        slot = self.slots.get(handle.slot)
        ok = slot is not None and slot.names(handle) and slot.kind == "workflow"
        outcome = self._call(lambda: self.api.handle(handle).mark_workflow_started())
        if self._expect_refusal(None if ok else CapacityOwnershipChanged, outcome):
            assert slot is not None
            if not slot.start_time_set:
                self.slots[handle.slot] = replace(
                    slot, start_time_set=True, expires_at=None, prev=None, prev_record=None
                )
        self._settle()

    @precondition(lambda self: self.handles)
    @rule(pick=st.integers(min_value=0), recent=st.booleans())
    def rollback(self, pick: int, recent: bool) -> None:
        """R-CAP-15..17, INV-CAP-3: refused after a start, and then nothing changes."""
        handle = self._pick_handle(pick, recent)
        slot = self.slots.get(handle.slot)
        before = self.api.inspect(handle.run_id, self.sid)
        expected = slot is not None and slot.names(handle) and not slot.started
        held = self.api.handle(handle)
        assert held.rollback() is expected
        if expected:
            self._undo(handle.slot)
            if held.wire != handle:  # R-CAP-16: the handle now names the restored source
                self.handles.append(held.wire)
                event("rollback restored a transfer source")
        else:
            assert self.api.inspect(handle.run_id, self.sid) == before
        self._settle()

    @precondition(lambda self: self.runs)
    @rule(pick=st.integers(min_value=0), weight=st.integers(0, 3), ttl=st.sampled_from(TTLS))
    def transfer(self, pick: int, weight: int, ttl: float) -> None:
        """R-CAP-18..20, INV-CAP-4: the source keeps its slot index, `used` stays put."""
        source = self._pick_run(pick, weight)
        run_id = self._fresh_run()
        index = self._held(source)
        lent = self._lent(source) if index is None else None
        used = len(self.slots)
        before = self.api.inspect(source, self.sid).owner
        outcome = self._call(
            lambda: self.api.transfer(
                session_id=self.sid,
                limit=self.limit,
                source_run_id=source,
                run_id=run_id,
                ttl_s=ttl,
            )
        )
        if lent is not None:  # sent again after a lost answer: takes the lent slot over
            slot = self.slots[lent]
            assert slot.prev is not None
            movable = slot.prev.reported is not None and not slot.prev.reported[1]
            if self._expect_refusal(None if movable else CapacityNotTransferable, outcome):
                assert (outcome.slot, outcome.generation) == (lent, slot.generation + 1)
                assert len(self.slots) == used == self.api.snapshot(self.sid).used
                self.slots[lent] = replace(
                    slot,
                    run_id=run_id,
                    generation=slot.generation + 1,
                    expires_at=self._now() + ttl,
                    reported=None,
                )
                self.handles.append(outcome.wire)
                event("transfer took a lent slot over")
        elif index is None:  # R-CAP-20: behaves exactly like acquire(kind=runner)
            if self.limit == 0:
                assert outcome is None
            elif used >= self.limit:
                assert isinstance(outcome, CapacityExhausted)
            else:
                self._grant(run_id, "runner", ttl, outcome)
        else:
            slot = self.slots[index]
            movable = slot.reported is not None and not slot.reported[1]
            if self._expect_refusal(None if movable else CapacityNotTransferable, outcome):
                assert (outcome.slot, outcome.generation) == (index, slot.generation + 1)
                assert len(self.slots) == used == self.api.snapshot(self.sid).used
                self.slots[index] = Slot(
                    run_id,
                    slot.token,
                    slot.generation + 1,
                    "runner",
                    self._now() + ttl,
                    source_run_id=source,
                    prev=slot,
                    prev_record=before,
                )
                self.handles.append(outcome.wire)
                event("transfer moved a slot")
            else:
                assert self.api.inspect(source, self.sid).owner == before
        self._settle()

    @precondition(lambda self: self.runs)
    @rule(
        pick=st.integers(min_value=0),
        weight=st.integers(0, 3),
        state=st.sampled_from(["complete", "failed", "stopped", "paused"]),
        live=st.sampled_from([False, False, False, True]),
        proof=st.sampled_from(["observed", "observed-other", "not-started", "unknown", "none"]),
        children_proven=st.sampled_from([True, True, False]),
    )
    def report_terminal(
        self, pick: int, weight: int, state: str, live: bool, proof: str, children_proven: bool
    ) -> None:
        """R-CAP-21/22, INV-CAP-5/8: only a releasable verdict frees the slot."""
        run_id = self._pick_run(pick, weight)
        index = self._held(run_id)
        proofs = {
            "observed": RunnerProof(state="observed", runner_id=RUNNER_OK),
            "observed-other": RunnerProof(state="observed", runner_id="someone-else"),
            "not-started": RunnerProof(state="not-started", runner_id=RUNNER_OK, error="x"),
            "unknown": RunnerProof(state="unknown", runner_id=RUNNER_OK),
            "none": None,
        }
        verdict = self.api.report_terminal(
            self.sid,
            run_id,
            state,
            live_process=live,
            proof=proofs[proof],  # type: ignore[arg-type]
            workflow_children_proven=children_proven,
        )
        if index is None:
            assert verdict.verdict != "releasable"
            lent = self._lent(run_id)
            if lent is not None:  # kept for that transfer's rollback
                slot = self.slots[lent]
                assert slot.prev is not None
                held = self.api.inspect(slot.run_id, self.sid).owner
                assert held is not None
                if _releasable(slot.prev, state, live, proof, children_proven):
                    assert held.prev_record is None  # its rollback frees the slot
                    self.slots[lent] = replace(slot, prev=None)
                    event("a lent slot's source ended")
                else:
                    assert held.prev_record is not None
                    assert held.prev_record.terminal_state == state
                    prev = replace(slot.prev, reported=(state, live))
                    self.slots[lent] = replace(slot, prev=prev, prev_record=held.prev_record)
                    event("report kept for a lent slot")
            self._settle()
            return
        slot = self.slots[index]
        releasable = _releasable(slot, state, live, proof, children_proven)
        assert (verdict.verdict == "releasable") is releasable, verdict
        event(f"report: {verdict.verdict}")
        if releasable:
            del self.slots[index]
        else:
            self.slots[index] = replace(slot, reported=(state, live))
        self._settle()

    @rule(seconds=st.sampled_from(STEPS))
    def advance_time(self, seconds: float) -> None:
        """§0.4: TTL expiry rolls back exactly the unstarted slots that are due."""
        self.harness.time.advance(seconds)
        self._settle()

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def ledger_matches_the_model(self) -> None:
        assert self.api.snapshot(self.sid).used == len(self.slots)
        for index, slot in self.slots.items():
            owner = self.api.inspect(slot.run_id, self.sid).owner
            assert owner is not None, f"{slot.run_id} lost its slot"
            assert (owner.slot, owner.token, owner.generation, owner.kind) == (
                index,
                slot.token,
                slot.generation,
                slot.kind,
            )
            assert owner.started is slot.started
            assert not (owner.started and owner.prev_record), "a started slot cannot go back"
            assert owner.expires_at == slot.expires_at
            assert owner.source_run_id == slot.source_run_id
        held = {s.run_id for s in self.slots.values()}
        for run_id in self.runs:
            if run_id not in held:
                assert self.api.inspect(run_id, self.sid).relation != "current"

    @invariant()
    def in_range_slots_never_exceed_the_limit(self) -> None:
        if self.limit:
            assert sum(1 for i in self.slots if i < self.limit) <= self.limit


@pytest.mark.slow
def test_inv_cap_1_to_8_ledger_agrees_with_the_reference_model(harness: Harness) -> None:
    machine = type("Machine", (CapacityModel,), {"harness": harness})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=200,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
