"""OwnerPeerTable: a home's word to its ledger owners on their tcp peers (DESIGN §1, §3).

Owns the latest `owner.peers` table (messages/peers.py) and carrying each new one to every
ledger owner that listens on tcp itself, through the node's forwarder (from any thread, in
order with what follows it); an owner forked later starts with the latest table
(runtime/node/ownerspecs.py asks `current`), so none waits to be told. Before the forwarder
runs a table is only kept. It never builds a table (runtime/node/home.py does, from the
allow-list and the members), never decides who is a peer and never waits for an answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from subagents_node.actors.owner import Outcome
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.peers import OwnerPeers
from subagents_node.node.dispatch import Route

log = logging.getLogger(__name__)


class OwnerPeerTable:
    """The latest table, and where it goes once `carry_to` names the forwarder's route."""

    def __init__(self) -> None:
        # Each replaced whole (one reference): read from any thread without a lock.
        self._table: OwnerPeers | None = None
        self._route: Route | None = None
        self._owners: list[str] = []

    def current(self) -> OwnerPeers | None:
        return self._table

    def carry_to(self, route: Route, owners: Iterable[str]) -> None:
        """From now on a table goes to `owners` (a home's ledger owners with a tcp socket)."""
        self._owners = sorted(owners)
        self._route = route

    def tell(self, table: OwnerPeers) -> None:
        """A home's ledger owners learn who may reach their own tcp sockets (`owner.peers`,
        from any thread: the forwarder carries it, in order with what follows it); an owner
        forked later starts with this table."""
        self._table = table
        route = self._route
        if route is None:
            return
        for name in self._owners:

            def told(outcome: Outcome, name: str = name) -> None:
                if isinstance(outcome, SubagentsError):  # it hears again when it is back
                    log.warning("could not tell %s its tcp peers: %s", name, outcome.message)

            route(table, name, told)
