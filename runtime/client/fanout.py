"""Client API of the fan-out budget owner: `client.fanout` (SPEC §5).

Owns nothing but the shape callers use; every method is one request to the `fanout` owner and
every refusal is a typed error from `subagents_node.messages.fanout`::

    desc = c.fanout.create(root_run_id="r1", limit=64)          # FanoutDescriptor
    snap = c.fanout.claim(desc, ["tasks[0]", "tasks[1]"])       # FanoutSnapshot
    c.fanout.claim(desc, ["tasks[2]"], claim_id=uuid)           # made once, however often sent
    res = c.fanout.reserve(desc, ["chain[3]"], ttl_s=30)        # Reservation
    res.commit()                                                # or res.abort()
    c.fanout.snapshot(desc); c.fanout.validate(desc)
    c.fanout.snapshots([desc, other])                           # [BudgetReading, ...], one trip
    c.fanout.from_env()                                         # $SUBAGENTS_RUN_FANOUT or None

A descriptor may be given as the model or as its encoded string. Requests are built through
the same validation the gateway applies, so a bad argument is the same `BadRequest` in-process
and over the wire.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from subagents_node.client.arguments import listed
from subagents_node.client.plans import Plan, build, one
from subagents_node.client.slotcalls import ReserveCall, performed
from subagents_node.messages.base import Message
from subagents_node.messages.constants import ENV_FANOUT
from subagents_node.messages.errors import FanoutError
from subagents_node.messages.fanout import (
    INHERITED_INVALID,
    MAX_READINGS,
    AbortReservation,
    BudgetReading,
    BudgetReadings,
    ClaimPaths,
    CommitReservation,
    CreateBudget,
    FanoutDescriptor,
    FanoutSnapshot,
    ReadSnapshot,
    ReadSnapshots,
    ReservationGrant,
    ValidateDescriptor,
    decode_descriptor,
)

if TYPE_CHECKING:
    from subagents_node.client.client import Client

R = TypeVar("R", bound=Message)

DescriptorLike = FanoutDescriptor | str


def as_descriptor(descriptor: DescriptorLike) -> FanoutDescriptor:
    """The model itself, or the descriptor an encoded string holds (FanoutDescriptorInvalid)."""
    if type(descriptor) is FanoutDescriptor or isinstance(descriptor, FanoutDescriptor):
        return descriptor  # the exact type first: a model's isinstance is ABCMeta's hook
    return decode_descriptor(descriptor)


# -- the requests, one plan each (shared with the asyncio client, subagents_node.client.aio) --


def create_plan(address: str, root_run_id: str, limit: int) -> Plan[FanoutDescriptor]:
    request = build(CreateBudget, root_run_id=root_run_id, limit=limit)
    descriptor: FanoutDescriptor = yield from one(request, FanoutDescriptor)
    if descriptor.node:
        return descriptor
    return descriptor.model_copy(update={"node": address})


def validate_plan(descriptor: DescriptorLike) -> Plan[FanoutDescriptor]:
    request = build(ValidateDescriptor, descriptor=as_descriptor(descriptor))
    return one(request, FanoutDescriptor)


def path_list(paths: Iterable[str]) -> list[str]:
    """The paths to claim as a list; a single string is refused (BadRequest), never read as
    one path per character (`"tasks[0]"` would claim eight units)."""
    return listed(paths, "paths", "paths")


def claim_plan(
    descriptor: DescriptorLike, paths: Iterable[str], claim_id: str | None = None
) -> Plan[FanoutSnapshot]:
    request = build(
        ClaimPaths, descriptor=as_descriptor(descriptor), paths=path_list(paths), claim_id=claim_id
    )
    return one(request, FanoutSnapshot)


def reserve_call(descriptor: DescriptorLike, paths: Iterable[str], ttl_s: float) -> ReserveCall:
    """A reservation under an id of the client's own (client/slotcalls.py)."""
    fields = {"descriptor": as_descriptor(descriptor), "paths": path_list(paths), "ttl_s": ttl_s}
    return ReserveCall(fields, None)


def commit_plan(reservation_id: str) -> Plan[FanoutSnapshot]:
    return one(build(CommitReservation, reservation_id=reservation_id), FanoutSnapshot)


def abort_plan(reservation_id: str) -> Plan[FanoutSnapshot]:
    return one(build(AbortReservation, reservation_id=reservation_id), FanoutSnapshot)


def snapshot_plan(descriptor: DescriptorLike) -> Plan[FanoutSnapshot]:
    return one(build(ReadSnapshot, descriptor=as_descriptor(descriptor)), FanoutSnapshot)


def snapshots_plan(
    descriptors: Sequence[DescriptorLike], timeout: float | None = None
) -> Plan[list[BudgetReading]]:
    """One reading per descriptor, in order: one request per `MAX_READINGS` of them (each
    waiting `timeout`, None: the client's)."""
    wanted = [as_descriptor(d) for d in listed(descriptors, "descriptors", "descriptors")]
    readings: list[BudgetReading] = []
    for start in range(0, len(wanted), MAX_READINGS):
        batch = build(ReadSnapshots, descriptors=wanted[start : start + MAX_READINGS])
        answer: BudgetReadings = yield from one(batch, BudgetReadings, timeout)
        readings += answer.readings
    return readings


def from_env_plan(environ: Mapping[str, str] | None = None) -> Plan[FanoutDescriptor | None]:
    """The inherited budget in $SUBAGENTS_RUN_FANOUT, validated by its owner; None if unset.

    A value that fails to decode or validate raises its own error type, worded as R-FAN-5:
    `Invalid inherited run fan-out budget: {reason}`.
    """
    value = (os.environ if environ is None else environ).get(ENV_FANOUT, "")
    if not value.strip():
        return None
    try:
        validated: FanoutDescriptor = yield from validate_plan(decode_descriptor(value))
    except FanoutError as err:
        reason = INHERITED_INVALID.format(reason=err.message)
        raise type(err)(reason, **err.details) from None
    return validated


class Reservation:
    """Claims held by the owner until `commit()` (permanent) or `abort()` / `expires_at` (freed).

    As a context manager it commits when the block succeeds and aborts when it raises.
    """

    def __init__(self, api: FanoutAPI, grant: ReservationGrant) -> None:
        self._api = api
        self.grant = grant

    @property
    def reservation_id(self) -> str:
        return self.grant.reservation_id

    @property
    def expires_at(self) -> float:
        return self.grant.expires_at

    @property
    def snapshot(self) -> FanoutSnapshot:
        """The budget right after the reservation was granted."""
        return self.grant.snapshot

    def commit(self) -> FanoutSnapshot:
        return self._api.commit(self.reservation_id)

    def abort(self) -> FanoutSnapshot:
        return self._api.abort(self.reservation_id)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.commit()
            return
        try:
            self.abort()
        except Exception as abort_error:  # the block's own error is the one to report
            if exc is not None:
                exc.add_note(f"aborting reservation {self.reservation_id} failed: {abort_error}")

    def __repr__(self) -> str:
        return f"Reservation({self.reservation_id!r}, claims={self.grant.claims})"


class FanoutAPI:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, root_run_id: str, limit: int) -> FanoutDescriptor:
        """A new, empty budget (R-FAN-2); its descriptor names this node as the owner."""
        return self._client.perform(create_plan(self._client.address, root_run_id, limit))

    def validate(self, descriptor: DescriptorLike) -> FanoutDescriptor:
        """The descriptor checked against its manifest (R-FAN-3)."""
        return self._client.perform(validate_plan(descriptor))

    def claim(
        self, descriptor: DescriptorLike, paths: Iterable[str], claim_id: str | None = None
    ) -> FanoutSnapshot:
        """Claim one unit per path, all or nothing; raises FanoutLimitExceeded (R-FAN-16).
        With `claim_id` (one per batch) the same batch sent again claims nothing more."""
        return self._client.perform(claim_plan(descriptor, paths, claim_id))

    def reserve(
        self, descriptor: DescriptorLike, paths: Iterable[str], ttl_s: float
    ) -> Reservation:
        """Hold claims for at most `ttl_s` seconds until `commit()` or `abort()`. Made under
        an id of the client's own: a reserve that timed out is asked again under it, and one
        cut short (Ctrl-C) is aborted (client/slotcalls.py)."""
        call = reserve_call(descriptor, paths, ttl_s)
        return Reservation(self, performed(self._client.perform, call))

    def commit(self, reservation_id: str) -> FanoutSnapshot:
        return self._client.perform(commit_plan(reservation_id))

    def abort(self, reservation_id: str) -> FanoutSnapshot:
        return self._client.perform(abort_plan(reservation_id))

    def snapshot(self, descriptor: DescriptorLike) -> FanoutSnapshot:
        return self._client.perform(snapshot_plan(descriptor))

    def snapshots(self, descriptors: Sequence[DescriptorLike]) -> list[BudgetReading]:
        """Many budgets in one round trip: each reading is its snapshot, or the refusal
        `snapshot` would have raised for it (`code`, `error`)."""
        return self._client.perform(snapshots_plan(descriptors))

    def from_env(self, environ: Mapping[str, str] | None = None) -> FanoutDescriptor | None:
        """The inherited budget in $SUBAGENTS_RUN_FANOUT, validated by its owner; None if unset
        (R-FAN-5's wording when it is invalid)."""
        return self._client.perform(from_env_plan(environ))
