"""Client API of the capacity owner: `client.capacity` and the `CapacityHandle` it returns.

Owns nothing but the caller's copy of a handle. Every method is one request to the node's
CapacityLedger; refusals arrive as the typed errors of `messages/errors.py`, and invalid
arguments as `BadRequest` before anything is sent (the same check the node's gateway makes).

    h = client.capacity.acquire(session_id="s1", limit=4, run_id="a", kind="runner")
    if h is not None:                        # None: the cap is unlimited, nothing recorded
        with h:                              # R-ADM-3's finally-rule: roll back unless started
            start_the_runner()
            h.mark_started(runner_id="x")
    client.capacity.snapshot("s1", limit=4)  # CapacitySnapshot(used, limit)
    client.capacity.transfer(session_id="s1", limit=4, source_run_id="a", run_id="b")
    client.capacity.report_terminal("s1", "a", "complete", proof=RunnerProof(...))
    client.capacity.inspect("a")             # Inspection(relation, owner, verdict)
    client.capacity.hosts()                  # SlotsByHost: (reserved, started) per host
    client.capacity.holders("s1")            # SessionHolders: every slot, with its host
    client.capacity.release_host("w1", reason="disk died", operator="ana")  # HostReleased
    client.capacity.releases(host="w1")      # OperatorReleases: the audit, newest first

It must never decide capacity itself: the node's ledger is the only owner of slots.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from pydantic import ValidationError

from subagents_node.client.plans import Plan, build, one
from subagents_node.client.slotcalls import SlotCall, performed
from subagents_node.messages.base import Message, Request
from subagents_node.messages.capacity import (
    Acquire,
    AcquireResult,
    CapacitySnapshot,
    Inspect,
    Inspection,
    MarkStarted,
    MarkWorkflowStarted,
    ReportedState,
    ReportTerminal,
    Rollback,
    RollbackResult,
    RunnerProof,
    SlotHandle,
    SlotKind,
    Snapshot,
    Transfer,
    Verdict,
)
from subagents_node.messages.capacity_holders import Holders, SessionSlots
from subagents_node.messages.capacity_hosts import (
    HostReleased,
    HostSlots,
    ListReleases,
    OperatorReleases,
    ReleaseHost,
    SlotsByHost,
)
from subagents_node.messages.errors import BadRequest, SubagentsError

if TYPE_CHECKING:
    from types import TracebackType

    from subagents_node.client.client import Client

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Message)
T = TypeVar("T")

#: At most this many holders a view names (a bound on its memory and time, not a limit).
MAX_HOLDERS = 20_000


# -- the requests, one plan each (shared with the asyncio client, subagents_node.client.aio) --


def mark_started_plan(
    wire: SlotHandle, runner_id: str, pid: int | None, process_start_time: float | None
) -> Plan[SlotHandle]:
    request = build(
        MarkStarted,
        handle=wire,
        runner_id=runner_id,
        pid=pid,
        process_start_time=process_start_time,
    )
    return one(request, SlotHandle)


def mark_workflow_started_plan(wire: SlotHandle) -> Plan[SlotHandle]:
    return one(build(MarkWorkflowStarted, handle=wire), SlotHandle)


def rollback_plan(wire: SlotHandle) -> Plan[RollbackResult]:
    return one(build(Rollback, handle=wire), RollbackResult)


def acquire_call(
    session_id: str,
    limit: int,
    run_id: str,
    kind: SlotKind = "runner",
    async_dir: str = "",
    ttl_s: float | None = None,
    host: str = "",
    acquire_id: str | None = None,
) -> SlotCall:
    fields = {
        "session_id": session_id,
        "limit": limit,
        "run_id": run_id,
        "kind": kind,
        "async_dir": async_dir,
        "ttl_s": ttl_s,
        "host": host,
    }
    return SlotCall(Acquire, fields, acquire_id)


def transfer_call(
    session_id: str,
    limit: int,
    source_run_id: str,
    run_id: str,
    async_dir: str = "",
    ttl_s: float | None = None,
    host: str = "",
    transfer_id: str | None = None,
) -> SlotCall:
    fields = {
        "session_id": session_id,
        "limit": limit,
        "source_run_id": source_run_id,
        "run_id": run_id,
        "async_dir": async_dir,
        "ttl_s": ttl_s,
        "host": host,
    }
    return SlotCall(Transfer, fields, transfer_id)


def snapshot_plan(
    session_id: str, limit: int = 0, timeout: float | None = None
) -> Plan[CapacitySnapshot]:
    """R-CAP-26 (the owner reconciles the pool first); `timeout` None: the client's."""
    request = build(Snapshot, session_id=session_id, limit=limit)
    return one(request, CapacitySnapshot, timeout)


def report_terminal_plan(
    session_id: str,
    run_id: str,
    state: ReportedState,
    generation: int | None = None,
    live_process: bool = False,
    proof: RunnerProof | None = None,
    workflow_children_proven: bool = False,
    reason: str = "",
) -> Plan[Verdict]:
    request = build(
        ReportTerminal,
        session_id=session_id,
        run_id=run_id,
        generation=generation,
        state=state,
        live_process=live_process,
        proof=proof,
        workflow_children_proven=workflow_children_proven,
        reason=reason,
    )
    return one(request, Verdict)


def inspect_plan(run_id: str, session_id: str | None = None) -> Plan[Inspection]:
    return one(build(Inspect, run_id=run_id, session_id=session_id), Inspection)


def release_host_plan(host: str, reason: str, operator: str = "") -> Plan[HostReleased]:
    request = build(ReleaseHost, host=host, reason=reason, operator=operator)
    return one(request, HostReleased)


def hosts_plan(host: str | None = None) -> Plan[SlotsByHost]:
    return one(build(HostSlots, host=host), SlotsByHost)


class SessionHolders(NamedTuple):
    """Every slot of a session pool as the ledger names it (each with its host), in slot
    order; how many could not be read (quarantined, still occupied); whether `bound` cut it."""

    holders: list[Inspection]
    unreadable: int
    cut: bool


def holders_plan(session_id: str, bound: int = MAX_HOLDERS) -> Plan[SessionHolders]:
    """Who holds the session's slots, whichever host each run is on, page by page (one
    request answers at most 1,000 slots), at most `bound`."""
    found: list[Inspection] = []
    unreadable = 0
    after: int | None = None
    while True:
        request = build(Holders, session_id=session_id, after_slot=after)
        page = yield from one(request, SessionSlots)
        found += page.holders
        unreadable += page.unreadable
        if page.next_after is None or len(found) >= bound:
            cut = len(found) > bound or page.next_after is not None
            return SessionHolders(found[:bound], unreadable, cut)
        after = page.next_after


def releases_plan(host: str | None = None, limit: int = 50) -> Plan[OperatorReleases]:
    return one(build(ListReleases, host=host, limit=limit), OperatorReleases)


def as_slot_handle(wire: SlotHandle | dict[str, Any]) -> SlotHandle:
    """The handle, or the one its wire form (a dict) describes; anything else is a BadRequest
    naming what is wrong, never pydantic's ValidationError."""
    if isinstance(wire, SlotHandle):
        return wire
    try:
        return SlotHandle.model_validate(wire)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise BadRequest(
            f"not a capacity handle ({type(wire).__name__}): "
            f"{where + ': ' if where else ''}{first['msg']}"[:200],
            reason="argument",
            field="handle",
        ) from None


class CapacityHandle:
    """A held slot: the ledger's handle plus the client that acts on it.

    The handle names the slot and its fencing identity (token, run id, generation); the ledger
    refuses any operation whose identity is no longer current. After a successful rollback of a
    transfer the handle names the restored source record (R-CAP-16).
    """

    def __init__(
        self, api: CapacityAPI, wire: SlotHandle, snapshot: CapacitySnapshot | None = None
    ) -> None:
        self._api = api
        self._wire = wire
        self.snapshot = snapshot
        self.started = False

    @property
    def wire(self) -> SlotHandle:
        """The handle as it travels (pass it to another process; rebuild with `api.handle`)."""
        return self._wire

    @property
    def session_id(self) -> str:
        return self._wire.session_id

    @property
    def slot(self) -> int:
        return self._wire.slot

    @property
    def token(self) -> str:
        return self._wire.token

    @property
    def run_id(self) -> str:
        return self._wire.run_id

    @property
    def generation(self) -> int:
        return self._wire.generation

    @property
    def kind(self) -> SlotKind:
        return self._wire.kind

    def mark_started(
        self, runner_id: str, pid: int | None = None, process_start_time: float | None = None
    ) -> CapacityHandle:
        """R-CAP-13: record the runner's identity. Raises CapacityOwnershipChanged if stale."""
        plan = mark_started_plan(self._wire, runner_id, pid, process_start_time)
        self.started = True  # the caller's copy first (R-CAP-13): no rollback after this
        self._wire = self._api.perform(plan)
        return self

    def mark_workflow_started(self) -> CapacityHandle:
        """R-CAP-14: the controller of this workflow slot is live."""
        plan = mark_workflow_started_plan(self._wire)
        self.started = True
        self._wire = self._api.perform(plan)
        return self

    def rollback(self) -> bool:
        """R-CAP-15..17: undo an unstarted grant. False after a start, or when not current."""
        if self.started:
            return False
        result = self._api.perform(rollback_plan(self._wire))
        if result.rolled_back and result.handle is not None:
            self._wire = result.handle
        return result.rolled_back

    def __enter__(self) -> CapacityHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """The finally-rule (R-ADM-3, A-15): a slot that did not start does not survive."""
        if self.started:
            return
        try:
            self.rollback()
        except SubagentsError as err:
            # Unreachable or busy node: its TTL frees an unstarted slot anyway, and the caller's
            # own error (if any) must not be masked by this one.
            log.warning("capacity: rollback of run %s failed: %s", self.run_id, err.message)

    def __repr__(self) -> str:
        return (
            f"CapacityHandle(session_id={self.session_id!r}, slot={self.slot}, "
            f"run_id={self.run_id!r}, generation={self.generation}, kind={self.kind!r}, "
            f"started={self.started})"
        )


class CapacityAPI:
    """`client.capacity`: the active async capacity ledger of the connected node (SPEC §4)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def ask(self, request: Request, result: type[R]) -> R:
        """One request to the ledger; its typed result, or its typed error raised."""
        return self._client.ask(request, result)

    def perform(self, plan: Plan[T]) -> T:
        return self._client.perform(plan)

    def acquire(
        self,
        session_id: str,
        limit: int,
        run_id: str,
        kind: SlotKind = "runner",
        async_dir: str = "",
        ttl_s: float | None = None,
        host: str = "",
        acquire_id: str | None = None,
    ) -> CapacityHandle | None:
        """R-CAP-8..12: a handle on the lowest free slot, or None when `limit` is 0.

        `host` names the node the run executes on ("" = the home node). Raises
        CapacityExhausted (with `.snapshot`) when the pool is full. With `acquire_id` (one
        per acquire) the same acquire sent again answers the slot it took; without, the
        client gives it one (client/slotcalls.py): a call that times out is asked again
        under it, and one cut short (Ctrl-C) gives back the slot it took.
        """
        call = acquire_call(session_id, limit, run_id, kind, async_dir, ttl_s, host, acquire_id)
        return self._granted(performed(self.perform, call))

    def transfer(
        self,
        session_id: str,
        limit: int,
        source_run_id: str,
        run_id: str,
        async_dir: str = "",
        ttl_s: float | None = None,
        host: str = "",
        transfer_id: str | None = None,
    ) -> CapacityHandle | None:
        """R-CAP-18..20: move the source's slot to `run_id`, else acquire a fresh one.

        The slot then names `host`, where the resume executes. Raises
        CapacityNotTransferable while the source may still be running. With `transfer_id`
        (one per transfer) the same transfer sent again answers the slot it moved.
        """
        call = transfer_call(
            session_id, limit, source_run_id, run_id, async_dir, ttl_s, host, transfer_id
        )
        return self._granted(performed(self.perform, call))

    def snapshot(self, session_id: str, limit: int = 0) -> CapacitySnapshot:
        """R-CAP-26: `{used, limit}` of the session pool; limit 0 means unlimited."""
        return self.perform(snapshot_plan(session_id, limit))

    def report_terminal(
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
        """Tell the ledger a run ended or paused; a releasable verdict frees its slot."""
        plan = report_terminal_plan(
            session_id,
            run_id,
            state,
            generation,
            live_process,
            proof,
            workflow_children_proven,
            reason,
        )
        return self.perform(plan)

    def inspect(self, run_id: str, session_id: str | None = None) -> Inspection:
        """R-CAP-27: which slot records `run_id`, and whether it could be released now."""
        return self.perform(inspect_plan(run_id, session_id))

    def release_host(self, host: str, reason: str, operator: str = "") -> HostReleased:
        """Free every slot (reserved or started) whose run executes on `host`, in one
        transaction, each with an audit row: the operator declared that node lost. A host
        holding no slot answers count 0. Served on the node's ipc socket only."""
        return self.perform(release_host_plan(host, reason, operator))

    def hosts(self, host: str | None = None) -> SlotsByHost:
        """Slots held per host ("" = the home node): reserved and started; only `host`'s
        when one is named."""
        return self.perform(hosts_plan(host))

    def holders(self, session_id: str, bound: int = MAX_HOLDERS) -> SessionHolders:
        """Every slot of the session's pool, each as `inspect` shows its owner; its record's
        `host` names the node the run executes on ("" = the home node), so on a home this
        names its workers' runs too, from the ledger alone."""
        return self.perform(holders_plan(session_id, bound))

    def releases(self, host: str | None = None, limit: int = 50) -> OperatorReleases:
        """The audit rows of operator releases, newest first (at most `limit`, up to 1000)."""
        return self.perform(releases_plan(host, limit))

    def handle(self, wire: SlotHandle | dict[str, Any]) -> CapacityHandle:
        """A handle rebuilt from its wire form, e.g. one passed in from another process."""
        return CapacityHandle(self, as_slot_handle(wire))

    def _granted(self, result: AcquireResult) -> CapacityHandle | None:
        if result.handle is None:
            return None
        return CapacityHandle(self, result.handle, result.snapshot)
