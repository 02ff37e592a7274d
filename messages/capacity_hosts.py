"""Protocol of the capacity owner's per-host views and the operator's release of a lost host
(R-CAP-6; DESIGN §1-2 "Multi-host").

Owns `capacity.release_host` (free every slot of a host an operator declared lost, with an
audit row per slot), `capacity.hosts` (the slots each host holds) and `capacity.releases` (the
audit rows), and their results. Every slot names the host its run executes on ("" = the home
node), so these are the ledger's own reads and writes, asked of no worker. Kept apart from
messages/capacity.py, which owns the slot protocol itself; it must never import anything but
messages/.
"""

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from subagents_node.messages.base import Message, Request, ResultType
from subagents_node.messages.capacity import CAPACITY, MAX_LISTED, SlotHandle, SlotKind
from subagents_node.messages.domains import HostName, HostOrHome, Label, NonEmptyShortText

# -- results -------------------------------------------------------------------------------


class HostReleased(Message):
    """What `release_host` freed: `count` slots in all, the first MAX_LISTED of them named
    (`more` when there were others; the audit rows name every one). `unreadable` counts the
    host's slots that do not parse: quarantined, still occupied, never freed (INV-CAP-7)."""

    host: str
    count: int
    released: list[SlotHandle]
    more: bool = False
    unreadable: int = 0


class HostSlotCount(Message):
    """The slots one host holds: reserved (not started) and started (R-CAP-6)."""

    host: str
    reserved: int
    started: int


class SlotsByHost(Message):
    """Slots held per host, by host name ("" = the home node); `more` when the list was cut."""

    hosts: list[HostSlotCount]
    more: bool = False


class OperatorRelease(Message):
    """One audit row of `capacity_operator_releases`: a slot an operator's release freed."""

    seq: int
    at: float
    host: str
    session_id: str
    slot: int
    run_id: str
    generation: int
    kind: SlotKind
    #: What the slot was when it was freed: `reserved` (never started) or `started`.
    state: Literal["reserved", "started"]
    runner_id: str | None = None
    proof_state: str
    reason: str
    operator: str


class OperatorReleases(Message):
    """Audit rows, newest first."""

    releases: list[OperatorRelease]


# -- requests -------------------------------------------------------------------------------


class ReleaseHost(Request):
    """Free every occupied slot (reserved or started) whose run executes on `host`: the
    operator declared that node lost (DESIGN §1-2). One transaction; one audit row per slot,
    proof state `operator`. A host holding no slot is answered with count 0."""

    type: Literal["capacity.release_host"] = "capacity.release_host"
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = HostReleased
    #: An operator's act on the home node: a tcp peer (a worker) must never free other slots.
    local_only: ClassVar[bool] = True

    host: HostName
    reason: NonEmptyShortText
    #: Who asked (a user name), kept in the audit rows.
    operator: Label = ""


class HostSlots(Request):
    """How many slots each host holds (reserved, started); only `host`'s when one is named
    (then with zeros when it holds none)."""

    type: Literal["capacity.hosts"] = "capacity.hosts"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = SlotsByHost

    host: HostOrHome | None = None


class ListReleases(Request):
    """The audit rows of operator releases, newest first, optionally of one host."""

    type: Literal["capacity.releases"] = "capacity.releases"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = OperatorReleases

    host: HostName | None = None
    limit: Annotated[int, Field(strict=True, ge=1, le=MAX_LISTED)] = 50


REQUESTS: tuple[type[Request], ...] = (ReleaseHost, HostSlots, ListReleases)
