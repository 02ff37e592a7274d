"""CapacityLedger: the single owner of every active async capacity slot of every session (§4).

Owns table `capacity_slots` (one row per occupied slot, keyed by session id and slot index;
released slots are deleted, so no query grows with history), the audit table
`capacity_operator_releases` (one row per slot an operator freed), the acquire ids callers
gave up (`capacity_given_up`, capacity/givenup.py) and the TTL timers of unstarted slots.
Serializing every request in this one actor is R-CAP-5's slot exclusion; each request's insert
or update is one statement in the owner's transaction, so a slot and its owner record appear
together or not at all (R-CAP-11).

What it decides, and from what:
- acquire / transfer / rollback / mark_started follow R-CAP-8..20, fenced by the handle's
  (token, run id, generation) and kind (R-CAP-4); a stale handle is refused and changes nothing.
  `rollback_acquire` undoes the unstarted grant an acquire made under its id (the grant's
  token) for a caller whose answer was lost: no handle, the id fences it; the id is kept, so
  the acquire arriving after its rollback is refused instead of taking a slot.
- Release verdicts (R-CAP-21/22) are computed from the facts the run supervisor reports in
  `capacity.report_terminal`; the ledger never reads run directories, status files or another
  owner's tables. A releasable verdict deletes the slot at once, which is R-CAP-23's reconcile
  done at the only moment its inputs change; everything else is retained, and `inspect`
  explains why from the stored facts.
- Every slot names the host its run executes on (DESIGN §1; "" = the home node). An operator
  who declares a worker lost (`capacity.release_host`) frees every slot of that host in one
  request, so in one transaction, each with its audit row (proof state `operator`): the
  "explicit, audited operator release" of DESIGN §2. A fresh grant to a run an operator freed
  starts above the freed generation, so a report the lost execution still sends is fenced
  (DESIGN §3) even once the run holds a slot again. A worker acts only on its own host's
  slots: what it sends is stamped with its name (actors/peergate.stamp_host), and a start,
  rollback or terminal report it sends for another host's slot is refused and changes nothing.
- An unstarted slot whose TTL passes is rolled back by the owner (§0.4): a fresh slot is freed,
  a transferred one gets its source record back. One timer, armed for the earliest stored
  deadline, expires every slot then due (read afresh: a slot started or handed on since is not
  due) and re-arms for the next, so the owner keeps one timer however many grants it serves;
  `recover` re-arms it after a restart, each unstarted slot at least one TTL ahead (below).

A stored slot that does not parse is quarantined (DESIGN §2): `recover` and every read that
meets it report it (`OwnerActor.quarantine`) instead of failing; it keeps counting as occupied,
so it is never handed out, and a request that names it is refused with `RecordQuarantined`.
Every other slot and session keeps working.

The tables' SQL lives in `capacity/slots.py` and `capacity/releases.py`, the rules, as pure
functions, in `capacity/rules.py`, a terminal report's verdict and `inspect` in
`capacity/terminal.py`, and the hosts' side (an operator's release, the per-host
counts, a session's holders, the audit) in `capacity/hosts.py`, a slot lent to an unstarted
transfer in `capacity/lending.py`; this module sequences them.
It must never block on another actor, never call commit/BEGIN itself (the base class owns the
transaction), and never free a slot for any other reason (R-CAP-25) than a release verdict, a
TTL, a rollback or an operator's release.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from subagents_node.actors.capacity import givenup, hosts, lending, releases, slots, terminal
from subagents_node.actors.capacity.rules import (
    foreign,
    lowest_free,
    mismatch,
    session_key,
    started,
    transfer_refusal,
)
from subagents_node.actors.context import ActorContext
from subagents_node.actors.deadline import EarliestDeadline
from subagents_node.actors.faults import FaultInjection
from subagents_node.actors.inbox import Tick
from subagents_node.actors.owner import OwnerActor
from subagents_node.messages.base import Message, Request
from subagents_node.messages.capacity import (
    Acquire,
    AcquireResult,
    CapacitySnapshot,
    Inspect,
    Inspection,
    MarkStarted,
    MarkWorkflowStarted,
    ReportTerminal,
    Rollback,
    RollbackAcquire,
    RollbackResult,
    SlotHandle,
    SlotRecord,
    Snapshot,
    Transfer,
    Verdict,
)
from subagents_node.messages.capacity_holders import Holders
from subagents_node.messages.capacity_hosts import (
    HostReleased,
    HostSlots,
    ListReleases,
    OperatorReleases,
    ReleaseHost,
)
from subagents_node.messages.errors import (
    BadRequest,
    CapacityExhausted,
    CapacityNotTransferable,
    CapacityOwnershipChanged,
    CapacityRunAlreadyHeld,
    RecordQuarantined,
)

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 60.0


class SlotsDue(Tick):
    """The timer armed for the earliest deadline of an unstarted slot went off. It names no
    slot: the tick expires every slot due by then and re-arms for the next deadline."""

    __slots__ = ()


class CapacityLedger(OwnerActor):
    name = "capacity"
    MIGRATIONS: ClassVar[Sequence[str]] = (
        *(slots.SCHEMA_V1, slots.HOST_COLUMN, releases.SCHEMA_V1),
        givenup.SCHEMA_V1,
    )

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        #: The one expiry timer: never later than the earliest deadline of an unstarted slot
        #: (one armed for a grant that was then rolled back costs a tick that finds nothing).
        self._expiry = EarliestDeadline(self.after, ctx.clock, SlotsDue)
        self._faults = FaultInjection(ctx)  # tests only: inert without faults

    def handlers(self) -> Mapping[type[Request], Callable[[Any], Message]]:
        handlers: dict[type[Request], Callable[[Any], Message]] = {
            Acquire: self.acquire,
            MarkStarted: self.mark_started,
            MarkWorkflowStarted: self.mark_workflow_started,
            Rollback: self.rollback,
            RollbackAcquire: self.rollback_acquire,
            Transfer: self.transfer,
            ReportTerminal: self.report_terminal,
            Inspect: self.inspect,
            Snapshot: self.snapshot,
            ReleaseHost: self.release_host,
            # The hosts' reads are capacity/hosts.py's, on this owner's connection.
            HostSlots: lambda req: hosts.held(self.db, req),
            Holders: lambda req: hosts.holders(self.db, req, self.quarantine),
            ListReleases: self.list_releases,
        }
        return {kind: self._refusing_unreadable(h) for kind, h in handlers.items()}

    def recover(self) -> None:
        """Re-arm every unstarted slot's TTL, at least one full TTL from now; quarantine
        every stored slot that does not parse."""
        self._expiry.disarm()
        records, unreadable = slots.scan(self.db)
        for bad in unreadable:
            self.quarantine(slots.TABLE, bad.key, bad.reason)
        waiting = sum(1 for r in records if r.expires_at is not None)
        # Not at once: the node may owe a start made before the crash (runs/restart.py, R-CAP-7).
        slots.postpone(self.db, records, self.ctx.clock() + self._ttl(None))
        self._expiry.arm(slots.next_deadline(self.db))
        if waiting:
            log.info("capacity: re-armed the deadlines of %d unstarted slots", waiting)

    def on_tick(self, tick: Tick) -> None:
        match tick:
            case SlotsDue():
                self._expiry.fired()
                now = self.ctx.clock()
                for session_id, slot in slots.due(self.db, now):
                    try:
                        self._expire(session_id, slot, now)
                    except slots.UnreadableSlot as bad:
                        # Fail closed: an unreadable slot is never freed by a timer.
                        self.quarantine(slots.TABLE, bad.key, bad.reason)
                self._arm_next(now)

    def on_stop(self) -> None:
        self._expiry.disarm()
        super().on_stop()

    def _refusing_unreadable(self, handler: Callable[[Any], Message]) -> Callable[[Any], Message]:
        """`handler`, with a stored slot it cannot read quarantined and the request refused
        (`RecordQuarantined`; the savepoint undoes whatever it wrote) instead of a crash."""

        @functools.wraps(handler)
        def guarded(request: Any) -> Message:
            try:
                return handler(request)
            except slots.UnreadableSlot as bad:
                self.quarantine(slots.TABLE, bad.key, bad.reason)
                raise RecordQuarantined.of(self.name, slots.TABLE, bad.key, bad.reason) from None

        return guarded

    # -- requests -----------------------------------------------------------------------------

    def acquire(self, req: Acquire) -> AcquireResult:
        """R-CAP-8..12: nothing when unlimited, else the lowest free index below the limit."""
        if req.limit == 0:
            return AcquireResult(handle=None, snapshot=self._snapshot(req.session_id, 0))
        held = slots.held_by(self.db, req.session_id, req.run_id)
        if held is not None:
            if req.acquire_id is not None and held.token == req.acquire_id:
                # The same acquire sent again: its answer was lost, its slot was not.
                snapshot = self._snapshot(req.session_id, req.limit)
                return AcquireResult(handle=held.handle(), snapshot=snapshot)
            raise CapacityRunAlreadyHeld.of(req.session_id, req.run_id, held.slot)
        if req.acquire_id is not None:
            taken_by = slots.token_run(self.db, req.session_id, req.acquire_id)
            if taken_by is not None:  # another run's slot (this run holds none): a reused id
                raise reused_acquire_id(req.acquire_id, taken_by)
        givenup.refuse(self.db, req)  # its caller gave it up before it arrived
        # `used` counts unreadable slots too: fail closed
        used, occupied = slots.pool(self.db, req.session_id)
        index = lowest_free(occupied, req.limit)
        if index is None or used >= req.limit:
            raise CapacityExhausted.of(used, req.limit)
        now = self.ctx.clock()
        record = SlotRecord(
            session_id=req.session_id,
            session_key=session_key(req.session_id),
            slot=index,
            token=req.acquire_id or uuid.uuid4().hex,
            run_id=req.run_id,
            generation=hosts.fresh_generation(self.db, req.session_id, req.run_id, 0),
            kind=req.kind,
            async_dir=req.async_dir,
            host=req.host,
            reserved_at=now,
            expires_at=now + self._ttl(req.ttl_s),
        )
        slots.insert(self.db, record)
        self._expiry.arm(record.expires_at)
        crash = self._faults.crash
        self.after_commit(lambda: crash("slot_acquired"))  # taken, not yet answered
        snapshot = CapacitySnapshot(used=used + 1, limit=req.limit)
        return AcquireResult(handle=record.handle(), snapshot=snapshot)

    def mark_started(self, req: MarkStarted) -> SlotHandle:
        """R-CAP-13, A-14 resolved: cannot fail for the current handle; same runner = no-op."""
        record = self._current(req.handle, workflow=False, host=req.host)
        if record.runner_id is not None:
            if record.runner_id != req.runner_id:
                raise CapacityOwnershipChanged.of(req.handle, "runner_conflict")
            return record.handle()
        now = self.ctx.clock()
        runner = started(
            record,
            runner_id=req.runner_id,
            runner_started_at=record.runner_started_at or now,
            pid=req.pid,
            process_start_time=req.process_start_time,
        )
        slots.update(self.db, runner)
        return record.handle()

    def mark_workflow_started(self, req: MarkWorkflowStarted) -> SlotHandle:
        """R-CAP-14: only for `workflow` records, and only the start time is set."""
        record = self._current(req.handle, workflow=True, host=req.host)
        if record.kind != "workflow":
            raise CapacityOwnershipChanged.of(req.handle, "kind_mismatch", workflow=True)
        if record.runner_started_at is None:
            slots.update(self.db, started(record, runner_started_at=self.ctx.clock()))
        return record.handle()

    def rollback(self, req: Rollback) -> RollbackResult:
        """R-CAP-15..17: undo an unstarted grant; otherwise false, and nothing changed."""
        record = slots.load(self.db, req.handle.session_id, req.handle.slot)
        if record is None or mismatch(record, req.handle) or record.started:
            return RollbackResult(rolled_back=False)
        if foreign(record, req.host):
            return RollbackResult(rolled_back=False)
        restored = self._undo(record)
        return RollbackResult(rolled_back=True, handle=restored.handle() if restored else None)

    def rollback_acquire(self, req: RollbackAcquire) -> RollbackResult:
        """An acquire its caller gave up without its handle: the run's unstarted grant whose
        token is that acquire's id, undone (R-CAP-15); no other grant of the run, and never a
        started one (R-CAP-17): false, and nothing changed."""
        # Remembered first: the acquire may still arrive (givenup.py), and is refused then.
        givenup.record(self.db, req.acquire_id, req.session_id, req.run_id, self.ctx.clock())
        record = slots.held_by(self.db, req.session_id, req.run_id)
        if record is None or record.token != req.acquire_id or record.started:
            return RollbackResult(rolled_back=False)
        if foreign(record, req.host):
            return RollbackResult(rolled_back=False)
        restored = self._undo(record)
        return RollbackResult(rolled_back=True, handle=restored.handle() if restored else None)

    def transfer(self, req: Transfer) -> AcquireResult:
        """R-CAP-18..20: hand a finished source's slot to its resume, without a second charge."""
        source = slots.held_by(self.db, req.session_id, req.source_run_id)
        # Sent again after the answer to a first transfer was lost: take its slot over
        # (capacity/lending.py), not a second one.
        lent = None
        if source is None:
            lent = lending.pending_transfer(self.db, req.session_id, req.source_run_id)
            source = lent.prev_record if lent is not None else None
            if lent is not None and req.transfer_id is not None and lent.run_id == req.run_id:
                # This very transfer sent again (its answer was lost, the lent slot was not).
                snapshot = self._snapshot(req.session_id, req.limit)
                return AcquireResult(handle=lent.handle(), snapshot=snapshot)
        if source is None:
            return self.acquire(
                Acquire(
                    session_id=req.session_id,
                    limit=req.limit,
                    run_id=req.run_id,
                    kind="runner",
                    async_dir=req.async_dir,
                    ttl_s=req.ttl_s,
                    host=req.host,
                    acquire_id=req.transfer_id,
                )
            )
        self._refuse_second_slot(req.session_id, req.run_id)
        refusal = transfer_refusal(source)
        if refusal is not None:
            raise CapacityNotTransferable.of(req.source_run_id, refusal)
        now = self.ctx.clock()
        record = lending.lent_record(self.db, req, source, lent, now, now + self._ttl(req.ttl_s))
        slots.update(self.db, record)
        self._expiry.arm(record.expires_at)
        crash = self._faults.crash
        self.after_commit(lambda: crash("slot_transferred"))  # lent, not yet answered
        snapshot = self._snapshot(req.session_id, req.limit)
        return AcquireResult(handle=record.handle(), snapshot=snapshot)

    def report_terminal(self, req: ReportTerminal) -> Verdict:
        """R-CAP-21/22: the run supervisor's facts stored, the verdict applied at once
        (capacity/terminal.py; idempotent: the supervisor's outbox may send one twice)."""
        return terminal.report(self.db, req, self.ctx.clock())

    def inspect(self, req: Inspect) -> Inspection:
        """R-CAP-27 (capacity/terminal.py)."""
        return terminal.inspect(self.db, req)

    def snapshot(self, req: Snapshot) -> CapacitySnapshot:
        """R-CAP-26. Nothing to reconcile first: releasable slots were freed when reported."""
        return self._snapshot(req.session_id, req.limit)

    def release_host(self, req: ReleaseHost) -> HostReleased:
        """DESIGN §1-2: the operator declared `req.host` lost; free its slots, audited."""
        return hosts.release(self.db, req, self.ctx.clock(), self.quarantine)

    def list_releases(self, req: ListReleases) -> OperatorReleases:
        return hosts.audit(self.db, req, self.quarantine)

    # -- slot life ----------------------------------------------------------------------------

    def _current(self, handle: SlotHandle, workflow: bool, host: str) -> SlotRecord:
        """The stored record the handle names, or the ownership error (R-CAP-4); a worker
        (`host`) names only its own host's records."""
        record = slots.load(self.db, handle.session_id, handle.slot)
        if record is None:
            raise CapacityOwnershipChanged.of(handle, "slot_gone", workflow=workflow)
        reason = mismatch(record, handle) or ("host_mismatch" if foreign(record, host) else "")
        if reason:
            raise CapacityOwnershipChanged.of(handle, reason, workflow=workflow)
        return record

    def _refuse_second_slot(self, session_id: str, run_id: str) -> None:
        held = slots.held_by(self.db, session_id, run_id)
        if held is not None:
            raise CapacityRunAlreadyHeld.of(session_id, run_id, held.slot)

    def _undo(self, record: SlotRecord) -> SlotRecord | None:
        """Free a fresh grant, or put back the complete record a transfer replaced (R-CAP-16).

        Returns the restored source record, if any.
        """
        source = record.prev_record
        if source is None or slots.held_by(self.db, source.session_id, source.run_id):
            # A source that took another slot since is represented there; restoring it here
            # would give one run two slots, so this one is simply freed.
            slots.delete(self.db, record)
            return None
        slots.update(self.db, source)
        self._expiry.arm(source.expires_at)
        return source

    def _expire(self, session_id: str, slot: int, now: float) -> None:
        """§0.4: an unstarted slot past its TTL is rolled back by its owner. Read afresh: a
        slot another expiry of this tick restored is judged by its own deadline."""
        record = slots.load(self.db, session_id, slot)
        if record is None or record.started or record.expires_at is None:
            return
        if record.expires_at > now:
            return  # a restored source whose own deadline is still ahead: armed by _undo
        log.warning(
            "capacity: run %s (session %s, slot %d) did not start within its TTL; rolled back",
            record.run_id,
            record.session_id,
            record.slot,
        )
        self._undo(record)

    def _ttl(self, ttl_s: float | None) -> float:
        if ttl_s is not None:
            return ttl_s
        return float(self.ctx.settings.get("reservation_ttl_s", DEFAULT_TTL_S))

    def _arm_next(self, now: float) -> None:
        """After a tick: arm for the earliest deadline still ahead (what was due by `now` and
        is still stored is quarantined: fail closed, never freed by a timer, never retried)."""
        self._expiry.arm(slots.next_deadline(self.db, after=now))

    def _snapshot(self, session_id: str, limit: int) -> CapacitySnapshot:
        return CapacitySnapshot(used=slots.used(self.db, session_id), limit=limit)


def reused_acquire_id(acquire_id: str, run_id: str) -> BadRequest:
    """An acquire id that already names another run's slot in the session: refused, and
    nothing is taken (as a reused claim or reservation id is, actors/fanout/refusals.py). Taken,
    the two slots carried one token, and the id no longer named one acquire."""
    return BadRequest(
        f"acquire id {acquire_id} was used for another acquire (the slot of run {run_id}); "
        "pick a new id per acquire",
        reason="acquire_id",
        field="acquire_id",
        run_id=run_id,
    )
