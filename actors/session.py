"""SessionActor: the single owner of every session's spawn budget and grants (SPEC §6, R-SPN).

What it owns (table family "session"):
- `session_budgets`: per session id, the configured limit (NULL = unlimited; fixed by the first
  open, R-SPN-1), `used` (R-SPN-5's count) and the granted total;
- `session_grants`: the grant history, trimmed to the last GRANT_HISTORY_MAX entries per session;
- `session_runs`: the session's runs that are not terminal (queued, running, paused), so grants
  can be refused while children are queued or running (R-SPN-6). Terminal runs are deleted;
- `session_reservations`: each counted reservation made under its caller's id (a workflow
  child's launch), so the same launch sent again after its node was lost (it had reserved,
  then died before recording the run) is counted once. Kept, never refunded: at most one row
  per spawn a capped session counted, so a session's rows are bounded by its own limit.

Everything lives in the store and every request reads it afresh: there is no cache to rebuild
after a restart, and each request is a handful of primary-key lookups (O(1) in history size).
It never touches another owner's tables, never resets usage (grants only raise the limit), and
validates every rule before its first write, so a refused request changes nothing even before
the base class rolls its savepoint back.

A session that was never opened is unlimited with nothing used: preflight and reserve pass and
record nothing (R-SPN-5), a grant is refused (`unknown_session`).

A stored row that breaks its invariants (a count that is not a non-negative integer, an
unknown run state) is quarantined (DESIGN §2): `recover()` and every read that meets it report
it; a session whose budget row cannot be read is unavailable (every request for it is refused
with `RecordQuarantined`), a run row that cannot be read counts as active (grants stay
refused), and a grant entry that cannot be read is left out of the history. Every other session
keeps working.

The grant authority (R-SPN-6) is the caller's, except that a node configured with
`grant_authority = "forbid"` (ctx.settings) refuses every grant whatever the caller says.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from subagents_node.actors import quarantine
from subagents_node.actors import sessionschema as schema
from subagents_node.actors.context import ActorContext
from subagents_node.actors.faults import FaultInjection
from subagents_node.actors.owner import OwnerActor
from subagents_node.messages.base import Message, Request
from subagents_node.messages.constants import MAX_INT32
from subagents_node.messages.errors import (
    BadRequest,
    GrantRejected,
    RecordQuarantined,
    SpawnBudgetExceeded,
)
from subagents_node.messages.session import (
    GRANT_HISTORY_MAX,
    TERMINAL_RUN_STATES,
    GrantBasis,
    GrantRecord,
    GrantResult,
    GrantSpawns,
    OpenSession,
    OpenSessionResult,
    ReserveResult,
    SessionStatus,
    SessionStatusQuery,
    SpawnPreflight,
    SpawnReserve,
    SpawnSnapshot,
    SpawnSnapshotQuery,
    TrackedRun,
    TrackRun,
    TrackRunResult,
)


class SessionActor(OwnerActor):
    name = "session"
    MIGRATIONS = schema.MIGRATIONS

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self._faults = FaultInjection(ctx)  # tests only: inert without faults

    def handlers(self) -> Mapping[type[Request], Callable[[Any], Message]]:
        return {
            OpenSession: self.open,
            SpawnSnapshotQuery: self.spawn_snapshot,
            SpawnPreflight: self.preflight,
            SpawnReserve: self.reserve,
            GrantSpawns: self.grant,
            TrackRun: self.track_run,
            SessionStatusQuery: self.status,
        }

    def recover(self) -> None:
        """Nothing to rebuild (every request reads the store); report every unreadable row."""
        for table, key, checks in (
            (schema.BUDGETS, "session_id", schema.BUDGET_CHECKS),
            (schema.GRANTS, "session_id || '/' || seq", schema.GRANT_CHECKS),
            (schema.RUNS, "session_id || '/' || run_id", schema.RUN_CHECKS),
            (schema.RESERVATIONS, "reservation_id", schema.RESERVATION_CHECKS),
        ):
            for name, reason in quarantine.broken_rows(self.db, table, key, checks):
                self.quarantine(table, name, reason)

    # -- handlers ----------------------------------------------------------------------------

    def open(self, req: OpenSession) -> OpenSessionResult:
        """R-SPN-1: the first open fixes the configured limit; later opens change nothing."""
        wanted = req.configured_limit or None  # R-CFG-4: 0 means unlimited
        row = self._budget(req.session_id)
        if row is None:
            self.db.execute(
                "INSERT INTO session_budgets(session_id, configured_limit, opened_at) "
                "VALUES (?, ?, ?)",
                (req.session_id, wanted, self.ctx.clock()),
            )
            return OpenSessionResult(
                created=True,
                requested_limit=wanted,
                limit_differs=False,
                note=f"session '{req.session_id}' opened",
                snapshot=self._snapshot(req.session_id),
            )
        kept = row["configured_limit"]
        differs = kept != wanted
        note = (
            f"session '{req.session_id}' is already open with configured limit "
            f"{_limit_text(kept)}; the requested limit {_limit_text(wanted)} is ignored"
            if differs
            else f"session '{req.session_id}' is already open"
        )
        return OpenSessionResult(
            created=False,
            requested_limit=wanted,
            limit_differs=differs,
            note=note,
            snapshot=self._snapshot(req.session_id),
        )

    def spawn_snapshot(self, req: SpawnSnapshotQuery) -> SpawnSnapshot:
        return self._snapshot(req.session_id)

    def preflight(self, req: SpawnPreflight) -> SpawnSnapshot:
        snapshot = self._snapshot(req.session_id)
        if not self._reserved(req.session_id, req.reservation_id, req.requested):
            _check_fits(snapshot, req.requested)
        return snapshot

    def reserve(self, req: SpawnReserve) -> ReserveResult:
        """R-SPN-5: preflight, then count — only when a cap exists; a reservation made already
        under the same id is counted already (its launch sent again), so nothing is counted or
        refused twice."""
        snapshot = self._snapshot(req.session_id)
        if self._reserved(req.session_id, req.reservation_id, req.requested):
            return ReserveResult(counted=0, snapshot=snapshot, repeated=True)
        _check_fits(snapshot, req.requested)
        if snapshot.unlimited or req.requested == 0:
            return ReserveResult(counted=0, snapshot=snapshot)
        self.db.execute(
            "UPDATE session_budgets SET used = used + ? WHERE session_id = ?",
            (req.requested, req.session_id),
        )
        if req.reservation_id is not None:  # in the same transaction as the count
            self.db.execute(
                "INSERT INTO session_reservations(reservation_id, session_id, requested, "
                "reserved_at) VALUES (?, ?, ?, ?)",
                (req.reservation_id, req.session_id, req.requested, self.ctx.clock()),
            )
        crash = self._faults.crash
        self.after_commit(lambda: crash("spawn_reserved"))  # counted, not yet answered
        return ReserveResult(counted=req.requested, snapshot=self._snapshot(req.session_id))

    def grant(self, req: GrantSpawns) -> GrantResult:
        """R-SPN-6, every rule checked in the spec's order before anything is written."""
        sid = req.session_id
        if req.depth != 0:
            raise GrantRejected.build("not_root", sid, depth=req.depth)
        if self._budget(sid) is None:
            raise GrantRejected.build("unknown_session", sid)
        active = self._active_runs(sid)
        if active:
            raise GrantRejected.build("children_active", sid, active=active)
        if req.additional <= 0:
            raise GrantRejected.build("not_positive", sid, additional=req.additional)
        snapshot = self._snapshot(sid)
        if snapshot.configured is None or snapshot.limit is None:
            raise GrantRejected.build("no_cap", sid)
        allowance = snapshot.grant_remaining or 0
        if req.additional > allowance:
            raise GrantRejected.build(
                "over_allowance", sid, additional=req.additional, grant_remaining=allowance
            )
        if "forbid" in (req.authority, self.ctx.settings.get("grant_authority")):
            raise GrantRejected.build("forbidden", sid)
        basis = GrantBasis(used=snapshot.used, granted=snapshot.granted)
        if req.authority == "confirm" and not req.confirmed:
            return GrantResult(
                applied=False,
                outcome="confirmation_required",
                additional=req.additional,
                entry=None,
                basis=basis,
                snapshot=snapshot,
            )
        if req.expected is not None and req.expected != basis:
            raise GrantRejected.build(
                "changed",
                sid,
                expected_used=req.expected.used,
                expected_granted=req.expected.granted,
                used=basis.used,
                granted=basis.granted,
            )
        entry = self._apply_grant(sid, req.additional, snapshot.limit)
        return GrantResult(
            applied=True,
            outcome="granted",
            additional=req.additional,
            entry=entry,
            basis=basis,
            snapshot=self._snapshot(sid),
        )

    def track_run(self, req: TrackRun) -> TrackRunResult:
        """Idempotent (the run supervisor's outbox resends until answered, in order): a
        terminal state deletes the row, again or not; the same live state twice keeps the row
        as it is, `updated_at` included (the time of the last change of state)."""
        if req.state in TERMINAL_RUN_STATES:
            self.db.execute(
                "DELETE FROM session_runs WHERE session_id = ? AND run_id = ?",
                (req.session_id, req.run_id),
            )
        else:
            self.db.execute(
                "INSERT INTO session_runs(session_id, run_id, state, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT(session_id, run_id) "
                "DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at "
                "WHERE session_runs.state IS NOT excluded.state",
                (req.session_id, req.run_id, req.state, self.ctx.clock()),
            )
        return TrackRunResult(active=self._active_runs(req.session_id))

    def status(self, req: SessionStatusQuery) -> SessionStatus:
        rows = self.db.execute(
            f"SELECT run_id, state, updated_at, {schema.RUN_PROBLEM} AS problem FROM session_runs "
            "WHERE session_id = ? ORDER BY updated_at, run_id",
            (req.session_id,),
        ).fetchall()
        for r in rows:
            if r["problem"] is not None:
                self.quarantine(schema.RUNS, f"{req.session_id}/{r['run_id']}", r["problem"])
        return SessionStatus(
            snapshot=self._snapshot(req.session_id),
            active=self._active_runs(req.session_id),
            runs=[
                TrackedRun(run_id=r["run_id"], state=r["state"], updated_at=r["updated_at"])
                for r in rows
                if r["problem"] is None
            ],
        )

    # -- store access ------------------------------------------------------------------------

    def _budget(self, session_id: str) -> sqlite3.Row | None:
        """The session's budget row; a row that cannot be read is quarantined and refused."""
        row: sqlite3.Row | None = self.db.execute(
            f"SELECT configured_limit, used, granted, {schema.BUDGET_PROBLEM} AS problem "
            "FROM session_budgets WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        if row is not None and row["problem"] is not None:
            self.quarantine(schema.BUDGETS, session_id, row["problem"])
            raise RecordQuarantined.of(self.name, schema.BUDGETS, session_id, row["problem"])
        return row

    def _reserved(self, session_id: str, reservation_id: str | None, requested: int) -> bool:
        """Whether reservation `reservation_id` counted already. The id with another session
        or count is refused (a caller reusing one id for two launches), and a row that cannot
        be read is refused too (fail closed: it might be this launch's)."""
        if reservation_id is None:
            return False
        row = self.db.execute(
            f"SELECT session_id, requested, {schema.RESERVATION_PROBLEM} AS problem "
            "FROM session_reservations WHERE reservation_id = ?",
            (reservation_id,),
        ).fetchone()
        if row is None:
            return False
        if row["problem"] is not None:
            self.quarantine(schema.RESERVATIONS, reservation_id, row["problem"])
            raise RecordQuarantined.of(
                self.name, schema.RESERVATIONS, reservation_id, row["problem"]
            )
        if (row["session_id"], row["requested"]) != (session_id, requested):
            raise BadRequest(
                f"reservation id {reservation_id} was used for another reservation; pick a "
                "new id per launch",
                reason="reservation_id",
                field="reservation_id",
            )
        return True

    def _active_runs(self, session_id: str) -> int:
        """Runs that block a grant; a run row that cannot be read counts (fail closed)."""
        row = self.db.execute(
            "SELECT COUNT(*) FROM session_runs WHERE session_id = ? "
            f"AND (state IN ({schema.ACTIVE_SQL}) OR {schema.RUN_PROBLEM} IS NOT NULL)",
            (session_id,),
        ).fetchone()
        return int(row[0])

    def _history(self, session_id: str) -> list[GrantRecord]:
        rows = self.db.execute(
            f"SELECT seq, amount, granted_at, previous_limit, new_limit, {schema.GRANT_PROBLEM} "
            "AS problem FROM session_grants WHERE session_id = ? ORDER BY seq",
            (session_id,),
        ).fetchall()
        for r in rows:
            if r["problem"] is not None:
                self.quarantine(schema.GRANTS, f"{session_id}/{r['seq']}", r["problem"])
        return [
            GrantRecord(
                session_id=session_id,
                amount=r["amount"],
                granted_at=r["granted_at"],
                previous_limit=r["previous_limit"],
                limit=r["new_limit"],
            )
            for r in rows
            if r["problem"] is None
        ]

    def _snapshot(self, session_id: str) -> SpawnSnapshot:
        """R-SPN-2, computed from the stored row (a never-opened session is unlimited)."""
        row = self._budget(session_id)
        configured = None if row is None else row["configured_limit"]
        used = 0 if row is None else int(row["used"])
        if configured is None:
            return SpawnSnapshot(
                session_id=session_id,
                opened=row is not None,
                used=used,
                limit=None,
                granted=0,
                remaining=None,
                grant_remaining=None,
                configured=None,
                history=[],
            )
        granted = int(row["granted"]) if row is not None else 0
        limit = int(configured) + granted
        return SpawnSnapshot(
            session_id=session_id,
            opened=True,
            used=used,
            limit=limit,
            granted=granted,
            remaining=max(0, limit - used),
            # The configured cap bounds the grants (R-SPN-6), and the stored domain bounds
            # the limit: a grant past 2**31-1 would leave a record no owner could read back.
            grant_remaining=max(0, min(int(configured) - granted, MAX_INT32 - limit)),
            configured=int(configured),
            history=self._history(session_id),
        )

    def _apply_grant(self, session_id: str, amount: int, previous_limit: int) -> GrantRecord:
        """granted += amount; append to the history and keep only its last entries."""
        self.db.execute(
            "UPDATE session_budgets SET granted = granted + ? WHERE session_id = ?",
            (amount, session_id),
        )
        entry = GrantRecord(
            session_id=session_id,
            amount=amount,
            granted_at=int(self.ctx.clock() * 1000),
            previous_limit=previous_limit,
            limit=previous_limit + amount,
        )
        seq = int(
            self.db.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM session_grants WHERE session_id = ?",
                (session_id,),
            ).fetchone()[0]
        )
        self.db.execute(
            "INSERT INTO session_grants(session_id, seq, amount, granted_at, previous_limit, "
            "new_limit) VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, seq, amount, entry.granted_at, entry.previous_limit, entry.limit),
        )
        self.db.execute(
            "DELETE FROM session_grants WHERE session_id = ? AND seq <= ?",
            (session_id, seq - GRANT_HISTORY_MAX),
        )
        return entry


def _check_fits(snapshot: SpawnSnapshot, requested: int) -> None:
    """R-SPN-4: passes when nothing is requested, the session is unlimited, or it fits."""
    if requested <= 0 or snapshot.limit is None or snapshot.remaining is None:
        return
    if requested > snapshot.remaining:
        raise SpawnBudgetExceeded.build(
            snapshot.session_id, snapshot.used, snapshot.limit, requested, snapshot.remaining
        )


def _limit_text(limit: int | None) -> str:
    return "unlimited" if limit is None else str(limit)
