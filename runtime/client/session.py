"""Client API for the session owner (`client.session`): the session spawn budget (SPEC §6).

Owns nothing but request building: every method is one `session.*` request (a confirmed grant
is two), validated here with the same schema the gateway uses, so a bad argument raises the
same typed `BadRequest` in-process and over a socket, and never reaches the owner.

    s = client.session
    s.open("s1", configured_limit=8)              # OpenSessionResult (idempotent)
    s.reserve("s1", requested=3)                  # ReserveResult, or SpawnBudgetExceeded
    s.reserve("s1", 1, reservation_id=uuid)       # counted once, however often sent
    s.grant("s1", 4, confirm=ask_the_user)        # GrantResult, or GrantRejected
    s.snapshot("s1").text()                       # "Spawn budget: 3/8 used, 5 remaining (…)"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from subagents_node.client.arguments import decision, plain_callback
from subagents_node.client.plans import Plan, build, one
from subagents_node.messages.errors import BadRequest
from subagents_node.messages.runs import RunState
from subagents_node.messages.session import (
    GrantAuthority,
    GrantBasis,
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
    TrackRun,
    TrackRunResult,
)

if TYPE_CHECKING:
    from subagents_node.client.client import Client

#: Shows the user what a grant would do (the result's snapshot) and returns their answer.
ConfirmGrant = Callable[[GrantResult], bool]


# -- the requests, one plan each (shared with the asyncio client, subagents_node.client.aio) --


def open_plan(session_id: str, configured_limit: int | None = None) -> Plan[OpenSessionResult]:
    request = build(OpenSession, session_id=session_id, configured_limit=configured_limit)
    return one(request, OpenSessionResult)


def spawn_snapshot_plan(session_id: str) -> Plan[SpawnSnapshot]:
    return one(build(SpawnSnapshotQuery, session_id=session_id), SpawnSnapshot)


def preflight_plan(
    session_id: str, requested: int, reservation_id: str | None = None
) -> Plan[SpawnSnapshot]:
    request = build(
        SpawnPreflight, session_id=session_id, requested=requested, reservation_id=reservation_id
    )
    return one(request, SpawnSnapshot)


def reserve_plan(
    session_id: str, requested: int, reservation_id: str | None = None
) -> Plan[ReserveResult]:
    request = build(
        SpawnReserve, session_id=session_id, requested=requested, reservation_id=reservation_id
    )
    return one(request, ReserveResult)


def grant_plan(
    session_id: str,
    additional: int,
    *,
    depth: int = 0,
    authority: GrantAuthority = "confirm",
    yes: bool = False,
    confirm: ConfirmGrant | None = None,
    expected: GrantBasis | None = None,
) -> Plan[GrantResult]:
    """R-SPN-6; see `SessionAPI.grant`. A `confirm` that is an async function, or answers
    anything but True or False, is BadRequest: nothing is applied."""
    plain_callback(confirm, "confirm")
    if expected is not None and not isinstance(expected, GrantBasis):
        raise BadRequest(
            f"expected must be a preview's basis (GrantBasis), not {type(expected).__name__}",
            reason="argument",
            field="expected",
        )
    fields: dict[str, Any] = {
        "session_id": session_id,
        "additional": additional,
        "depth": depth,
        "authority": authority,
    }
    if authority != "confirm" or yes:
        basis = None if expected is None else expected.model_dump()
        request = build(GrantSpawns, **fields, confirmed=yes, expected=basis)
        granted: GrantResult = yield from one(request, GrantResult)
        return granted
    preview: GrantResult = yield from one(
        build(GrantSpawns, **fields, confirmed=False), GrantResult
    )
    if confirm is None or preview.outcome != "confirmation_required":
        return preview
    if not decision(confirm(preview), "confirm"):
        return preview.model_copy(update={"outcome": "cancelled"})
    request = build(GrantSpawns, **fields, confirmed=True, expected=preview.basis.model_dump())
    confirmed: GrantResult = yield from one(request, GrantResult)
    return confirmed


def track_run_plan(session_id: str, run_id: str, state: RunState) -> Plan[int]:
    request = build(TrackRun, session_id=session_id, run_id=run_id, state=state)
    tracked: TrackRunResult = yield from one(request, TrackRunResult)
    return tracked.active


def status_plan(session_id: str) -> Plan[SessionStatus]:
    return one(build(SessionStatusQuery, session_id=session_id), SessionStatus)


class SessionAPI:
    def __init__(self, client: Client) -> None:
        self._client = client

    def open(self, session_id: str, configured_limit: int | None = None) -> OpenSessionResult:
        """Open `session_id` with its configured cap (None or 0: unlimited; first open wins)."""
        return self._client.perform(open_plan(session_id, configured_limit))

    def spawn_snapshot(self, session_id: str) -> SpawnSnapshot:
        """R-SPN-2. A never-opened session reads as unlimited with nothing used."""
        return self._client.perform(spawn_snapshot_plan(session_id))

    def snapshot(self, session_id: str) -> SpawnSnapshot:
        """Alias of `spawn_snapshot`."""
        return self.spawn_snapshot(session_id)

    def preflight(
        self, session_id: str, requested: int, reservation_id: str | None = None
    ) -> SpawnSnapshot:
        """R-SPN-4: raise SpawnBudgetExceeded unless `requested` fits (a reservation made
        already under `reservation_id` fits); changes nothing."""
        return self._client.perform(preflight_plan(session_id, requested, reservation_id))

    def reserve(
        self, session_id: str, requested: int, reservation_id: str | None = None
    ) -> ReserveResult:
        """R-SPN-5: preflight, then count `requested` when the session has a cap. With
        `reservation_id` (one per launch) the same reservation sent again counts nothing more."""
        return self._client.perform(reserve_plan(session_id, requested, reservation_id))

    def grant(
        self,
        session_id: str,
        additional: int,
        *,
        depth: int = 0,
        authority: GrantAuthority = "confirm",
        yes: bool = False,
        confirm: ConfirmGrant | None = None,
        expected: GrantBasis | None = None,
    ) -> GrantResult:
        """R-SPN-6. Raises GrantRejected when a rule refuses the grant.

        Under authority `confirm` (the default) the grant is applied only when `yes` is set or
        `confirm` approves the owner's preview; it is then sent with the previewed basis, so a
        budget that changed while the user was deciding is refused (`changed`). Without `yes`
        or `confirm` the preview itself is returned (outcome `confirmation_required`); pass its
        `basis` back as `expected` with `yes=True` to apply it. A declined confirmation is not an
        error: it returns outcome `cancelled` and changes nothing.
        """
        plan = grant_plan(
            session_id,
            additional,
            depth=depth,
            authority=authority,
            yes=yes,
            confirm=confirm,
            expected=expected,
        )
        return self._client.perform(plan)

    def track_run(self, session_id: str, run_id: str, state: RunState) -> int:
        """Record a run's state for the grant rule; answers the session's active-run count."""
        return self._client.perform(track_run_plan(session_id, run_id, state))

    def status(self, session_id: str) -> SessionStatus:
        return self._client.perform(status_plan(session_id))
