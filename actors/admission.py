"""Launch admission: the R-ADM-1 pipeline, written as a generator the RunSupervisor drives.

Owns the order of admission and its rollback obligations, nothing else. The generator yields
each ledger request (capacity, fan-out, session) and receives its result, or has the typed error
thrown in, so the supervisor never blocks its thread on another owner. Local steps (the run dir,
the run's rows, starting children) are the host's.

Order (SPEC R-ADM-1, adapted by §0): depth guard -> fan-out authorization -> validation
(`{previous}`, cwd) -> session spawn preflight -> capacity acquire (top-level background only)
-> fan-out budget resolve + static claim -> run dir -> spawn reserve -> record + start ->
mark_started. Once a slot is held, every failure rolls it back (R-ADM-2), and a handle that is
still unstarted when the pipeline ends, by return or raise, is rolled back (R-ADM-3). Fan-out
claims made before a later failure stay claimed (R-FAN-15).

Fault injection (tests only): the host's `fault_points` names steps that fail with a typed
`InjectedFault` (one per rollback point: FAULT_POINTS); the supervisor hands over a non-empty
set only on a node started with faults enabled.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any, Protocol

from actors import runplan
from messages.base import Message, Request
from messages.capacity import Acquire, AcquireResult, MarkStarted, Rollback, SlotHandle
from messages.errors import SubagentsError
from messages.fanout import (
    ClaimPaths,
    CreateBudget,
    FanoutDescriptor,
    FanoutDescriptorInvalid,
    FanoutSnapshot,
    decode_descriptor,
    extend,
)
from messages.session import NestedCallBlocked, OpenSession, SpawnPreflight, SpawnReserve
from messages.supervisor import (
    FanoutNotAuthorized,
    InjectedFault,
    Launch,
    RunCwdMissing,
    RunStorageFailed,
    RunView,
    Snapshots,
)

log = logging.getLogger(__name__)

Pipeline = Generator[Request, Message, RunView]

#: The steps at which a failure must roll a held slot back (R-ADM-2), plus the last two (R-ADM-3's
#: finally-rule; a refused mark_started, R-ADM-5), by the names `fault_points` uses.
FAULT_POINTS = (
    "resolve_budget",
    "claim_paths",
    "create_run_dir",
    "reserve_spawns",
    "record_run",
    "mark_started",
)


class AdmissionHost(Protocol):
    """What the pipeline needs from the RunSupervisor (its own state and its children)."""

    @property
    def fault_points(self) -> frozenset[str]: ...

    def run_dir(self, run_id: str) -> Path: ...

    def record_and_start(
        self,
        launch: Launch,
        run_id: str,
        runner_id: str,
        descriptor: FanoutDescriptor,
        handle: SlotHandle | None,
        snapshots: Snapshots,
    ) -> RunView: ...


def _expect(result: Message, kind: type[Any]) -> Any:
    if not isinstance(result, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(result).__name__}")
    return result


def validate(launch: Launch) -> None:
    """Checks that need no ledger: nesting depth, authorization, `{previous}`, directories."""
    if launch.depth >= launch.max_depth:
        raise NestedCallBlocked(
            f"Nested subagent call blocked (depth={launch.depth}, max={launch.max_depth}).",
            depth=launch.depth,
            max_depth=launch.max_depth,
        )
    if launch.depth > 0 and launch.inherited_fanout is None:
        raise FanoutNotAuthorized(
            "This child was not given a run fan-out budget, so it may not launch subagents "
            "(its agent needs `fanout: true`).",
            depth=launch.depth,
        )
    runplan.check_previous(launch)
    items = launch.items or [item for step in launch.chain for item in step.items]
    for cwd in [launch.cwd, *(i.cwd for i in items if i.cwd)]:
        path = Path(launch.cwd, cwd) if cwd else Path(launch.cwd)
        if not path.is_dir():
            raise RunCwdMissing(f"working directory does not exist: {path}", cwd=str(path))


def _inject(host: AdmissionHost, point: str) -> None:
    if point in host.fault_points:
        raise InjectedFault(f"injected failure at admission step {point}", point=point)


def admit(host: AdmissionHost, launch: Launch, run_id: str, runner_id: str) -> Pipeline:
    validate(launch)
    requested = runplan.requested_spawns(launch)
    yield OpenSession(session_id=launch.session_id, configured_limit=launch.spawns_per_session)
    yield SpawnPreflight(session_id=launch.session_id, requested=requested)

    handle: SlotHandle | None = None
    capacity = None
    started = False
    try:
        if runplan.capacity_eligible(launch):
            acquired: AcquireResult = _expect(
                (
                    yield Acquire(
                        session_id=launch.session_id,
                        limit=launch.capacity_limit,
                        run_id=run_id,
                        kind="runner",
                        async_dir=str(host.run_dir(run_id)),
                    )
                ),
                AcquireResult,
            )
            handle, capacity = acquired.handle, acquired.snapshot

        _inject(host, "resolve_budget")
        descriptor = yield from _resolve_budget(launch, run_id)
        _inject(host, "claim_paths")
        fanout: FanoutSnapshot = _expect(
            (yield ClaimPaths(descriptor=descriptor, paths=runplan.static_paths(launch))),
            FanoutSnapshot,
        )

        run_dir = host.run_dir(run_id)
        _inject(host, "create_run_dir")
        try:
            run_dir.mkdir(parents=True, mode=0o700)
        except OSError as exc:
            raise RunStorageFailed(
                f"Failed to create run storage: {exc}", run_dir=str(run_dir)
            ) from None

        _inject(host, "reserve_spawns")
        yield SpawnReserve(session_id=launch.session_id, requested=requested)

        snapshots = Snapshots(
            capacity_used=capacity.used if capacity else None,
            capacity_limit=capacity.limit if capacity else None,
            fanout_used=fanout.used,
            fanout_limit=fanout.limit,
            fanout_remaining=fanout.remaining,
            fanout_root=descriptor.root_run_id,
        )
        _inject(host, "record_run")
        view = host.record_and_start(launch, run_id, runner_id, descriptor, handle, snapshots)
        _inject(host, "mark_started")
        if handle is not None:
            _expect(
                (yield MarkStarted(handle=handle, runner_id=runner_id, pid=os.getpid())),
                SlotHandle,
            )
        started = True
        return view
    finally:
        if handle is not None and not started:
            try:
                yield Rollback(handle=handle)  # R-ADM-2 / R-ADM-3
            except SubagentsError as err:
                log.error("rollback of run %s's capacity slot failed: %s", run_id, err.message)


def _resolve_budget(launch: Launch, run_id: str) -> Generator[Request, Message, FanoutDescriptor]:
    """R-FAN-8: the inherited budget extended by this run's short id, else a new budget."""
    if launch.inherited_fanout is not None:
        try:
            inherited = decode_descriptor(launch.inherited_fanout)
        except FanoutDescriptorInvalid as err:
            reason = err.details.get("reason", err.message)
            raise FanoutDescriptorInvalid(
                f"Invalid inherited run fan-out budget: {reason}", reason=reason
            ) from None
        return extend(inherited, runplan.short_id(run_id))
    created = yield CreateBudget(root_run_id=runplan.short_id(run_id), limit=launch.spawns_per_run)
    descriptor: FanoutDescriptor = _expect(created, FanoutDescriptor)
    return descriptor
