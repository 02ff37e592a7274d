"""`AsyncClient.session`: the session spawn budget (SPEC §6), awaited.

Each method performs the plan of `SessionAPI`'s method of the same name (client/session.py):
the requests, their checks and the meaning of the replies live there, once; here is only the
awaiting.

It must never build a request itself, nor import the node or the actors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from subagents_node.client import session as ses
from subagents_node.client.session import ConfirmGrant
from subagents_node.messages.runs import RunState
from subagents_node.messages.session import (
    GrantAuthority,
    GrantBasis,
    GrantResult,
    OpenSessionResult,
    ReserveResult,
    SessionStatus,
    SpawnSnapshot,
)

if TYPE_CHECKING:
    from subagents_node.client.aio import AsyncClient


class AsyncSessionAPI:
    """`client.session` of an AsyncClient: the session spawn budget (SPEC §6)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def open(self, session_id: str, configured_limit: int | None = None) -> OpenSessionResult:
        return await self._client.perform(ses.open_plan(session_id, configured_limit))

    async def spawn_snapshot(self, session_id: str) -> SpawnSnapshot:
        return await self._client.perform(ses.spawn_snapshot_plan(session_id))

    async def snapshot(self, session_id: str) -> SpawnSnapshot:
        return await self.spawn_snapshot(session_id)

    async def preflight(
        self, session_id: str, requested: int, reservation_id: str | None = None
    ) -> SpawnSnapshot:
        return await self._client.perform(ses.preflight_plan(session_id, requested, reservation_id))

    async def reserve(
        self, session_id: str, requested: int, reservation_id: str | None = None
    ) -> ReserveResult:
        """R-SPN-5, as `SessionAPI.reserve` (`reservation_id`: counted once)."""
        return await self._client.perform(ses.reserve_plan(session_id, requested, reservation_id))

    async def grant(
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
        """R-SPN-6, as `SessionAPI.grant` (`confirm` is a plain callable)."""
        plan = ses.grant_plan(
            session_id,
            additional,
            depth=depth,
            authority=authority,
            yes=yes,
            confirm=confirm,
            expected=expected,
        )
        return await self._client.perform(plan)

    async def track_run(self, session_id: str, run_id: str, state: RunState) -> int:
        return await self._client.perform(ses.track_run_plan(session_id, run_id, state))

    async def status(self, session_id: str) -> SessionStatus:
        return await self._client.perform(ses.status_plan(session_id))
