"""`AsyncClient.capacity`: the active async capacity ledger (SPEC §4), awaited.

Each method performs the plan of `CapacityAPI`'s method of the same name (client/capacity.py):
the requests, their checks and the meaning of the replies live there, once. What lives here is
only what differs for asyncio: the awaiting, and `AsyncCapacityHandle`, whose methods are
coroutines and which is an async context manager with the finally-rule of `CapacityHandle`.

It must never build a request itself, nor import the node or the actors.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING, Any

from subagents_node.client import capacity as cap
from subagents_node.client.aio_slotcalls import performed_async
from subagents_node.messages.capacity import (
    AcquireResult,
    CapacitySnapshot,
    Inspection,
    ReportedState,
    RunnerProof,
    SlotHandle,
    SlotKind,
    Verdict,
)
from subagents_node.messages.capacity_hosts import HostReleased, OperatorReleases, SlotsByHost
from subagents_node.messages.errors import SubagentsError

if TYPE_CHECKING:
    from subagents_node.client.aio import AsyncClient

log = logging.getLogger(__name__)


class AsyncCapacityHandle:
    """A held slot (see `CapacityHandle`); `async with` rolls back a slot that never started."""

    def __init__(
        self, client: AsyncClient, wire: SlotHandle, snapshot: CapacitySnapshot | None = None
    ) -> None:
        self._client = client
        self.wire = wire
        self.snapshot = snapshot
        self.started = False

    @property
    def run_id(self) -> str:
        return self.wire.run_id

    @property
    def slot(self) -> int:
        return self.wire.slot

    @property
    def generation(self) -> int:
        return self.wire.generation

    async def mark_started(
        self, runner_id: str, pid: int | None = None, process_start_time: float | None = None
    ) -> AsyncCapacityHandle:
        """R-CAP-13: record the runner's identity. Raises CapacityOwnershipChanged if stale."""
        plan = cap.mark_started_plan(self.wire, runner_id, pid, process_start_time)
        self.started = True  # the caller's copy first (R-CAP-13): no rollback after this
        self.wire = await self._client.perform(plan)
        return self

    async def mark_workflow_started(self) -> AsyncCapacityHandle:
        """R-CAP-14: the controller of this workflow slot is live."""
        plan = cap.mark_workflow_started_plan(self.wire)
        self.started = True
        self.wire = await self._client.perform(plan)
        return self

    async def rollback(self) -> bool:
        """R-CAP-15..17: undo an unstarted grant. False after a start, or when not current."""
        if self.started:
            return False
        result = await self._client.perform(cap.rollback_plan(self.wire))
        if result.rolled_back and result.handle is not None:
            self.wire = result.handle
        return result.rolled_back

    async def __aenter__(self) -> AsyncCapacityHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """The finally-rule (R-ADM-3): a slot that did not start does not survive the block."""
        if self.started:
            return
        try:
            await self.rollback()
        except SubagentsError as err:  # its TTL frees it anyway; keep the caller's own error
            log.warning("capacity: rollback of run %s failed: %s", self.run_id, err.message)

    def __repr__(self) -> str:
        return f"AsyncCapacityHandle({self.wire!r}, started={self.started})"


class AsyncCapacityAPI:
    """`client.capacity` of an AsyncClient: the active async capacity ledger (SPEC §4)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def acquire(
        self,
        session_id: str,
        limit: int,
        run_id: str,
        kind: SlotKind = "runner",
        async_dir: str = "",
        ttl_s: float | None = None,
        host: str = "",
        acquire_id: str | None = None,
    ) -> AsyncCapacityHandle | None:
        """R-CAP-8..12: a handle on the lowest free slot, or None when `limit` is 0; with
        `acquire_id`, the same acquire sent again answers the slot it took."""
        call = cap.acquire_call(session_id, limit, run_id, kind, async_dir, ttl_s, host, acquire_id)
        return self._granted(await performed_async(self._client, call))

    async def transfer(
        self,
        session_id: str,
        limit: int,
        source_run_id: str,
        run_id: str,
        async_dir: str = "",
        ttl_s: float | None = None,
        host: str = "",
        transfer_id: str | None = None,
    ) -> AsyncCapacityHandle | None:
        """R-CAP-18..20: move the source's slot to `run_id`, else acquire a fresh one; with
        `transfer_id`, the same transfer sent again answers the slot it moved."""
        call = cap.transfer_call(
            session_id, limit, source_run_id, run_id, async_dir, ttl_s, host, transfer_id
        )
        return self._granted(await performed_async(self._client, call))

    async def snapshot(self, session_id: str, limit: int = 0) -> CapacitySnapshot:
        return await self._client.perform(cap.snapshot_plan(session_id, limit))

    async def report_terminal(
        self,
        session_id: str,
        run_id: str,
        state: ReportedState,
        *,
        generation: int | None = None,
        live_process: bool = False,
        proof: RunnerProof | None = None,
        workflow_children_proven: bool = False,
        reason: str = "",
    ) -> Verdict:
        plan = cap.report_terminal_plan(
            session_id,
            run_id,
            state,
            generation,
            live_process,
            proof,
            workflow_children_proven,
            reason,
        )
        return await self._client.perform(plan)

    async def inspect(self, run_id: str, session_id: str | None = None) -> Inspection:
        return await self._client.perform(cap.inspect_plan(run_id, session_id))

    async def release_host(self, host: str, reason: str, operator: str = "") -> HostReleased:
        """As `CapacityAPI.release_host`: free every slot of `host`, audited."""
        return await self._client.perform(cap.release_host_plan(host, reason, operator))

    async def hosts(self, host: str | None = None) -> SlotsByHost:
        return await self._client.perform(cap.hosts_plan(host))

    async def holders(self, session_id: str, bound: int = cap.MAX_HOLDERS) -> cap.SessionHolders:
        return await self._client.perform(cap.holders_plan(session_id, bound))

    async def releases(self, host: str | None = None, limit: int = 50) -> OperatorReleases:
        return await self._client.perform(cap.releases_plan(host, limit))

    def handle(self, wire: SlotHandle | dict[str, Any]) -> AsyncCapacityHandle:
        return AsyncCapacityHandle(self._client, cap.as_slot_handle(wire))

    def _granted(self, result: AcquireResult) -> AsyncCapacityHandle | None:
        if result.handle is None:
            return None
        return AsyncCapacityHandle(self._client, result.handle, result.snapshot)
