"""AsyncClient: the `Client` API for asyncio programs (`subagents_node.AsyncClient`).

Owns nothing but its transport (one zmq.asyncio DEALER and its correlation table). Every
method performs the same plan as the sync client's method of the same name
(subagents_node.client.plans), so requests, their validation (a bad argument is `BadRequest`
before anything is sent) and the meaning of their replies are defined once. Calls from one
event loop may run concurrently; a cancelled call leaves nothing behind (its late reply is
dropped, never given to another call). On a home node, `client.on(NAME)` reaches one of its
workers and `client.hosts` all of them, as with `Client`.

    async with subagents_node.AsyncClient(address) as client:
        pong = await client.ping()
        snaps = await asyncio.gather(*(client.fanout.claim(budget, [f"t[{i}]"]) ...))

It must never import the node or the actors, and never block the event loop.
"""

from __future__ import annotations

import asyncio
import os
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from subagents_node.client.aio_transport import AsyncZmqTransport, readers_ended
from subagents_node.client.arguments import (
    credentials_argument,
    request_argument,
    state_dir_argument,
)
from subagents_node.client.client import (
    DEFAULT_TIMEOUT_S,
    checked,
    checked_timeout,
    default_address,
    ping_plan,
    shutdown_plan,
    status_plan,
)
from subagents_node.client.exhaustion import descriptors_needed
from subagents_node.client.keys import ClientCredentials
from subagents_node.client.paths import resolve_state_dir
from subagents_node.client.plans import Ask, Plan, perform_async
from subagents_node.messages.base import Message, Request
from subagents_node.messages.node import NodeStatusResult, Pong

if TYPE_CHECKING:
    from subagents_node.client.aio_capacity import AsyncCapacityAPI
    from subagents_node.client.aio_fanout import AsyncFanoutAPI
    from subagents_node.client.aio_hosts import AsyncHosts
    from subagents_node.client.aio_runs import AsyncRunsAPI
    from subagents_node.client.aio_session import AsyncSessionAPI

R = TypeVar("R", bound=Message)
T = TypeVar("T")


class AsyncClient:
    """A connection to one node for coroutines of one event loop.

    `address`, `credentials` and `state_dir` mean what they mean for `connect()`: the address
    defaults to `state_dir`'s node, else $SUBAGENTS_NODE, else the default state dir's; a tcp
    address offers `credentials`, else `state_dir`'s keys. Nothing connects until the first
    call. Use it as `async with`, or `await client.aclose()`.
    """

    def __init__(
        self,
        address: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        credentials: ClientCredentials | None = None,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.timeout = checked_timeout(timeout)
        state_dir = state_dir_argument(state_dir)
        credentials = credentials_argument(credentials)
        self.transport = AsyncZmqTransport(
            address or default_address(state_dir),
            credentials=credentials,
            state_dir=resolve_state_dir(state_dir) if state_dir else None,
        )

    @cached_property
    def capacity(self) -> AsyncCapacityAPI:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.aio_capacity import AsyncCapacityAPI

        return AsyncCapacityAPI(self)

    @cached_property
    def fanout(self) -> AsyncFanoutAPI:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.aio_fanout import AsyncFanoutAPI

        return AsyncFanoutAPI(self)

    @cached_property
    def session(self) -> AsyncSessionAPI:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.aio_session import AsyncSessionAPI

        return AsyncSessionAPI(self)

    @cached_property
    def runs(self) -> AsyncRunsAPI:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.aio_runs import AsyncRunsAPI

        return AsyncRunsAPI(self)

    @property
    def address(self) -> str:
        return self.transport.address

    async def ask(
        self,
        request: Request,
        result: type[R],
        timeout: float | None = None,
        target: str = "",
    ) -> R:
        """Send one request and return its typed result, or raise its typed error."""
        request_argument(request, result)
        wait = self.timeout if timeout is None else checked_timeout(timeout)
        return checked(request, await self.transport.call(request, wait, target), result)

    async def perform(self, plan: Plan[T]) -> T:
        """Carry out a plan: each of its requests in turn, awaited."""

        def step(ask: Ask[Any]) -> Any:
            return self.ask(ask.request, ask.result, ask.timeout)

        return await perform_async(plan, step)

    async def ping(self, timeout: float | None = None) -> Pong:
        return await self.perform(ping_plan(timeout))

    async def status(self) -> NodeStatusResult:
        return await self.perform(status_plan())

    async def shutdown(self) -> None:
        await self.perform(shutdown_plan())

    def on(self, host: str) -> AsyncClient:
        """A client for host `host` of the home node this client talks to (a worker's name, or
        `home`): the home carries each of its requests to that worker's node and back. Close
        it on its own. Refused by a node that is not a home, and over tcp (as `Client.on`)."""
        return AsyncClient._over(self.transport.on_host(host), self.timeout)

    @classmethod
    def _over(cls, transport: AsyncZmqTransport, timeout: float) -> AsyncClient:
        client = cls.__new__(cls)
        client.transport = transport
        client.timeout = timeout
        return client

    def __reduce__(self) -> tuple[Any, tuple[AsyncZmqTransport, float]]:
        """Pickled, its transport's address and keys: unpickled, a client of the same node."""
        return (AsyncClient._over, (self.transport, self.timeout))

    @cached_property
    def hosts(self) -> AsyncHosts:
        with descriptors_needed():  # a first use opens its module's file
            from subagents_node.client.aio_hosts import AsyncHosts

        return AsyncHosts(self)

    def shut(self) -> list[asyncio.Task[None]]:
        """Close this client and the workers' clients of its `hosts` now, with nothing awaited
        (no cancel can leave one open); their reader tasks, whose end `aclose` awaits."""
        readers = self.transport.shut()
        if "hosts" in self.__dict__:
            readers += self.hosts.shut()
        return readers

    async def aclose(self) -> None:
        """Close the client. Cancelled while it waits for its reader tasks to end, everything
        is closed all the same and the cancel is raised: a cancel always cancels."""
        await readers_ended(self.shut())

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
