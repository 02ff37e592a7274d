"""FanoutBudget: the single owner of every run-tree fan-out budget and its claims (SPEC §5).

Owns the tables `fanout_budgets` (the manifest and its running `used` count), `fanout_claims`
(one row per claim, kept until a reservation that holds it ends without commit or its budget has
been idle for the retention period: compaction.py) and `fanout_reservations` (two-phase claims:
pending → committed | aborted | expired; a claim made with its caller's id is one committed at
once, so that batch sent again claims nothing more, and a reservation under its caller's id is
answered again with its grant), plus one timer that fires at the earliest
pending deadline and the compaction's own.

Decisions are serialized by the actor (R-FAN-13's budget-wide exclusion, no lock files) and a
batch is one transaction (no partial claims, §17). The cost of a claim does not grow with the
claims already made: `used` lives on the budget row and claims are appended by sequence number.
A reservation whose deadline has passed counts as expired for every request from that instant
(requests expire due reservations first), and the timer makes it so in the store even when no
request comes; after a restart `recover()` re-arms the earliest deadline (past ones fire at once).

A stored budget or reservation that breaks its invariants (a count that is not an integer in
its domain, an unknown state) is quarantined (DESIGN §2): `recover()` and every read that meets
it report it, a request that needs it is refused with `RecordQuarantined`, and it is never
expired or settled, so its claims stay counted (fail closed). Every other budget keeps working.

It must never release a committed or plain claim (R-FAN-15: compaction deletes idle claim rows,
never a count), never let a descriptor's own
`limit` decide anything (the manifest's does, R-FAN-3), and never touch another owner's tables.
"""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from subagents_node.actors import quarantine
from subagents_node.actors.context import ActorContext
from subagents_node.actors.deadline import EarliestDeadline
from subagents_node.actors.fanout import refusals, schema
from subagents_node.actors.fanout.compaction import ClaimCompaction, CompactionDue
from subagents_node.actors.faults import FaultInjection
from subagents_node.actors.inbox import Tick
from subagents_node.actors.owner import OwnerActor
from subagents_node.messages.base import Message, Request
from subagents_node.messages.errors import (
    FanoutBudgetUnavailable,
    FanoutDescriptorMismatch,
    FanoutLimitInvalid,
    RecordQuarantined,
    SubagentsError,
)
from subagents_node.messages.fanout import (
    DESCRIPTOR_MISMATCH,
    MAX_LIMIT,
    AbortReservation,
    BudgetReading,
    BudgetReadings,
    ClaimPaths,
    CommitReservation,
    CreateBudget,
    FanoutDescriptor,
    FanoutSnapshot,
    ReadSnapshot,
    ReadSnapshots,
    ReservationGrant,
    ReservePaths,
    ValidateDescriptor,
    qualify,
)

_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]")


class ReservationsDue(Tick):
    """The timer armed for the earliest pending reservation deadline went off. It names no
    reservation: the tick expires every reservation due by then and re-arms for the next."""

    __slots__ = ()


def budget_id_for(root_run_id: str) -> str:
    """R-FAN-2: a fresh id, never reused: the sanitized root id plus a uuid."""
    return f"{_UNSAFE_ID_CHARS.sub('_', root_run_id)[:120]}-{uuid.uuid4().hex}"


class FanoutBudget(OwnerActor):
    name = "fanout"
    MIGRATIONS = schema.MIGRATIONS

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        #: The one expiry timer: never later than any pending reservation's deadline.
        self._expiry = EarliestDeadline(self.after, ctx.clock, ReservationsDue)
        retention_days = float(ctx.settings.get("run_retention_days", 0.0))
        self._compaction = ClaimCompaction(retention_days * 86_400, self.after, ctx.clock)
        self._faults = FaultInjection(ctx)  # tests only: inert without faults

    def handlers(self) -> Mapping[type[Request], Callable[[Any], Message]]:
        return {
            CreateBudget: self.create,
            ValidateDescriptor: self.validate,
            ClaimPaths: self.claim,
            ReservePaths: self.reserve,
            CommitReservation: self.commit,
            AbortReservation: self.abort,
            ReadSnapshot: self.snapshot,
            ReadSnapshots: self.snapshots,
        }

    # -- requests -----------------------------------------------------------------------------

    def create(self, req: CreateBudget) -> FanoutDescriptor:
        limit = req.limit
        if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit <= MAX_LIMIT:
            raise FanoutLimitInvalid.of(limit)
        budget_id = budget_id_for(req.root_run_id)
        now = self.ctx.clock()
        self.db.execute(
            "INSERT INTO fanout_budgets(budget_id, root_run_id, claim_limit, created_at) "
            "VALUES (?, ?, ?, ?)",
            (budget_id, req.root_run_id, limit, now),
        )
        self._compaction.budget_created(now)
        if self._faults.live and self._first_budget_of(req.root_run_id):
            # Tests: die once the root's first budget is made, before the answer (the same
            # create sent again makes the root's second one, and lives).
            crash = self._faults.crash
            self.after_commit(lambda: crash("budget_created"))
        return FanoutDescriptor(root_run_id=req.root_run_id, budget_id=budget_id, limit=limit)

    def _first_budget_of(self, root_run_id: str) -> bool:
        row = self.db.execute(
            "SELECT COUNT(*) FROM fanout_budgets WHERE root_run_id=?", (root_run_id,)
        ).fetchone()
        return int(row[0]) == 1

    def validate(self, req: ValidateDescriptor) -> FanoutDescriptor:
        self._manifest(req.descriptor)
        return req.descriptor

    def snapshot(self, req: ReadSnapshot) -> FanoutSnapshot:
        self._expire_due(self.ctx.clock())
        return self._manifest(req.descriptor)

    def snapshots(self, req: ReadSnapshots) -> BudgetReadings:
        """Each budget as `snapshot` reads it; a refusal (unknown, mismatched, quarantined) is
        that descriptor's reading, so one bad budget never hides the others from a view."""
        self._expire_due(self.ctx.clock())
        readings = []
        for descriptor in req.descriptors:
            try:
                readings.append(BudgetReading(snapshot=self._manifest(descriptor)))
            except SubagentsError as err:
                readings.append(BudgetReading(code=err.code, error=err.message))
        return BudgetReadings(readings=readings)

    def claim(self, req: ClaimPaths) -> FanoutSnapshot:
        self._expire_due(self.ctx.clock())
        if not req.paths:
            return self._manifest(req.descriptor)
        if req.claim_id is not None:
            return self._claim_once(req, req.claim_id)
        # _admit checks the manifest itself: the common claim reads nothing before it writes.
        snapshot = self._admit(req.descriptor, req.paths, reservation_id=None)
        crash = self._faults.crash
        self.after_commit(lambda: crash("plain_claim_recorded"))  # recorded, not yet answered
        return snapshot

    def _claim_once(self, req: ClaimPaths, claim_id: str) -> FanoutSnapshot:
        """A batch with its caller's id, made at most once: stored as a reservation committed
        at once under that id (settled reservations are kept, compaction.py), so the same
        batch sent again is found and claims nothing more, however full the budget is now."""
        descriptor = req.descriptor
        qualified = [qualify(descriptor.parent_path, p) for p in req.paths]
        row = self.db.execute(
            f"SELECT budget_id, claims, state, {schema.RESERVATION_PROBLEM} "
            "FROM fanout_reservations WHERE reservation_id = ?",
            (claim_id,),
        ).fetchone()
        if row is not None:
            if row[3] is not None:
                raise self._refused(schema.RESERVATIONS, claim_id, str(row[3]))
            held = [str(path) for (path,) in self.db.execute(schema.CLAIM_PATHS, (claim_id,))]
            made = (str(row[0]), int(row[1]), str(row[2]))
            # Its claim rows may be compacted already: then its count and budget must do.
            if made != (descriptor.budget_id, len(qualified), "committed") or (
                held and held != qualified
            ):
                raise refusals.reused_id("claim", claim_id)
            return self._manifest(descriptor)
        self._manifest(descriptor)  # an unknown budget is refused before anything is written
        now = self.ctx.clock()
        row = (claim_id, descriptor.budget_id, len(qualified), now)
        self.db.execute(schema.INSERT_CLAIMED, row)
        snapshot = self._admit(descriptor, req.paths, claim_id)  # a rejection undoes the row
        crash = self._faults.crash
        self.after_commit(lambda: crash("claim_recorded"))  # recorded, not yet answered
        return snapshot

    def reserve(self, req: ReservePaths) -> ReservationGrant:
        now = self.ctx.clock()
        self._expire_due(now)
        before = self._manifest(req.descriptor)
        if req.reservation_id is not None:
            made = self._reserved_before(req, req.reservation_id)
            if made is not None:
                return made
        reservation_id = req.reservation_id or uuid.uuid4().hex
        expires_at = now + req.ttl_s
        self.db.execute(
            "INSERT INTO fanout_reservations"
            "(reservation_id, budget_id, claims, state, created_at, expires_at) "
            "VALUES (?, ?, ?, 'pending', ?, ?)",
            (reservation_id, req.descriptor.budget_id, len(req.paths), now, expires_at),
        )
        after = self._admit(req.descriptor, req.paths, reservation_id) if req.paths else before
        self._expiry.arm(expires_at)
        crash = self._faults.crash
        self.after_commit(lambda: crash("reserve_recorded"))  # recorded, not yet answered
        return ReservationGrant(
            reservation_id=reservation_id,
            budget_id=req.descriptor.budget_id,
            claims=len(req.paths),
            expires_at=expires_at,
            snapshot=after,
        )

    def _reserved_before(self, req: ReservePaths, reservation_id: str) -> ReservationGrant | None:
        """The grant of a reservation made under its caller's id already (sent again: its
        answer was lost with its owner), while it is pending and holds these paths; None when
        the id is new. Anything else under that id is refused: it reserves nothing more."""
        row = self.db.execute(
            f"SELECT budget_id, claims, state, expires_at, {schema.RESERVATION_PROBLEM} "
            "FROM fanout_reservations WHERE reservation_id = ?",
            (reservation_id,),
        ).fetchone()
        if row is None:
            return None
        if row[4] is not None:
            raise self._refused(schema.RESERVATIONS, reservation_id, str(row[4]))
        budget_id, state = str(row[0]), str(row[2])
        another = refusals.reused_id("reservation", reservation_id)
        if budget_id != req.descriptor.budget_id:
            raise another
        if state == "committed":
            raise refusals.committed(reservation_id, budget_id, self._snapshot_of(budget_id))
        if state != "pending":  # aborted or expired: its claims are gone
            raise refusals.ended(reservation_id, budget_id, state, self._snapshot_of(budget_id))
        held = [str(path) for (path,) in self.db.execute(schema.CLAIM_PATHS, (reservation_id,))]
        if held != [qualify(req.descriptor.parent_path, p) for p in req.paths]:
            raise another
        crash = self._faults.crash
        self.after_commit(lambda: crash("reserve_repeated"))  # answered again, not yet sent
        return ReservationGrant(
            reservation_id=reservation_id,
            budget_id=budget_id,
            claims=int(row[1]),
            expires_at=float(row[3]),
            snapshot=self._snapshot_of(budget_id),
        )

    def commit(self, req: CommitReservation) -> FanoutSnapshot:
        now = self.ctx.clock()
        self._expire_due(now)
        budget_id, state = self._reservation(req.reservation_id)
        if state in ("aborted", "expired"):
            raise refusals.ended(req.reservation_id, budget_id, state, self._snapshot_of(budget_id))
        if state == "pending":
            self.db.execute(
                "UPDATE fanout_reservations SET state = 'committed', settled_at = ? "
                "WHERE reservation_id = ?",
                (now, req.reservation_id),
            )
            crash = self._faults.crash
            self.after_commit(lambda: crash("commit_recorded"))  # committed, not yet answered
        return self._snapshot_of(budget_id)

    def abort(self, req: AbortReservation) -> FanoutSnapshot:
        now = self.ctx.clock()
        self._expire_due(now)
        budget_id, state = self._reservation(req.reservation_id)
        if state == "committed":
            raise refusals.committed(req.reservation_id, budget_id, self._snapshot_of(budget_id))
        if state == "pending" and not self._settle(req.reservation_id, "aborted", now):
            raise RecordQuarantined.of(
                self.name,
                schema.RESERVATIONS,
                req.reservation_id,
                "its claims do not match its record",
            )
        return self._snapshot_of(budget_id)

    # -- expiry -------------------------------------------------------------------------------

    def recover(self) -> None:
        self._expiry.disarm()
        for table, key, checks in (
            (schema.BUDGETS, "budget_id", schema.BUDGET_CHECKS),
            (schema.RESERVATIONS, "reservation_id", schema.RESERVATION_CHECKS),
        ):
            for name, reason in quarantine.broken_rows(self.db, table, key, checks):
                self.quarantine(table, name, reason)
        self._expiry.arm(self._next_due())
        self._compaction.arm(self.db)

    def on_tick(self, tick: Tick) -> None:
        match tick:
            case ReservationsDue():
                self._expiry.fired()
                self._expire(self.ctx.clock())
                self._expiry.arm(self._next_due())
            case CompactionDue():
                self._compaction.due(self.db)

    def on_stop(self) -> None:
        self._expiry.disarm()
        self._compaction.stop()
        super().on_stop()

    def _next_due(self) -> float | None:
        (deadline,) = self.db.execute(schema.NEXT_DUE).fetchone()
        return None if deadline is None else float(deadline)

    def _expire_due(self, now: float) -> None:
        # The timer is armed no later than the earliest pending deadline, so before it nothing
        # can be due and the common request skips the query.
        if self._expiry.due(now):
            self._expire(now)

    def _expire(self, now: float) -> None:
        due = self.db.execute(
            "SELECT reservation_id FROM fanout_reservations "
            f"WHERE state = 'pending' AND expires_at <= ? AND {schema.RESERVATION_PROBLEM} IS NULL",
            (now,),
        ).fetchall()
        for (reservation_id,) in due:
            self._settle(str(reservation_id), "expired", now)

    def _settle(self, reservation_id: str, state: str, now: float) -> bool:
        """End a pending reservation without commit: its claims are deleted, `used` drops.
        False (and quarantined, nothing changed) when its claims do not match its record."""
        budget_id, claims = self.db.execute(
            "SELECT budget_id, claims FROM fanout_reservations WHERE reservation_id = ?",
            (reservation_id,),
        ).fetchone()
        (held,) = self.db.execute(
            "SELECT COUNT(*) FROM fanout_claims WHERE reservation_id = ?", (reservation_id,)
        ).fetchone()
        if held != claims:
            # Fail closed: the reservation stays pending and its claims stay counted.
            self.quarantine(
                schema.RESERVATIONS,
                reservation_id,
                f"holds {held} claims, its record says {claims}",
            )
            return False
        self.db.execute("DELETE FROM fanout_claims WHERE reservation_id = ?", (reservation_id,))
        self.db.execute(
            "UPDATE fanout_budgets SET used = used - ? WHERE budget_id = ?", (claims, budget_id)
        )
        self.db.execute(
            "UPDATE fanout_reservations SET state = ?, settled_at = ? WHERE reservation_id = ?",
            (state, now, reservation_id),
        )
        return True

    # -- the store ----------------------------------------------------------------------------

    def _manifest(self, descriptor: FanoutDescriptor) -> FanoutSnapshot:
        """R-FAN-3: the budget the descriptor names, if it matches its manifest; its snapshot."""
        row = self.db.execute(schema.MANIFEST, (descriptor.budget_id,)).fetchone()
        if row is None:
            raise FanoutBudgetUnavailable.unknown(descriptor.budget_id)
        if row[3] is not None:
            raise self._refused(schema.BUDGETS, descriptor.budget_id, str(row[3]))
        root_run_id, limit, used = str(row[0]), int(row[1]), int(row[2])
        mismatched = [
            name
            for name, ours, theirs in (
                ("root_run_id", root_run_id, descriptor.root_run_id),
                ("limit", limit, descriptor.limit),
            )
            if ours != theirs
        ]
        if mismatched:
            raise FanoutDescriptorMismatch(
                DESCRIPTOR_MISMATCH, budget_id=descriptor.budget_id, mismatched=mismatched
            )
        return FanoutSnapshot.of(used, limit)

    def _admit(
        self,
        descriptor: FanoutDescriptor,
        paths: Sequence[str],
        reservation_id: str | None,
    ) -> FanoutSnapshot:
        """R-FAN-13/16: add every claim of the batch, or none and raise the rejection; the
        budget's snapshot after the batch."""
        qualified = [qualify(descriptor.parent_path, p) for p in paths]
        n = len(qualified)
        budget_id = descriptor.budget_id
        # One statement checks the manifest (R-FAN-3), the record's soundness and the room
        # left, and takes the claims' sequence numbers; it changes nothing unless all hold.
        row = self.db.execute(
            schema.ADMIT, (n, n, budget_id, descriptor.root_run_id, descriptor.limit, n, n)
        ).fetchone()
        if row is None:
            # Refused: the manifest names the reason (unknown, quarantined, mismatched), else
            # the batch does not fit.
            refusals.refuse_batch(qualified, self._manifest(descriptor))
        first, compacted, used, limit = row
        now = self.ctx.clock()
        if compacted is not None:
            # A tree that claims again after its claims were compacted: keep its new rows until
            # it is idle again (a separate write, so the common claim never touches the index
            # of budgets still to compact).
            self.db.execute(
                "UPDATE fanout_budgets SET claims_compacted_at = NULL WHERE budget_id = ?",
                (budget_id,),
            )
            self._compaction.budget_created(now)
        rows = [
            (budget_id, first + i, path, now, reservation_id) for i, path in enumerate(qualified)
        ]
        if n == 1:  # the common claim: execute costs less than executemany for one row
            self.db.execute(schema.INSERT_CLAIM, rows[0])
        else:
            self.db.executemany(schema.INSERT_CLAIM, rows)
        return FanoutSnapshot.of(int(used), int(limit))

    def _snapshot_of(self, budget_id: str) -> FanoutSnapshot:
        used, limit, problem = self.db.execute(
            f"SELECT used, claim_limit, {schema.BUDGET_PROBLEM} FROM fanout_budgets "
            "WHERE budget_id = ?",
            (budget_id,),
        ).fetchone()
        if problem is not None:
            raise self._refused(schema.BUDGETS, budget_id, str(problem))
        return FanoutSnapshot.of(int(used), int(limit))

    def _reservation(self, reservation_id: str) -> tuple[str, str]:
        row: sqlite3.Row | None = self.db.execute(
            f"SELECT budget_id, state, {schema.RESERVATION_PROBLEM} FROM fanout_reservations "
            "WHERE reservation_id = ?",
            (reservation_id,),
        ).fetchone()
        if row is None:
            raise refusals.unknown(reservation_id)
        if row[2] is not None:
            raise self._refused(schema.RESERVATIONS, reservation_id, str(row[2]))
        return str(row[0]), str(row[1])

    def _refused(self, table: str, key: str, reason: str) -> RecordQuarantined:
        """Quarantine the record and the refusal of the request that needed it."""
        self.quarantine(table, key, reason)
        return RecordQuarantined.of(self.name, table, key, reason)
