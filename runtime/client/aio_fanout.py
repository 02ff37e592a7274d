"""`AsyncClient.fanout`: run fan-out budgets (SPEC §5), awaited.

Each method performs the plan of `FanoutAPI`'s method of the same name (client/fanout.py): the
requests, their checks and the meaning of the replies live there, once. What lives here is
only what differs for asyncio: the awaiting, and `AsyncReservation`, whose methods are
coroutines and which is an async context manager that commits or aborts as `Reservation` does.

It must never build a request itself, nor import the node or the actors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from subagents_node.client import fanout as fan
from subagents_node.client.aio_slotcalls import performed_async
from subagents_node.client.fanout import DescriptorLike
from subagents_node.messages.fanout import (
    BudgetReading,
    FanoutDescriptor,
    FanoutSnapshot,
    ReservationGrant,
)

if TYPE_CHECKING:
    from subagents_node.client.aio import AsyncClient


class AsyncReservation:
    """Claims held until `await commit()` or `await abort()`; `async with` commits on success
    and aborts on error (see `Reservation`)."""

    def __init__(self, client: AsyncClient, grant: ReservationGrant) -> None:
        self._client = client
        self.grant = grant

    @property
    def reservation_id(self) -> str:
        return self.grant.reservation_id

    async def commit(self) -> FanoutSnapshot:
        return await self._client.perform(fan.commit_plan(self.reservation_id))

    async def abort(self) -> FanoutSnapshot:
        return await self._client.perform(fan.abort_plan(self.reservation_id))

    async def __aenter__(self) -> AsyncReservation:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            await self.commit()
            return
        try:
            await self.abort()
        except Exception as abort_error:  # the block's own error is the one to report
            if exc is not None:
                exc.add_note(f"aborting reservation {self.reservation_id} failed: {abort_error}")


class AsyncFanoutAPI:
    """`client.fanout` of an AsyncClient: run fan-out budgets (SPEC §5)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, root_run_id: str, limit: int) -> FanoutDescriptor:
        return await self._client.perform(fan.create_plan(self._client.address, root_run_id, limit))

    async def validate(self, descriptor: DescriptorLike) -> FanoutDescriptor:
        return await self._client.perform(fan.validate_plan(descriptor))

    async def claim(
        self, descriptor: DescriptorLike, paths: Iterable[str], claim_id: str | None = None
    ) -> FanoutSnapshot:
        """Claim one unit per path, all or nothing; raises FanoutLimitExceeded (R-FAN-16).
        With `claim_id` (one per batch) the same batch sent again claims nothing more."""
        return await self._client.perform(fan.claim_plan(descriptor, paths, claim_id))

    async def reserve(
        self, descriptor: DescriptorLike, paths: Iterable[str], ttl_s: float
    ) -> AsyncReservation:
        grant = await performed_async(self._client, fan.reserve_call(descriptor, paths, ttl_s))
        return AsyncReservation(self._client, grant)

    async def commit(self, reservation_id: str) -> FanoutSnapshot:
        return await self._client.perform(fan.commit_plan(reservation_id))

    async def abort(self, reservation_id: str) -> FanoutSnapshot:
        return await self._client.perform(fan.abort_plan(reservation_id))

    async def snapshot(self, descriptor: DescriptorLike) -> FanoutSnapshot:
        return await self._client.perform(fan.snapshot_plan(descriptor))

    async def snapshots(self, descriptors: Sequence[DescriptorLike]) -> list[BudgetReading]:
        return await self._client.perform(fan.snapshots_plan(descriptors))

    async def from_env(self, environ: Mapping[str, str] | None = None) -> FanoutDescriptor | None:
        return await self._client.perform(fan.from_env_plan(environ))
