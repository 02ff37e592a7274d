"""Launch admission: the R-ADM-1 pipeline, written as a generator the RunSupervisor drives.

Owns the order of admission and its rollback obligations, nothing else. The generator yields
each ledger request (capacity, fan-out, session) and receives its result, or has the typed error
thrown in, so the supervisor never blocks its thread on another owner. Local steps (the run dir,
the run's rows, starting children) are the host's.

Order (SPEC R-ADM-1, adapted by §0): depth guard -> fan-out authorization -> validation
(`{previous}`, cwd) -> a nested resume's or attach's one path on its caller's route (R-FAN-5)
-> session spawn preflight -> capacity acquire (top-level background only) -> fan-out budget
resolve + static claim -> run dir -> spawn reserve -> record + start -> mark_started. Once a
slot is held, every failure rolls it back (R-ADM-2), and a handle that is still unstarted when
the pipeline ends, by return or raise, is rolled back (R-ADM-3). Fan-out claims made before a
later failure stay claimed (R-FAN-15).

A launch sent again under its client's launch id (runs/workflowkeys.py) after a first attempt
that recorded no run is admitted again, and finds what that attempt charged under ids made of
the launch id, so nothing is charged twice: its spawn reservation and its fan-out claim are
counted once, its capacity slot (held under the run's id, the same each attempt) is rolled back
and taken again, and its run directory is made afresh.

Fault injection (tests only): the host's `fault_points` names steps that fail with a typed
`InjectedFault` (one per rollback point: FAULT_POINTS); the supervisor hands over a non-empty
set only on a node started with faults enabled.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any, Protocol

from subagents_node.actors.outcomes import store_full
from subagents_node.actors.pipelines import Durable
from subagents_node.actors.records import Record, init_fields
from subagents_node.actors.runs import owedslots, runplan, workflowkeys
from subagents_node.messages.base import Message, Request
from subagents_node.messages.capacity import (
    Acquire,
    AcquireResult,
    Inspect,
    Inspection,
    MarkStarted,
    MarkWorkflowStarted,
    Rollback,
    SlotHandle,
    Transfer,
)
from subagents_node.messages.delivery import (
    argv_task_problem,
    check_command,
    check_launch_directory,
    check_working_directory,
)
from subagents_node.messages.domains import MAX_TASK_CHARS
from subagents_node.messages.errors import (
    Busy,
    CapacityRunAlreadyHeld,
    FanoutDescriptorInvalid,
    FanoutNotAuthorized,
    InjectedFault,
    NestedCallBlocked,
    RunStorageFailed,
    SubagentsError,
    TaskUndeliverable,
)
from subagents_node.messages.fanout import (
    ClaimPaths,
    CreateBudget,
    FanoutDescriptor,
    FanoutSnapshot,
    decode_descriptor,
    extend,
)
from subagents_node.messages.session import OpenSession, SpawnPreflight, SpawnReserve
from subagents_node.messages.supervisor import Launch, RunView, Snapshots, TaskItem

log = logging.getLogger(__name__)

Pipeline = Generator[Request | Durable, Message, RunView]

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

    def crash_point(self, point: str) -> None:
        """Tests only: kill the process at `point` (a node started with faults)."""

    def owe(self, request: Request, run_id: str) -> None:
        """Durable with the current transaction, sent until its owner answers (outbox.py)."""

    def check_workflow_child(self, launch: Launch) -> None:
        """R-FAN-24: refuse internal workflow fields not backed by the workflow's token."""

    def record_and_start(
        self,
        launch: Launch,
        run_id: str,
        runner_id: str,
        descriptor: FanoutDescriptor,
        handle: SlotHandle | None,
        snapshots: Snapshots,
        source_run_id: str | None = None,
    ) -> RunView: ...


def _expect(result: Message, kind: type[Any]) -> Any:
    if not isinstance(result, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(result).__name__}")
    return result


def validate(launch: Launch) -> None:
    """Checks that need no ledger: nesting depth, authorization, `{previous}`, directories."""
    if launch.depth >= launch.max_depth:
        raise NestedCallBlocked(
            f"Nested subagent call blocked (depth={launch.depth}, max={launch.max_depth}). "
            "Raise max_subagent_depth (or SUBAGENTS_MAX_DEPTH) to allow deeper nesting.",
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
    check_items(launch, _labelled_items(launch))


def check_items(launch: Launch, labelled: list[tuple[str, TaskItem]]) -> None:
    """What each item needs before anything is charged for it (also a chain append's, R-APP-1,
    and an expand step's batch, R-FAN-21): a usable working directory, its agent's command, a
    task within the task limit, and a task exec(2) accepts in argv. An expansion's items share
    their template's directory and agent, so each distinct one is checked once."""
    items = [item for _, item in labelled]
    check_launch_directory(launch.cwd)  # absolute: the node's own directory is not the caller's
    for cwd in dict.fromkeys([launch.cwd, *(i.cwd for i in items if i.cwd)]):
        check_working_directory(Path(launch.cwd, cwd))  # an item's own cwd: under the launch's
    for agent in {id(item.agent): item.agent for item in items}.values():
        check_command(agent, launch.env)  # AgentCommandNotFound before any charge
    for label, item in labelled:
        if len(item.task) > MAX_TASK_CHARS:  # built by substitution (expand), not validated
            raise TaskUndeliverable(
                f"Task {label} is {len(item.task):,} characters, over the "
                f"{MAX_TASK_CHARS:,}-character task limit.",
                agent=item.agent.name,
                path=label,
                reason="task_too_long",
            )
        problem = argv_task_problem(item.agent, item.task, launch.env)
        if problem is not None:
            raise TaskUndeliverable(
                f"Task {label} cannot be passed to agent '{item.agent.name}' in its "
                f"arguments: {problem}",
                agent=item.agent.name,
                path=label,
            )


def _labelled_items(launch: Launch) -> list[tuple[str, TaskItem]]:
    """Every item a launch names with its path (R-FAN-12), expand templates included."""
    labelled = [
        (child.label, child.item) for group in runplan.plan_children(launch) for child in group
    ]
    for i, step in runplan.dynamic_steps(launch).items():  # i is the group: offset included
        labelled += [(f"chain[{launch.chain_offset + i}]", item) for item in step.items]
    return labelled


def _inject(host: AdmissionHost, point: str) -> None:
    host.crash_point(point)
    if point in host.fault_points:
        raise InjectedFault(f"injected failure at admission step {point}", point=point)


class ResumePlan(Record):
    """R-RES-3/4: what a resume reuses: the source's budget and, if it held one, its slot."""

    __slots__ = ("descriptor", "source_run_id", "transfer")
    source_run_id: str
    descriptor: FanoutDescriptor
    transfer: bool

    def __init__(self, source_run_id: str, descriptor: FanoutDescriptor, transfer: bool) -> None:
        init_fields(self, source_run_id=source_run_id, descriptor=descriptor, transfer=transfer)


def storage_failed(exc: OSError, run_dir: Path) -> SubagentsError:
    """R-ADM-2: why a run's directory or files could not be made. A full disk (or quota) is
    the StoreFull every store answers, so a client that retries on `store_full` retries this;
    no descriptor left (the supervisor holds one per live child's shim) is load, `busy` as
    everywhere else (docs/operations.md), not a storage failure to give up on."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return Busy(
            "cannot make the run's files: the run supervisor has no file descriptor left "
            "(too many open files); retry later, or raise the node's limit (ulimit -Hn)",
            target="supervisor",
            run_dir=str(run_dir),
        )
    return store_full(exc, "supervisor") or RunStorageFailed(
        f"Failed to create run storage: {exc}", run_dir=str(run_dir)
    )


def remove_run_dir(run_dir: Path) -> None:
    """Remove a refused launch's directory. `rmtree` opens it to walk it and, out of
    descriptors, left it behind (an orphan for `prune` to find 10 minutes later); an empty one
    needs no descriptor to remove."""
    shutil.rmtree(run_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()


def admit(
    host: AdmissionHost,
    launch: Launch,
    run_id: str,
    runner_id: str,
    resume: ResumePlan | None = None,
    reservation_id: str | None = None,
) -> Pipeline:
    """`reservation_id` names the launch's spawn reservation when the launch may be sent again
    after its node was lost (a workflow child's, a launch id's: workflowkeys.py): counted once
    (R-SPN-5)."""
    validate(launch)
    host.check_workflow_child(launch)
    caller_route = _route_only(launch, resume)
    if caller_route is not None:
        # A nested resume runs on its source's budget (R-RES-4), a nested attach on a new one
        # (R-FAN-10, A-12); the caller's own route is its authorization to launch (R-FAN-4).
        # It is also a launch from the caller's run tree, so it claims one path there: the
        # spec charges it nowhere (R-FAN-23, R-TOP-7), which would let one child relaunch
        # runs without bound; claimed, its tree's fan-out limit bounds them (docs/concepts.md).
        route = _decode_inherited(caller_route)
        label = _caller_path(launch, resume)
        # Under a launch id, found claimed when sent again (R-FAN-15), as a nested launch's.
        route_claim = None
        if launch.launch_id is not None:
            route_claim = workflowkeys.claim_id(launch.launch_id, route.budget_id)
        claim = ClaimPaths(descriptor=route, paths=[label], claim_id=route_claim)
        _expect((yield claim), FanoutSnapshot)
    # Resumes reuse the source's claim and are not new spawns (R-FAN-23).
    requested = 0 if resume is not None else runplan.requested_spawns(launch)
    if requested:
        yield OpenSession(session_id=launch.session_id, configured_limit=launch.spawns_per_session)
        yield SpawnPreflight(
            session_id=launch.session_id, requested=requested, reservation_id=reservation_id
        )

    handle: SlotHandle | None = None
    capacity = None
    started = recorded = made_dir = False
    run_dir = host.run_dir(run_id)
    try:
        if runplan.capacity_eligible(launch):
            take: Request
            if resume is not None and resume.transfer:
                # R-CAP-18..20: move the source's slot (or acquire when it holds none).
                take = Transfer(
                    session_id=launch.session_id,
                    limit=launch.capacity_limit,
                    source_run_id=resume.source_run_id,
                    run_id=run_id,
                    async_dir=str(host.run_dir(run_id)),
                    transfer_id=uuid.uuid4().hex,  # sent again as Acquire's id is, below
                )
            else:
                take = Acquire(
                    session_id=launch.session_id,
                    limit=launch.capacity_limit,
                    run_id=run_id,
                    kind="workflow" if launch.mode == "workflow" else "runner",  # R-TOP-4
                    async_dir=str(host.run_dir(run_id)),
                    # Sent again (pipelines.py) when a capacity owner dies with it in flight:
                    # the slot it took is answered, not refused as the run's second.
                    acquire_id=uuid.uuid4().hex,
                )
            try:
                try:
                    acquired: AcquireResult = _expect((yield take), AcquireResult)
                except CapacityRunAlreadyHeld:
                    if launch.launch_id is None:
                        raise
                    yield from _free_first_attempt(launch.session_id, run_id)
                    acquired = _expect((yield take), AcquireResult)
            except SubagentsError as err:
                # Its answer lost (a worker's home gone with it in flight): the slot it may
                # have taken is owed back (owedslots.py), not left to its TTL.
                raise owedslots.give_up(host, take, err) from None
            handle, capacity = acquired.handle, acquired.snapshot

        _inject(host, "resolve_budget")
        if resume is not None:
            descriptor = resume.descriptor  # R-RES-4: the same budget, nothing claimed
        else:
            descriptor = yield from _resolve_budget(launch, run_id)
        _inject(host, "claim_paths")
        paths = [] if resume is not None else runplan.static_paths(launch)
        # An empty batch claims nothing but still validates the descriptor (R-FAN-13).
        claim_id = None
        if launch.launch_id is not None and paths and _inherits_budget(launch):
            # Found claimed when sent again (R-FAN-15), also by the next node.
            claim_id = workflowkeys.claim_id(launch.launch_id, descriptor.budget_id)
        elif paths:
            # A budget this admission made is new each attempt, but the claim on it is still
            # sent again when the fan-out owner dies with it in flight (pipelines.py): under
            # an id it counts once.
            claim_id = uuid.uuid4().hex
        fanout: FanoutSnapshot = _expect(
            (yield ClaimPaths(descriptor=descriptor, paths=paths, claim_id=claim_id)),
            FanoutSnapshot,
        )

        _inject(host, "create_run_dir")
        if launch.launch_id is not None:  # its first attempt's, which recorded no run
            shutil.rmtree(run_dir, ignore_errors=True)
        try:
            run_dir.mkdir(parents=True, mode=0o700)
        except OSError as exc:
            raise storage_failed(exc, run_dir) from None
        made_dir = True

        _inject(host, "reserve_spawns")
        if requested:
            yield SpawnReserve(
                session_id=launch.session_id, requested=requested, reservation_id=reservation_id
            )

        snapshots = Snapshots(
            capacity_used=capacity.used if capacity else None,
            capacity_limit=capacity.limit if capacity else None,
            fanout_used=fanout.used,
            fanout_limit=fanout.limit,
            fanout_remaining=fanout.remaining,
            fanout_root=descriptor.root_run_id,
        )
        _inject(host, "record_run")
        source = resume.source_run_id if resume is not None else None
        view = host.record_and_start(
            launch, run_id, runner_id, descriptor, handle, snapshots, source
        )
        recorded = True
        _inject(host, "mark_started")
        if handle is not None:
            mark: Request = (
                MarkWorkflowStarted(handle=handle)  # R-WF-1 step 5
                if launch.mode == "workflow"
                else MarkStarted(handle=handle, runner_id=runner_id, pid=os.getpid())
            )
            # Only once the run's rows are durable: a slot started for a run whose record a
            # full disk undid would be held for good (no run would ever end it).
            _expect((yield Durable(mark)), SlotHandle)
        started = True
        return view
    finally:
        if made_dir and not recorded:  # refused before any record names it: nothing to keep
            remove_run_dir(run_dir)
        if handle is not None and not started:
            try:
                yield Rollback(handle=handle)  # R-ADM-2 / R-ADM-3
            except SubagentsError as err:
                # Not sent (a worker's home unreachable), or its answer lost: owed until the
                # capacity owner answers, so the slot is freed once it can be, not at its TTL.
                # The handle fences it (R-CAP-4, R-CAP-17): a second one changes nothing.
                log.warning(
                    "rollback of run %s's capacity slot failed (%s); owed until answered",
                    run_id,
                    err.message,
                )
                host.owe(Rollback(handle=handle), run_id)


def _free_first_attempt(session_id: str, run_id: str) -> Generator[Request, Message, None]:
    """The slot a launch id's first attempt took under its run's id, left unstarted when its
    node was lost before it recorded the run (no run has that id, and this node admits it
    once: launches.py): rolled back, so the attempt sent again takes one slot, not two. A
    started slot is some run's: the refusal stands."""
    found: Inspection = _expect((yield Inspect(run_id=run_id, session_id=session_id)), Inspection)
    if found.relation != "current" or found.owner is None or found.owner.started:
        raise CapacityRunAlreadyHeld.of(session_id, run_id, found.owner.slot if found.owner else 0)
    yield Rollback(handle=found.owner.handle())


def _resolve_budget(launch: Launch, run_id: str) -> Generator[Request, Message, FanoutDescriptor]:
    """R-FAN-8: the inherited budget extended by this run's short id, else a new budget.
    An attach as chain root always gets a new one, its caller's route or not (R-FAN-10).

    A workflow uses an inherited budget unchanged (R-FAN-9, A-13), and so does a workflow
    child whose host already extended it by `workflow[key]` and claimed it (R-FAN-20).
    """
    if _inherits_budget(launch):
        inherited = _decode_inherited(launch.inherited_fanout or "")
        if launch.mode == "workflow" or launch.fanout_admitted:
            return inherited
        return extend(inherited, runplan.short_id(run_id))
    created = yield CreateBudget(root_run_id=runplan.short_id(run_id), limit=launch.spawns_per_run)
    descriptor: FanoutDescriptor = _expect(created, FanoutDescriptor)
    return descriptor


def _inherits_budget(launch: Launch) -> bool:
    """Whether the launch runs on its caller's budget (else on one its admission creates)."""
    return launch.inherited_fanout is not None and not launch.attached_run_id


def _route_only(launch: Launch, resume: ResumePlan | None) -> str | None:
    """The caller's route of a nested launch whose budget is not that route: a resume's is
    its source's, an attach as chain root's always a new one (R-FAN-10, A-12)."""
    if launch.fanout_admitted or not (resume is not None or launch.attached_run_id):
        return None
    return launch.inherited_fanout


def _caller_path(launch: Launch, resume: ResumePlan | None) -> str:
    """The path a nested resume (`resume[SOURCE]`, an approve's relaunch too) or attach
    (`attach[RUN]`) claims on its caller's route."""
    if resume is not None:
        return f"resume[{runplan.short_id(resume.source_run_id)}]"
    return f"attach[{runplan.short_id(launch.attached_run_id or '')}]"


def _decode_inherited(encoded: str) -> FanoutDescriptor:
    """R-FAN-5: an inherited route that does not decode is refused in the spec's words."""
    try:
        return decode_descriptor(encoded)
    except FanoutDescriptorInvalid as err:
        reason = err.details.get("reason", err.message)
        raise FanoutDescriptorInvalid(
            f"Invalid inherited run fan-out budget: {reason}", reason=reason
        ) from None
