"""Protocol of multi-host membership: worker nodes joining a home node (DESIGN §1 "Multi-host").

A worker node joins the home over tcp with its own CURVE key; the key's name on the home's
allow-list is the worker's name, so a worker can speak only for itself. It then heartbeats at
the interval the home gives it, and leaves when it stops cleanly, so that its next start may
join at once (a killed worker's name is free once it has been silent past the timeout). The
home's operator lists the members (`subagents-node nodes`) and forgets a worker that will not
come back (`nodes forget NAME --reason TEXT`), which fences it (its generation grows, so its
late heartbeats and reports change nothing) and releases its capacity slots with an
`operator` proof. Join, heartbeat and leave are served on tcp only (they
name an authenticated principal); forget is served on the home's ipc socket only.
"""

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from subagents_node.messages.base import Ack, Message, Request, ResultType
from subagents_node.messages.domains import Count, Generation, HostName, Timestamp, Token

NODE = "node"
#: The name a home node goes by among its members (`nodes`, `run --on home`, Envelope.host).
HOME_NAME = "home"
#: What an UnsupportedProtocol between a home and a worker (releases of two protocol
#: versions) tells the operator to do.
ONE_PROTOCOL = (
    "upgrade the home and its workers alike "
    '(docs/operations.md, "Upgrading a home and its workers")'
)
#: Why a worker is fenced, in the `cause` detail of its `membership_refused` (`fenced`): the
#: operator forgot it (`nodes forget`: its slots were released, so it stops the runs that held
#: them), or a newer start of it joined since (that start owns its runs: it stops nothing). A
#: home of an older release sends no cause: the worker then stops nothing, as before.
FENCED_FORGOTTEN = "forgotten"
FENCED_SUPERSEDED = "superseded"
#: Types that name the tcp peer that sent them: refused on ipc.
PEER_ONLY_TYPES = ("node.members.join", "node.members.heartbeat", "node.members.leave")

#: A worker's name: the name its key has on the home's allow-list (as `keys allow --name`).
MemberName = HostName
#: What a member is, as the home sees it: heartbeating, silent past the timeout, or forgotten.
MemberState = Literal["up", "unreachable", "lost"]


class Membership(Message):
    """The home's answer to a join or a heartbeat: who the worker is and how often to beat."""

    name: str
    generation: int
    home_node_id: str
    heartbeat_s: float
    timeout_s: float
    #: The tcp port on which each of the home's ledger owners answers (CURVE, the home's key),
    #: on the host the worker joined: a worker sends its admissions straight there.
    owner_ports: dict[str, int] = Field(default_factory=dict)


class MemberJoin(Request):
    """A worker node's start: become (again) the live member `name` with a fresh generation.

    Refused when `name` is not the sender's key name, when a live member of that name is
    another process (`instance`), or when the home is not a home."""

    type: Literal["node.members.join"] = "node.members.join"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = Membership

    name: MemberName
    #: One per worker process: tells a restart of the same worker from a second process.
    instance: Token
    version: Annotated[str, StringConstraints(max_length=64)] = ""


class MemberHeartbeat(Request):
    """A worker is alive; what it runs. Refused (`fenced`) for a generation not the current."""

    type: Literal["node.members.heartbeat"] = "node.members.heartbeat"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = Membership
    idempotent: ClassVar[bool] = True  # a second beat says the same

    name: MemberName
    instance: Token
    generation: Generation
    runs: Count = 0
    children: Count = 0


class MemberLeave(Request):
    """A worker's clean stop: this process beats no more, so a new start of the worker may join
    at once instead of waiting out the heartbeat timeout. The membership stays (its generation
    and its slots: the worker's children outlive its node, and their slots are held until their
    ends are reported); `nodes` shows it `unreachable`. Refused (`fenced`) unless it names the
    current generation and instance: a stale process's leave must not end a newer one's
    liveness."""

    type: Literal["node.members.leave"] = "node.members.leave"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = Ack
    idempotent: ClassVar[bool] = True  # a second leave says the same

    name: MemberName
    instance: Token
    generation: Generation


class MemberView(Message):
    """One node of the fleet, as `subagents-node nodes` shows it."""

    name: str
    role: Literal["home", "worker"]
    state: MemberState
    generation: int = 0
    joined_at: float | None = None
    last_heartbeat: float | None = None
    #: Seconds since the last heartbeat (None: never since the home started).
    silent_s: float | None = None
    runs: int = 0
    children: int = 0
    forgotten_at: float | None = None
    forget_reason: str = ""
    endpoint: str = ""
    #: Capacity slots held by runs on this node (None: the capacity owner did not say).
    slots: int | None = None


class MemberListing(Message):
    home_node_id: str
    heartbeat_s: float
    timeout_s: float
    nodes: list[MemberView]


class MemberList(Request):
    type: Literal["node.members.list"] = "node.members.list"
    target: ClassVar[str] = NODE
    read_only: ClassVar[bool] = True
    Result: ClassVar[ResultType] = MemberListing


class MemberForgotten(Message):
    name: str
    generation: int
    forgotten_at: Timestamp
    slots_released: int
    run_ids: list[str] = Field(default_factory=list)


class MemberForget(Request):
    """The operator's word that worker `name` will not come back: fence it and release its
    capacity slots with an `operator` proof (recorded in the capacity owner's history)."""

    type: Literal["node.members.forget"] = "node.members.forget"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = MemberForgotten
    #: An operator's act on the home: a worker must never forget another.
    local_only: ClassVar[bool] = True

    name: MemberName
    reason: Annotated[str, StringConstraints(min_length=1, max_length=500)]


REQUESTS = (MemberJoin, MemberHeartbeat, MemberLeave, MemberList, MemberForget)
