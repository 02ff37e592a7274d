"""Client API for the session owner (`client.session`): the session spawn budget (SPEC §6).

Owns nothing but request building: every method is one `session.*` request (a confirmed grant
is two), validated here with the same schema the gateway uses, so a bad argument raises the
same typed `BadRequest` in-process and over a socket, and never reaches the owner.

    s = client.session
    s.open("s1", configured_limit=8)              # OpenSessionResult (idempotent)
    s.reserve("s1", requested=3)                  # ReserveResult, or SpawnBudgetExceeded
    s.grant("s1", 4, confirm=ask_the_user)        # GrantResult, or GrantRejected
    s.snapshot("s1").text()                       # "Spawn budget: 3/8 used, 5 remaining (…)"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from subagents_node.messages.base import Message, Request, validate_request
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

R = TypeVar("R", bound=Message)

#: Shows the user what a grant would do (the result's snapshot) and returns their answer.
ConfirmGrant = Callable[[GrantResult], bool]


class SessionAPI:
    def __init__(self, client: Client) -> None:
        self._client = client

    def open(self, session_id: str, configured_limit: int | None = None) -> OpenSessionResult:
        """Open `session_id` with its configured cap (None or 0: unlimited; first open wins)."""
        return self._ask(
            OpenSession,
            OpenSessionResult,
            session_id=session_id,
            configured_limit=configured_limit,
        )

    def spawn_snapshot(self, session_id: str) -> SpawnSnapshot:
        """R-SPN-2. A never-opened session reads as unlimited with nothing used."""
        return self._ask(SpawnSnapshotQuery, SpawnSnapshot, session_id=session_id)

    def snapshot(self, session_id: str) -> SpawnSnapshot:
        """Alias of `spawn_snapshot`."""
        return self.spawn_snapshot(session_id)

    def preflight(self, session_id: str, requested: int) -> SpawnSnapshot:
        """R-SPN-4: raise SpawnBudgetExceeded unless `requested` fits; changes nothing."""
        return self._ask(SpawnPreflight, SpawnSnapshot, session_id=session_id, requested=requested)

    def reserve(self, session_id: str, requested: int) -> ReserveResult:
        """R-SPN-5: preflight, then count `requested` when the session has a cap."""
        return self._ask(SpawnReserve, ReserveResult, session_id=session_id, requested=requested)

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
        fields: dict[str, Any] = {
            "session_id": session_id,
            "additional": additional,
            "depth": depth,
            "authority": authority,
        }
        if authority != "confirm" or yes:
            return self._ask(
                GrantSpawns,
                GrantResult,
                **fields,
                confirmed=yes,
                expected=None if expected is None else expected.model_dump(),
            )
        preview = self._ask(GrantSpawns, GrantResult, **fields, confirmed=False)
        if confirm is None or preview.outcome != "confirmation_required":
            return preview
        if not confirm(preview):
            return preview.model_copy(update={"outcome": "cancelled"})
        return self._ask(
            GrantSpawns,
            GrantResult,
            **fields,
            confirmed=True,
            expected=preview.basis.model_dump(),
        )

    def track_run(self, session_id: str, run_id: str, state: RunState) -> int:
        """Record a run's state for the grant rule; answers the session's active-run count."""
        result = self._ask(
            TrackRun, TrackRunResult, session_id=session_id, run_id=run_id, state=state
        )
        return result.active

    def status(self, session_id: str) -> SessionStatus:
        return self._ask(SessionStatusQuery, SessionStatus, session_id=session_id)

    def _ask(self, kind: type[Request], result: type[R], **fields: Any) -> R:
        request = validate_request(kind, fields)
        return self._client.ask(request, result)
