"""Client: the one API the CLI, Python programs and child agents use to talk to a node.

Owns nothing but a transport. Every method is one request; every failure is a typed
`SubagentsError` carrying what the caller needs (snapshots, limits). Ledger APIs hang off the
client as `client.capacity`, `client.fanout` and `client.session`; on a home node,
`client.on(NAME)` reaches one of its workers and `client.hosts` all of them.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING, TypeVar

from subagents_node.client.arguments import (
    credentials_argument,
    request_argument,
    state_dir_argument,
)
from subagents_node.client.exhaustion import descriptors_needed
from subagents_node.client.keys import ClientCredentials
from subagents_node.client.paths import ipc_endpoint, resolve_state_dir
from subagents_node.client.plans import One, Plan, one, perform
from subagents_node.client.transport import Transport, ZmqTransport
from subagents_node.messages.base import Message, Request
from subagents_node.messages.constants import ENV_NODE
from subagents_node.messages.domains import MAX_DURATION_S
from subagents_node.messages.errors import BadRequest
from subagents_node.messages.node import NodeStatus, NodeStatusResult, Ping, Pong, Shutdown

if TYPE_CHECKING:
    from subagents_node.client.capacity import CapacityAPI
    from subagents_node.client.fanout import FanoutAPI
    from subagents_node.client.hosts import Hosts
    from subagents_node.client.runs import RunsAPI
    from subagents_node.client.session import SessionAPI

R = TypeVar("R", bound=Message)
T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0


class Client:
    """A connection to one node: `ask` sends any request; `capacity`, `fanout`, `session` and
    `runs` are the typed APIs of the owners (each loaded on first use, so a command that only
    pings never imports the ledgers' schemas). Thread-safe; a context manager; `close()`
    releases the sockets."""

    def __init__(self, transport: Transport, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.transport = transport
        self.timeout = checked_timeout(timeout)

    @cached_property
    def capacity(self) -> CapacityAPI:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.capacity import CapacityAPI

        return CapacityAPI(self)

    @cached_property
    def fanout(self) -> FanoutAPI:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.fanout import FanoutAPI

        return FanoutAPI(self)

    @cached_property
    def session(self) -> SessionAPI:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.session import SessionAPI

        return SessionAPI(self)

    @cached_property
    def runs(self) -> RunsAPI:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.runs import RunsAPI

        return RunsAPI(self)

    @property
    def address(self) -> str:
        return self.transport.address

    def ask(
        self,
        request: Request,
        result: type[R],
        timeout: float | None = None,
        target: str = "",
    ) -> R:
        """Send one request and return its typed result, or raise its typed error.

        `target` is needed only by requests that leave their owner open (`debug.*`).
        """
        request_argument(request, result)
        wait = self.timeout if timeout is None else checked_timeout(timeout)
        outcome = self.transport.call(request, wait, target)
        return checked(request, outcome, result)

    def perform(self, plan: Plan[T]) -> T:
        """Carry out a plan (subagents_node.client.plans): each of its requests in turn.

        A plan of one request (most of the API) is sent straight away: its Ask holds a request
        and a result class that a plan built, so `ask`'s checks of its caller's arguments have
        nothing to find, and the generator protocol nothing to carry."""
        if type(plan) is One:
            request, result, timeout = plan.ask
            plan.close()
            wait = self.timeout if timeout is None else checked_timeout(timeout)
            outcome = self.transport.call(request, wait)
            return checked(request, outcome, result)  # type: ignore[no-any-return]
        return perform(plan, lambda step: self.ask(step.request, step.result, step.timeout))

    def ping(self, timeout: float | None = None) -> Pong:
        return self.perform(ping_plan(timeout))

    def status(self) -> NodeStatusResult:
        return self.perform(status_plan())

    def shutdown(self) -> None:
        self.perform(shutdown_plan())

    def on(self, host: str) -> Client:
        """A client for host `host` of the home node this client talks to (a worker's name, or
        `home`): the home carries each of its requests to that worker's node and back. Close
        it on its own. Refused by a node that is not a home, and over tcp."""
        on_host = getattr(self.transport, "on_host", None)
        transport = on_host(host) if on_host is not None else ZmqTransport(self.address, host=host)
        return Client(transport, timeout=self.timeout)

    @cached_property
    def hosts(self) -> Hosts:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.hosts import Hosts

        return Hosts(self)

    def close(self) -> None:
        if "hosts" in self.__dict__:
            self.hosts.close()
        self.transport.close()

    def __reduce__(self) -> tuple[type[Client], tuple[Transport, float]]:
        """Pickled (a multiprocessing worker started by spawn or forkserver), a client is its
        transport's address and keys: unpickled, a new connection to the same node."""
        return (Client, (self.transport, self.timeout))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def checked(request: Request, outcome: Message, result: type[R]) -> R:
    """The outcome as the result type the request promised, else a BadRequest (reason reply)."""
    # The exact type first: a model class's isinstance goes through ABCMeta's Python-level
    # hook, once per request answered.
    if type(outcome) is not result and not isinstance(outcome, result):
        raise BadRequest(
            f"{request.type} answered with {type(outcome).__name__}, not {result.__name__}",
            reason="reply",
        )
    return outcome


def checked_timeout(value: float, name: str = "timeout", *, forever: bool = False) -> float:
    """`value` as seconds to wait, else a BadRequest naming the argument before anything is
    sent: a number, 0 or more, at most MAX_DURATION_S (a socket's receive timeout is an int32
    of milliseconds); `forever`, for a wait that follows a run, takes any, inf meaning no
    limit. NaN is refused everywhere: no deadline ever compares with it."""
    bounded = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value >= 0
        and (forever or value <= MAX_DURATION_S)
    )
    if not bounded:
        domain = "0 or more (inf: no limit)" if forever else f"from 0 to {MAX_DURATION_S:g}"
        raise BadRequest(
            f"{name} must be a number of seconds {domain}, not {value!r}",
            reason="argument",
            field=name,
        )
    return float(value)


def ping_plan(timeout: float | None = None) -> Plan[Pong]:
    return one(Ping(), Pong, timeout)


def status_plan() -> Plan[NodeStatusResult]:
    return one(NodeStatus(), NodeStatusResult)


def shutdown_plan() -> Plan[Message]:
    return one(Shutdown(), Message)


def default_address(state_dir: str | os.PathLike[str] | None = None) -> str:
    """The address from $SUBAGENTS_NODE, else the default state dir's ipc socket."""
    if state_dir is None:
        env = os.environ.get(ENV_NODE, "").strip()
        if env:
            return env
    return ipc_endpoint(resolve_state_dir(state_dir))


def connect(
    address: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    credentials: ClientCredentials | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> Client:
    """A client for the node at `address` (else `state_dir`'s node, as `--state-dir` means for
    the CLI; else $SUBAGENTS_NODE, else the default state dir's).

    A tcp address is CURVE-authenticated: `credentials`, else the keys of `state_dir` (else
    $SUBAGENTS_CLIENT_KEY / $SUBAGENTS_SERVER_KEY, else the default state dir's key files).
    """
    timeout = checked_timeout(timeout)  # before a context is opened for nothing
    state_dir = state_dir_argument(state_dir)
    credentials = credentials_argument(credentials)
    transport = ZmqTransport(
        address or default_address(state_dir),
        credentials=credentials,
        state_dir=resolve_state_dir(state_dir) if state_dir else None,
    )
    return Client(transport, timeout=timeout)
