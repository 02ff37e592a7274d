"""The outbox's rules, one at a time, on a real `runs.db` and the owners' dispatch seam.

`Wire` stands where the node's links do (actors/context.py's `ActorContext.dispatch`, the seam a
unit test of owner logic uses): it keeps each request sent and lets the test answer it, as an
owner would, with a result or a typed error. The store is a real SQLite file migrated with the
supervisor's migrations; a transaction is committed by the test, which then runs what the
outbox asked to run after that commit (the owner base class's rule). The process-level
behaviour (a killed capacity owner, a killed node) is in test_runs_outbox.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from subagents_node.actors.capacity.rules import RELEASED_OBSERVED
from subagents_node.actors.inbox import Tick
from subagents_node.actors.owner import Outcome, ReplyFn
from subagents_node.actors.runs import runschema
from subagents_node.actors.runs.outbox import (
    FIRST_RETRY_S,
    INTERNAL_RESENDS,
    INTERNAL_RETRY_S,
    MAX_RETRY_S,
    Outbox,
)
from subagents_node.actors.runs.ticks import Outbound, OutboxRetry
from subagents_node.messages.base import Request
from subagents_node.messages.capacity import ReportTerminal, Verdict
from subagents_node.messages.errors import (
    BadRequest,
    Busy,
    CapacityOwnershipChanged,
    Internal,
    MembershipRefused,
    OwnerUnavailable,
    StoreFull,
)
from subagents_node.messages.session import SpawnReserve, TrackRun, TrackRunResult
from subagents_node.node.store import Store

VERDICT = Verdict(verdict="releasable", reason=RELEASED_OBSERVED)
REPORT = "capacity.report_terminal"


def report(run_id: str) -> ReportTerminal:
    return ReportTerminal(session_id="s", run_id=run_id, state="complete")


def track(run_id: str, state: str = "complete") -> TrackRun:
    return TrackRun(session_id="s", run_id=run_id, state=state)  # type: ignore[arg-type]


@dataclass
class Wire:
    """What went out, in order, with the reply function of each send still unanswered."""

    sent: list[tuple[str, Request]] = field(default_factory=list)
    waiting: dict[str, list[tuple[Request, ReplyFn]]] = field(default_factory=dict)
    refuse_with: Busy | None = None

    def dispatch(self, request: Request, target: str, reply: ReplyFn) -> None:
        if self.refuse_with is not None:
            raise self.refuse_with
        self.sent.append((target, request))
        self.waiting.setdefault(target, []).append((request, reply))

    def on_wire(self, target: str) -> list[Request]:
        return [request for request, _ in self.waiting.get(target, [])]


@dataclass
class Harness:
    """An Outbox on a real store, with its owner's hooks made visible to the test."""

    db: sqlite3.Connection
    wire: Wire
    outbox: Outbox = field(init=False)
    effects: list[Callable[[], None]] = field(default_factory=list)
    answers: list[tuple[Outbound, Outcome]] = field(default_factory=list)
    timers: list[tuple[float, Tick]] = field(default_factory=list)
    done: list[tuple[Request, Outcome]] = field(default_factory=list)
    quarantined: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.outbox = Outbox(
            lambda: self.db,
            self.wire.dispatch,
            lambda key, outcome: self.answers.append((key, outcome)),
            self.effects.append,
            lambda delay, tick: self._arm(delay, tick),
            lambda: 1000.0,
            lambda point: None,
            lambda table, key, reason: self.quarantined.append((table, key, reason)),
            lambda request, outcome: self.done.append((request, outcome)),
        )

    def _arm(self, delay: float, tick: Tick) -> Callable[[], None]:
        self.timers.append((delay, tick))
        return lambda: None

    def commit(self) -> None:
        """The owner's group commit: commit, then the effects that waited for it."""
        if self.db.in_transaction:
            self.db.commit()
        effects, self.effects[:] = list(self.effects), []
        for effect in effects:
            effect()

    def put(self, *requests: Request) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        for request in requests:
            self.outbox.put(request, getattr(request, "run_id", "r"))
        self.commit()

    def answer(self, target: str, outcome: Outcome) -> None:
        """The owner `target` answers the oldest request it has; the tick is handled and the
        group committed, as the supervisor's loop would."""
        _, reply = self.wire.waiting[target].pop(0)
        reply(outcome)
        self.handle_answers()

    def handle_answers(self) -> None:
        answers, self.answers[:] = list(self.answers), []
        self.db.execute("BEGIN IMMEDIATE")
        for key, outcome in answers:
            self.outbox.answered(key, outcome)
        self.commit()

    def fire_timers(self) -> None:
        timers, self.timers[:] = list(self.timers), []
        self.db.execute("BEGIN IMMEDIATE")
        for _, tick in timers:
            assert isinstance(tick, OutboxRetry)
            self.outbox.retry_due(tick.target)
        self.commit()

    def rows(self) -> list[tuple[str, str, int]]:
        return [
            (str(r[0]), str(r[1]), int(r[2]))
            for r in self.db.execute("SELECT target, type, attempts FROM run_outbox ORDER BY seq")
        ]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "runs.db")
    store.migrate({"supervisor": runschema.MIGRATIONS})
    return store


@pytest.fixture
def harness(store: Store) -> Iterator[Harness]:
    db = store.connect()
    yield Harness(db, Wire())
    db.close()


def test_a_row_is_sent_only_once_the_transaction_that_wrote_it_has_committed(
    harness: Harness,
) -> None:
    harness.db.execute("BEGIN IMMEDIATE")
    harness.outbox.put(report("a"), "a")
    assert harness.wire.sent == []  # not before the run's end is durable
    harness.db.rollback()
    harness.effects.clear()  # a group that failed drops its effects
    assert harness.rows() == []  # undone with the change that owed it

    harness.put(report("a"))
    assert harness.wire.sent == [("capacity", report("a"))]


def test_a_result_deletes_the_row_and_tells_the_owner(harness: Harness) -> None:
    harness.put(report("a"))
    harness.answer("capacity", VERDICT)
    assert harness.rows() == []
    assert harness.done == [(report("a"), VERDICT)]


def test_one_row_per_target_is_on_the_wire_and_the_next_goes_once_it_is_answered(
    harness: Harness,
) -> None:
    harness.put(report("a"), track("a"), report("b"), track("b"))
    assert harness.wire.on_wire("capacity") == [report("a")]
    assert harness.wire.on_wire("session") == [track("a")]  # targets do not wait for each other
    harness.answer("session", TrackRunResult(active=0))
    assert harness.wire.on_wire("session") == [track("b")]
    assert harness.wire.on_wire("capacity") == [report("a")]  # b waits behind a
    harness.answer("capacity", VERDICT)
    assert harness.wire.on_wire("capacity") == [report("b")]
    harness.answer("capacity", VERDICT)
    harness.answer("session", TrackRunResult(active=0))
    sent = [request for _, request in harness.wire.sent]
    assert sent == [report("a"), track("a"), track("b"), report("b")]
    assert harness.rows() == []


@pytest.mark.parametrize(
    "error",
    [
        OwnerUnavailable("capacity did not answer within 15s", reason="timeout"),
        OwnerUnavailable("capacity is failed", state="failed"),
        Busy("capacity is saturated"),
        StoreFull("the disk is full", actor="capacity"),
        OwnerUnavailable("the home is unreachable", reason="home_unreachable"),
        MembershipRefused("the home fenced this worker", reason="fenced"),
    ],
    ids=["timeout", "failed", "busy", "store-full", "home-unreachable", "fenced"],
)
def test_a_transient_failure_keeps_the_row_and_sends_it_again_after_a_doubling_delay(
    harness: Harness, error: Outcome
) -> None:
    harness.put(report("a"), report("b"))
    delays = []
    for _ in range(7):
        harness.answer("capacity", error)
        [(delay, tick)] = harness.timers
        delays.append(delay)
        assert tick == OutboxRetry("capacity")
        assert harness.wire.on_wire("capacity") == []  # nothing is sent before the timer
        harness.fire_timers()
        assert harness.wire.on_wire("capacity") == [report("a")]  # the same row, still first
    assert delays == [FIRST_RETRY_S * 2**i for i in range(5)] + [MAX_RETRY_S, MAX_RETRY_S]
    assert harness.rows() == [("capacity", REPORT, 7), ("capacity", REPORT, 0)]
    harness.answer("capacity", VERDICT)
    harness.answer("capacity", VERDICT)
    assert harness.rows() == [] and len(harness.done) == 2


def test_a_send_refused_at_once_is_retried_like_an_answer(harness: Harness) -> None:
    harness.wire.refuse_with = Busy("the peer's queue is full")
    harness.put(report("a"))
    harness.handle_answers()  # the refusal came back as an answer tick
    assert [delay for delay, _ in harness.timers] == [FIRST_RETRY_S]
    harness.wire.refuse_with = None
    harness.fire_timers()
    assert harness.wire.on_wire("capacity") == [report("a")]


@pytest.mark.parametrize(
    "error",
    [
        BadRequest("invalid", reason="schema"),
        CapacityOwnershipChanged("Active async capacity ownership changed for run 'a'."),
    ],
    ids=["invalid", "stale"],
)
def test_a_final_refusal_drops_the_row_and_the_next_one_goes(
    harness: Harness, error: Outcome
) -> None:
    harness.put(report("a"), report("b"))
    harness.answer("capacity", error)
    assert harness.rows() == [("capacity", REPORT, 0)]
    assert harness.done == [(report("a"), error)]
    assert harness.wire.on_wire("capacity") == [report("b")]


def test_an_owner_that_fails_on_a_row_gets_it_a_few_more_times_slowly_then_not(
    harness: Harness,
) -> None:
    harness.put(report("a"), report("b"))
    crash = Internal("capacity failed on capacity.report_terminal", actor="capacity")
    for _ in range(INTERNAL_RESENDS):
        harness.answer("capacity", crash)
        [(delay, _)] = harness.timers
        assert delay >= INTERNAL_RETRY_S  # one crash per restart-intensity window at most
        harness.fire_timers()
        assert harness.wire.on_wire("capacity") == [report("a")]
    harness.answer("capacity", crash)
    assert harness.done == [(report("a"), crash)]
    assert harness.wire.on_wire("capacity") == [report("b")]


def test_a_restart_sends_every_target_oldest_row_again_and_leaves_rows_on_the_wire(
    store: Store, harness: Harness
) -> None:
    harness.put(report("a"), report("b"), track("a"))
    harness.answer("session", TrackRunResult(active=0))
    # A new supervisor process: a fresh outbox on the same file sends what is owed, in order.
    wire = Wire()
    restarted = Harness(store.connect(), wire)
    restarted.outbox.resend_all()
    assert wire.sent == [("capacity", report("a"))]
    restarted.answer("capacity", VERDICT)
    assert wire.sent[-1] == ("capacity", report("b"))
    # An in-place restart: the row on the wire keeps waiting for its own answer.
    restarted.outbox.resend_all()
    assert wire.on_wire("capacity") == [report("b")]
    restarted.db.close()


def test_a_row_that_does_not_parse_is_quarantined_and_skipped(harness: Harness) -> None:
    harness.put(report("a"), report("b"))
    harness.db.execute(
        "UPDATE run_outbox SET body='{\"run_id\": 5}' WHERE seq=(SELECT MIN(seq) FROM run_outbox)"
    )
    wire = Wire()
    restarted = Harness(harness.db, wire)
    restarted.outbox.resend_all()
    assert wire.sent == [("capacity", report("b"))]
    [(table, key, _)] = restarted.quarantined
    first = harness.db.execute("SELECT MIN(seq) FROM run_outbox").fetchone()[0]
    assert (table, key) == ("run_outbox", str(first))
    assert len(harness.rows()) == 2  # kept (status, doctor), never sent


def test_only_an_idempotent_request_can_be_owed(harness: Harness) -> None:
    harness.db.execute("BEGIN IMMEDIATE")
    with pytest.raises(TypeError, match="not idempotent"):
        harness.outbox.put(SpawnReserve(session_id="s", requested=1), "r")  # counts twice
    harness.db.rollback()
    assert harness.rows() == []
