"""The owners' APIs of `AsyncClient`: `client.capacity`, `.fanout`, `.session`, `.runs`, awaited.

Each method performs the plan of the sync method of the same name (client/capacity.py,
fanout.py, session.py, runs.py): the requests, their checks and the meaning of the replies
live there, once. What lives here is only what differs for asyncio: the awaiting, and the
handles (`AsyncCapacityHandle`, `AsyncReservation`) whose methods are coroutines and which are
async context managers with the same finally-rules as their sync twins.

It must never build a request itself, nor import the node or the actors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from subagents_node.client import capacity as cap
from subagents_node.client import fanout as fan
from subagents_node.client import runs as run_plans
from subagents_node.client import session as ses
from subagents_node.client.fanout import DescriptorLike
from subagents_node.client.runs import WATCH_WAIT_S, OnEvent, OnGap
from subagents_node.client.session import ConfirmGrant
from subagents_node.messages.capacity import (
    AcquireResult,
    CapacitySnapshot,
    HostReleased,
    Inspection,
    OperatorReleases,
    ReportedState,
    RunnerProof,
    SlotHandle,
    SlotKind,
    SlotsByHost,
    Verdict,
)
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.fanout import (
    BudgetReading,
    FanoutDescriptor,
    FanoutSnapshot,
    ReservationGrant,
)
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
from subagents_node.messages.supervisor import ChainStep, FleetEvents, Launch, RunEvents, RunView

if TYPE_CHECKING:
    from subagents_node.client.aio import AsyncClient

log = logging.getLogger(__name__)


# -- capacity ---------------------------------------------------------------------------------


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
    ) -> AsyncCapacityHandle | None:
        """R-CAP-8..12: a handle on the lowest free slot, or None when `limit` is 0."""
        plan = cap.acquire_plan(session_id, limit, run_id, kind, async_dir, ttl_s, host)
        return self._granted(await self._client.perform(plan))

    async def transfer(
        self,
        session_id: str,
        limit: int,
        source_run_id: str,
        run_id: str,
        async_dir: str = "",
        ttl_s: float | None = None,
        host: str = "",
    ) -> AsyncCapacityHandle | None:
        """R-CAP-18..20: move the source's slot to `run_id`, else acquire a fresh one."""
        plan = cap.transfer_plan(session_id, limit, source_run_id, run_id, async_dir, ttl_s, host)
        return self._granted(await self._client.perform(plan))

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

    async def releases(self, host: str | None = None, limit: int = 50) -> OperatorReleases:
        return await self._client.perform(cap.releases_plan(host, limit))

    def handle(self, wire: SlotHandle | dict[str, Any]) -> AsyncCapacityHandle:
        return AsyncCapacityHandle(self._client, cap.as_slot_handle(wire))

    def _granted(self, result: AcquireResult) -> AsyncCapacityHandle | None:
        if result.handle is None:
            return None
        return AsyncCapacityHandle(self._client, result.handle, result.snapshot)


# -- fan-out ----------------------------------------------------------------------------------


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

    async def claim(self, descriptor: DescriptorLike, paths: Iterable[str]) -> FanoutSnapshot:
        """Claim one unit per path, all or nothing; raises FanoutLimitExceeded (R-FAN-16)."""
        return await self._client.perform(fan.claim_plan(descriptor, paths))

    async def reserve(
        self, descriptor: DescriptorLike, paths: Iterable[str], ttl_s: float
    ) -> AsyncReservation:
        grant = await self._client.perform(fan.reserve_plan(descriptor, paths, ttl_s))
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


# -- session ----------------------------------------------------------------------------------


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

    async def preflight(self, session_id: str, requested: int) -> SpawnSnapshot:
        return await self._client.perform(ses.preflight_plan(session_id, requested))

    async def reserve(self, session_id: str, requested: int) -> ReserveResult:
        return await self._client.perform(ses.reserve_plan(session_id, requested))

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


# -- runs -------------------------------------------------------------------------------------


class AsyncRunsAPI:
    """`client.runs` of an AsyncClient: launch, watch, wait, show, list, stop."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def launch(self, launch: Launch) -> RunView:
        return await self._client.perform(run_plans.launch_plan(launch))

    async def watch(
        self, run_id: str, after_seq: int = 0, wait_s: float = WATCH_WAIT_S
    ) -> RunEvents:
        plan = run_plans.watch_plan(run_id, after_seq, wait_s, self._client.timeout)
        return await self._client.perform(plan)

    async def watch_all(
        self, after_seq: int = 0, wait_s: float = WATCH_WAIT_S, limit: int = 500
    ) -> FleetEvents:
        plan = run_plans.watch_all_plan(after_seq, wait_s, limit, self._client.timeout)
        return await self._client.perform(plan)

    async def wait(
        self,
        run_id: str,
        timeout: float | None = None,
        on_event: OnEvent | None = None,
        on_gap: OnGap | None = None,
        after_seq: int = 0,
    ) -> RunView:
        """Until the run is terminal (R-RUN-3); other coroutines run meanwhile. A worker's
        partition does not end it; `on_event` sees the events after `after_seq` (`Runs.wait`)."""
        client = self._client
        carried = bool(getattr(client.transport, "host", ""))
        plan = run_plans.wait_plan(
            client.address, client.timeout, run_id, timeout, on_event, on_gap, carried, after_seq
        )
        return await client.perform(plan)

    async def attach(
        self,
        run_id: str,
        steps: Sequence[ChainStep],
        capacity_limit: int = 0,
        depth: int = 0,
        env: Mapping[str, str] | None = None,
        inherited_fanout: str | None = None,
    ) -> RunView:
        """As `Client.runs.attach` (R-RES-6)."""
        plan = run_plans.attach_plan(run_id, steps, capacity_limit, depth, env, inherited_fanout)
        return await self._client.perform(plan)

    async def rerun(
        self, run_id: str, task: str, child: int = 0, env: Mapping[str, str] | None = None
    ) -> RunView:
        """As `Client.runs.rerun` (R-MISC-2)."""
        return await self._client.perform(run_plans.rerun_plan(run_id, task, child, env))

    async def show(self, run_id: str) -> RunView:
        return await self._client.perform(run_plans.show_plan(run_id))

    async def list(
        self,
        session_id: str | None = None,
        active_only: bool = False,
        limit: int = 50,
        root_run_id: str | None = None,
        parent_run_id: str | None = None,
        after_run_id: str | None = None,
    ) -> list[RunView]:
        plan = run_plans.list_plan(
            session_id, active_only, limit, root_run_id, parent_run_id, after_run_id
        )
        return await self._client.perform(plan)

    async def stop(self, run_id: str) -> RunView:
        return await self._client.perform(run_plans.stop_plan(run_id))

    async def pause(self, run_id: str) -> RunView:
        """R-RUN-2 interrupt-as-pause (RunsAPI.pause)."""
        return await self._client.perform(run_plans.pause_plan(run_id))

    async def approve(
        self,
        run_id: str,
        depth: int = 0,
        capacity_limit: int = 0,
        env: dict[str, str] | None = None,
        inherited_fanout: str | None = None,
    ) -> RunView:
        """The run that goes on past the checkpoint `run_id` waits at (RunsAPI.approve)."""
        plan = run_plans.approve_plan(run_id, depth, capacity_limit, env, inherited_fanout)
        return await self._client.perform(plan)

    async def reject(self, run_id: str, reason: str = "") -> RunView:
        """The run waiting at a checkpoint ends `rejected` (RunsAPI.reject)."""
        return await self._client.perform(run_plans.reject_plan(run_id, reason))
