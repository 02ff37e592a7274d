"""Outbox: what the run supervisor owes other owners, kept until they have answered.

Owns table `run_outbox` (the "supervisor" family, `runs.db`) and, in memory, the one row of
each target that is on the wire and each target's retry delay. A row is a request to another
owner whose effect must not be lost: the capacity report that frees a run's slot, the session's
view of a run's state, the commit of a recovered append's claims. `put` writes it in the
transaction of the state change that owes it (so it is durable exactly when the run's end is)
and it is sent only once that transaction has committed. Its row is deleted when the owner
answers with a result, or with a typed error that retrying can never change (the request is
invalid or stale: logged). A transient failure (`TRANSIENT`: the owner is restarting, failed,
saturated or out of disk, did not answer in time, or, from a worker node, its home cannot be
reached or has fenced it) keeps the row, and the same row is sent again after a delay that
doubles from `FIRST_RETRY_S` to `MAX_RETRY_S`, on the owner's timer (an `OutboxRetry` tick),
never by polling; an owner that failed on it (`Internal`) gets it a few more times, slowly
(`INTERNAL_RESENDS`). A start (`resend_all`) sends every row again.

Order: one row per target is on the wire at a time; the next row of a target is sent only once
the previous one has been answered and its deletion has committed. So a target applies its rows
in `seq` order (for one run: running before complete, a retained workflow report before the one
that frees it), and a resend after a crash or a lost answer can only repeat the oldest row of a
target, which every request put here tolerates (`Request.idempotent`, checked by `put`).
Pipelining several rows would go faster to a far owner, but a lost row would then be applied
after a later one; a batch request is the way to go faster without that. Targets do not wait
for each other: a capacity owner that is down holds back only the capacity rows.

It never sends a row before the transaction that wrote it has committed, never decides what an
answer means for a run (`on_done` tells the supervisor of final outcomes), and never sleeps. A
row that does not parse is quarantined (status, doctor) and skipped: the effect it carries is
not applied, so whatever it would have freed stays held (fail closed for that row only).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from functools import partial

from subagents_node.actors.context import Cancel
from subagents_node.actors.inbox import Tick
from subagents_node.actors.owner import Outcome, ReplyFn
from subagents_node.actors.runs.ticks import Outbound, OutboxRetry
from subagents_node.messages.base import Request
from subagents_node.messages.errors import (
    Busy,
    FanoutReservationUnknown,
    Internal,
    MembershipRefused,
    OwnerUnavailable,
    StoreError,
    SubagentsError,
    UnknownTarget,
)
from subagents_node.messages.fanout import AbortReservation
from subagents_node.messages.protocol import parse_request

log = logging.getLogger(__name__)

TABLE = "run_outbox"
#: The first retry of a row that failed; each further failure doubles it, up to MAX_RETRY_S.
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 5.0
#: Failures after which the owner may serve the same request: it did not apply it (restarting,
#: failed past its restart intensity, saturated, out of disk, or not known yet; on a worker
#: node, a home that cannot be reached, or that fenced this worker until it joins again: its
#: next start sends the rows), or we cannot tell (no answer within the link's timeout: a
#: resend is safe, every row is idempotent). Every other error is final, but Internal: the
#: owner refused the request as invalid or stale (BadRequest, CapacityError, a fan-out
#: reservation that expired, a quarantined record).
TRANSIENT: tuple[type[SubagentsError], ...] = (
    OwnerUnavailable,
    Busy,
    StoreError,
    UnknownTarget,
    MembershipRefused,
)
#: Internal means the owner failed on the request, applied nothing and restarted from its
#: store: a commit or a lock that failed (worth a resend), or a request it cannot handle (a
#: resend crashes it again). So it is resent a few times, each no sooner than a default
#: restart-intensity window (5 s) after the last, so that one such row cannot by itself push
#: its owner to `failed`; then it is final.
INTERNAL_RESENDS = 3
INTERNAL_RETRY_S = 10.0

Dispatch = Callable[[Request, str, ReplyFn], None]


class Outbox:
    def __init__(
        self,
        connection: Callable[[], sqlite3.Connection],
        dispatch: Dispatch | None,
        deliver: Callable[[Outbound, Outcome], None],
        after_commit: Callable[[Callable[[], None]], None],
        after: Callable[[float, Tick], Cancel],
        clock: Callable[[], float],
        crash_point: Callable[[str], None],
        quarantine: Callable[[str, str, str], object],
        on_done: Callable[[Request, Outcome], None],
    ) -> None:
        """`connection()` is the owner's current store connection (a restart reopens it);
        `deliver(key, outcome)` brings an answer back as an `Answer` tick (from any thread),
        which the owner hands to `answered`; `on_done(request, outcome)` hears of every final
        outcome, inside the transaction that deletes the row."""
        self._db = connection
        self._dispatch = dispatch
        self._deliver = deliver
        self._after_commit = after_commit
        self._after = after
        self._clock = clock
        self._crash_point = crash_point
        self._quarantine = quarantine
        self._on_done = on_done
        #: The row of each target on the wire (at most one: the order rule above).
        self._in_flight: dict[str, tuple[int, Request]] = {}
        #: Targets whose last send failed and whose OutboxRetry tick is armed.
        self._waiting: set[str] = set()
        #: Each target's next retry delay; gone once a row of it was answered.
        self._delay: dict[str, float] = {}
        #: Rows quarantined because they do not parse: skipped, never sent.
        self._unreadable: set[int] = set()
        #: How often each row was answered Internal (in this process: a restart starts over).
        self._internal: dict[int, int] = {}

    # -- what the supervisor owes -----------------------------------------------------------------

    def put(self, request: Request, run_id: str) -> None:
        """Owe `request` to its owner, in the current transaction; sent once it commits."""
        if not type(request).idempotent:
            # A resend (after a crash, or an answer lost with its owner) must be harmless.
            raise TypeError(f"{request.type} is not idempotent: it cannot go in the outbox")
        self._db().execute(
            f"INSERT INTO {TABLE}(target, run_id, type, body, created_at) VALUES(?, ?, ?, ?, ?)",
            (request.target, run_id, request.type, request.model_dump_json(), self._clock()),
        )
        self._after_commit(partial(self._send_next, request.target))

    def resend_all(self) -> None:
        """A (re)start: send every target's oldest row again, in order, once the current
        transaction (if any) has committed. A row already on the wire is left to its answer."""
        db = self._db()
        for (target,) in db.execute(f"SELECT DISTINCT target FROM {TABLE}").fetchall():
            if db.in_transaction:
                self._after_commit(partial(self._send_next, str(target)))
            else:
                self._send_next(str(target))

    # -- answers (ticks: inside the owner's transaction) ------------------------------------------

    def answered(self, key: Outbound, outcome: Outcome) -> None:
        """The owner answered row `key.seq` (or the send failed): delete it, or try it again."""
        sent = self._in_flight.get(key.target)
        if sent is None or sent[0] != key.seq:
            return  # not the row on the wire (cannot happen: one outcome per send)
        del self._in_flight[key.target]
        request = sent[1]
        if isinstance(outcome, TRANSIENT):
            self._retry_later(key, request, outcome)
            return
        if isinstance(outcome, Internal):
            failed = self._internal[key.seq] = self._internal.get(key.seq, 0) + 1
            if failed <= INTERNAL_RESENDS:
                self._retry_later(key, request, outcome, INTERNAL_RETRY_S)
                return
        self._internal.pop(key.seq, None)
        if isinstance(outcome, FanoutReservationUnknown) and isinstance(request, AbortReservation):
            # The abort of a reservation whose answer was lost: it was never made.
            log.info("outbox: %s #%d: nothing was reserved; dropped", request.type, key.seq)
        elif isinstance(outcome, SubagentsError):
            log.error(
                "outbox: %s refused %s #%d for good (%s: %s); dropped",
                key.target,
                request.type,
                key.seq,
                outcome.code,
                outcome.message,
            )
        self._crash_point(f"outbox_answered_{request.type}")
        self._db().execute(f"DELETE FROM {TABLE} WHERE seq=?", (key.seq,))
        self._delay.pop(key.target, None)
        self._on_done(request, outcome)
        # The next row of this target goes once this deletion is durable: were it sent now and
        # the deletion undone, this row would be sent again after it (out of order).
        self._after_commit(partial(self._send_next, key.target))

    def retry_due(self, target: str) -> None:
        """The OutboxRetry tick of `target`: send its oldest row again, after this commit."""
        self._waiting.discard(target)
        self._after_commit(partial(self._send_next, target))

    def _retry_later(
        self, key: Outbound, request: Request, error: SubagentsError, at_least: float = 0.0
    ) -> None:
        db = self._db()
        db.execute(
            f"UPDATE {TABLE} SET attempts = attempts + 1, last_error = ? WHERE seq=?",
            (f"{error.code}: {error.message}"[:500], key.seq),
        )
        row = db.execute(f"SELECT attempts FROM {TABLE} WHERE seq=?", (key.seq,)).fetchone()
        attempts = int(row[0]) if row is not None else 0
        backoff = self._delay.get(key.target, FIRST_RETRY_S)
        self._delay[key.target] = min(MAX_RETRY_S, backoff * 2)
        delay = max(backoff, at_least)
        if attempts & (attempts - 1) == 0:  # the 1st, 2nd, 4th, 8th... failure: a bounded log
            log.warning(
                "outbox: %s #%d to %s failed %d time(s) (%s); retrying in %gs",
                request.type,
                key.seq,
                key.target,
                attempts,
                error.message,
                delay,
            )
        self._waiting.add(key.target)
        self._after(delay, OutboxRetry(key.target))

    # -- sending (after a commit, never inside a transaction) -------------------------------------

    def _send_next(self, target: str) -> None:
        """Send `target`'s oldest row, unless one is on the wire or waits for its retry."""
        if target in self._in_flight or target in self._waiting:
            return
        found = self._oldest(target)
        if found is None:
            return
        seq, request = found
        self._crash_point(f"outbox_send_{request.type}")
        dispatch = self._dispatch
        assert dispatch is not None, "the node injects dispatch"
        key = Outbound(target, seq)
        self._in_flight[target] = (seq, request)
        deliver = self._deliver
        try:
            dispatch(request, target, lambda outcome: deliver(key, outcome))
        except SubagentsError as err:  # Busy (nothing was queued): an answer like any other
            deliver(key, err)

    def _oldest(self, target: str) -> tuple[int, Request] | None:
        """The target's oldest row that parses; one that does not is quarantined and skipped."""
        db, after = self._db(), -1
        while True:
            row = db.execute(
                f"SELECT seq, type, body FROM {TABLE} WHERE target=? AND seq>? "
                "ORDER BY seq LIMIT 1",
                (target, after),
            ).fetchone()
            if row is None:
                return None
            seq = after = int(row[0])
            if seq in self._unreadable:
                continue
            try:
                request = parse_request(str(row[1]), _body(str(row[2])))
            except (SubagentsError, ValueError) as exc:  # ValueError: not JSON, not a model
                self._unreadable.add(seq)
                self._quarantine(TABLE, str(seq), f"{type(exc).__name__}: {exc}")
                continue
            if request.target != target:
                self._unreadable.add(seq)
                self._quarantine(TABLE, str(seq), f"{request.type} is not for {target}")
                continue
            return seq, request


def _body(text: str) -> dict[str, object]:
    body = json.loads(text)
    if not isinstance(body, dict):
        raise ValueError("the stored request is not an object")
    return body
