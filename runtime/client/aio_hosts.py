"""AsyncHosts: a home node's runs across every host, for `AsyncClient` (`client.hosts`).

The asyncio twin of `Hosts` (client/hosts.py), with the same methods awaited: what a view
means (the listing's plan, which hosts are asked, what their answers make) is written there
once and used here as it is. What lives here is only what differs for asyncio: the workers are
asked at once (`asyncio.gather`), each within the per-host timeout, so a view costs the slowest
host's answer, not their sum, and never hangs on a lost host.

It never changes anything on any host, never imports the node or the actors, and never blocks
the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from subagents_node.client.aio_transport import readers_ended
from subagents_node.client.hosts import (
    HOST_TIMEOUT_S,
    Answer,
    HostRuns,
    asked_hosts,
    found_run,
    listing_plan,
    runs_parts,
)
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.members import HOME_NAME, MemberListing
from subagents_node.messages.supervisor import RunView

if TYPE_CHECKING:
    from subagents_node.client.aio import AsyncClient

T = TypeVar("T")


class AsyncHosts:
    """The home's views for an `AsyncClient`: the workers are asked concurrently, each within
    the per-host timeout."""

    def __init__(self, client: AsyncClient, timeout_s: float = HOST_TIMEOUT_S) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._clients: dict[str, AsyncClient] = {}

    async def listing(self) -> MemberListing | None:
        """The home's membership listing (None: this node is no home, so it is one host)."""
        return await self._client.perform(listing_plan())

    def on(self, host: str) -> AsyncClient:
        """The client for `host` (this client itself for the home), kept until `aclose`."""
        if host == HOME_NAME:
            return self._client
        found = self._clients.get(host)
        if found is None:
            found = self._clients[host] = self._client.on(host)
            found.timeout = min(self._client.timeout, self._timeout_s)
        return found

    async def _ask_each(
        self, hosts: list[str], ask: Callable[[AsyncClient], Awaitable[T]]
    ) -> dict[str, Answer[T]]:
        """Each host's answer to `ask`, the hosts asked at once; a host's typed error is its
        answer (reported by the view, never raised past it)."""

        async def answer(host: str) -> Answer[T]:
            try:
                return await ask(self.on(host))
            except SubagentsError as err:
                return err

        answers = await asyncio.gather(*(answer(host) for host in hosts))
        return dict(zip(hosts, answers, strict=True))

    async def runs(
        self, session_id: str | None = None, active_only: bool = False, limit: int = 50
    ) -> list[HostRuns]:
        """Each host's runs (the home's first, then each worker's by name), newest first
        within each host; one host when the node is no home."""
        listing = await self.listing()
        if listing is None:
            return [
                HostRuns("", "up", await self._client.runs.list(session_id, active_only, limit))
            ]
        answers = await self._ask_each(
            asked_hosts(listing), lambda client: client.runs.list(session_id, active_only, limit)
        )
        return runs_parts(listing, answers)

    async def find(self, run_id: str) -> tuple[AsyncClient, RunView]:
        """The host a run is on, and the run (exact id or unique prefix over every host; on
        a node that is no home, that node's own). Raises RunNotFound naming the hosts that
        could not be asked."""
        listing = await self.listing()
        if listing is None:
            return self._client, await self._client.runs.show(run_id)
        answers = await self._ask_each(
            asked_hosts(listing), lambda client: client.runs.show(run_id)
        )
        run = found_run(run_id, listing, answers)
        return self.on(run.host), run

    def shut(self) -> list[asyncio.Task[None]]:
        """Close every worker's client now, nothing awaited (`AsyncClient.shut`); their reader
        tasks, whose end the caller awaits."""
        clients, self._clients = self._clients, {}
        return [reader for client in clients.values() for reader in client.shut()]

    async def aclose(self) -> None:
        await readers_ended(self.shut())
