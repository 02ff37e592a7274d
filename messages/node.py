"""Protocol of the node itself (answered by the gateway) and of fault injection.

Fault-injection requests (`debug.*`) reach an owner actor only when the node was started with
faults enabled (tests); otherwise they are refused with BadRequest and change nothing.
"""

from typing import ClassVar, Literal

from pydantic import Field

from subagents_node.messages.base import Ack, Message, Request, ResultType

NODE = "node"


class Pong(Message):
    node_id: str
    version: str
    pid: int
    uptime_s: float


class Ping(Request):
    type: Literal["node.ping"] = "node.ping"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = Pong
    idempotent: ClassVar[bool] = True  # answers, changes nothing


class QuarantinedRecord(Message):
    """A stored record its owner could not parse: counted as occupied / unavailable for that
    record only (fail closed), listed by `status` and `doctor`, never a crash of its owner."""

    owner: str
    table: str
    key: str
    reason: str


#: What the node says of an owner: serving, being restarted, or past its restart intensity.
OwnerState = Literal["running", "restarting", "failed"]


class ActorStatus(Message):
    name: str
    mailbox: int
    mailbox_limit: int
    restarts: int
    state: OwnerState = "running"
    pid: int | None = None
    #: Why the owner is not running (its last crash), when it is not.
    reason: str = ""
    quarantined: list[QuarantinedRecord] = []


class ContainmentStatus(Message):
    """How the node holds its children's trees: `cgroup` (one cgroup v2 cgroup per child,
    below `path`) or `subreaper` (the shim's reaping alone; `why` says why)."""

    mode: Literal["cgroup", "subreaper"]
    path: str = ""
    why: str = ""

    def describe(self) -> str:
        """`cgroup v2 (PATH)` or `subreaper only (why)`."""
        if self.mode == "cgroup":
            return f"cgroup v2 ({self.path})"
        return f"subreaper only ({self.why})"


class ClusterStatus(Message):
    """A node's part in a multi-host fleet (DESIGN §1): a home, or a worker of a home."""

    role: Literal["home", "worker"]
    #: worker: its member name; home: "home"
    name: str = ""
    #: worker: the home's endpoint; home: its tcp endpoints, comma-separated
    home: str = ""
    #: worker: joined | unreachable | fenced; home: serving
    state: str = ""
    reason: str = ""
    generation: int = 0
    last_heartbeat_ok: float | None = None
    #: home: the server public key workers pass as --home-key
    public_key: str = ""
    #: worker: unreachable because the home refused its key at the handshake (revoked?)
    key_refused: bool = False

    def describe(self) -> str:
        if self.role == "home":
            return f"home on {self.home}; workers pass --home-key {self.public_key}"
        detail = f" ({self.reason[:200]})" if self.reason else ""
        return (
            f"worker {self.name} of {self.home}: {self.state}, generation {self.generation}{detail}"
        )


class TcpListenerStatus(Message):
    """One tcp listener: the node's (`gateway`) or a home's ledger owner's own port (the
    owner's name). Past `budget` connections open at once it sheds: closes them all and
    listens again a second later (docs/operations.md). An owner's figures are as it last
    reported them (on each shed, and at most once a second while its count moves)."""

    name: str
    budget: int
    open: int = 0
    #: How many times it shed since the node (an owner's: since the node) started.
    sheds: int = 0
    #: When it last shed (Unix time); None: never.
    last_shed: float | None = None


class NodeStatusResult(Message):
    node_id: str
    version: str
    pid: int
    uptime_s: float
    state_dir: str
    endpoints: list[str]
    actors: list[ActorStatus]
    containment: ContainmentStatus = ContainmentStatus(mode="subreaper", why="not reported")
    #: None: a single node (neither a home nor a worker)
    cluster: ClusterStatus | None = None
    #: The node's tcp listeners and its owners' (none on a node without tcp).
    tcp: list[TcpListenerStatus] = []


class NodeStatus(Request):
    type: Literal["node.status"] = "node.status"
    target: ClassVar[str] = NODE
    idempotent: ClassVar[bool] = True  # answers, changes nothing
    Result: ClassVar[ResultType] = NodeStatusResult


class Shutdown(Request):
    """Ask the node to stop after replying. Runs are left to the supervisor's stop rules."""

    type: Literal["node.shutdown"] = "node.shutdown"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = Ack


class DebugRaise(Request):
    """Make the target actor raise an unexpected exception (tests supervision)."""

    type: Literal["debug.raise"] = "debug.raise"


class DebugSleep(Request):
    """Keep the target actor busy for `ms` (tests backpressure)."""

    type: Literal["debug.sleep"] = "debug.sleep"
    ms: int = Field(ge=0, le=10_000)


REQUESTS = (Ping, NodeStatus, Shutdown, DebugRaise, DebugSleep)
