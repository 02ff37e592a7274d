"""The node's own requests (`node.*`): what the node answers itself rather than an owner.

Owns the answers to `node.ping`, `node.status` (the node, its owners, its children's
containment and its place among hosts), the keys requests (`keys.*`, served by the node's
allow-list: runtime/node/curve.py, after which a home tells its ledger owners) and
`node.shutdown` (answered first; the stop is the process owner's, runtime/cli/serve.py), and
hands a home's membership requests to its HomeService (runtime/node/home.py), refused on a node
that is not a home. Functions over a NodeHost, as actors/runs/children.py is over its host.
It never stops the node itself, never touches a socket and never asks an owner.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from subagents_node.actors.outcomes import ReplyFn
from subagents_node.actors.owner import Outcome
from subagents_node.messages.base import Ack, Request
from subagents_node.messages.constants import VERSION
from subagents_node.messages.errors import BadRequest, MembershipRefused
from subagents_node.messages.keys import REQUESTS as KEY_REQUESTS
from subagents_node.messages.keys import KeysList
from subagents_node.messages.members import REQUESTS as MEMBER_REQUESTS
from subagents_node.messages.node import (
    ActorStatus,
    ClusterStatus,
    ContainmentStatus,
    NodeStatus,
    NodeStatusResult,
    Ping,
    Pong,
    Shutdown,
    TcpListenerStatus,
)

if TYPE_CHECKING:  # types only: the node imports this module before it forks its owners, and
    # its gateway and home service load after (runtime/node/node.py)
    from subagents_node.node.curve import CurveGuard
    from subagents_node.node.gateway import Gateway
    from subagents_node.node.home import HomeService
    from subagents_node.node.homelink import HomeLink
    from subagents_node.node.ownersup import OwnerSupervisor


class NodeHost(Protocol):
    """What the node's own requests read of the node (runtime/node/node.py `Node`)."""

    @property
    def node_id(self) -> str: ...

    @property
    def state_dir(self) -> Path: ...

    @property
    def started_at(self) -> float:
        """When the node began to listen (0 before)."""

    @property
    def endpoints(self) -> list[str]: ...

    @property
    def containment(self) -> ContainmentStatus: ...

    @property
    def curve(self) -> CurveGuard | None:
        """The node's allow-list, once it listens."""

    @property
    def home_service(self) -> HomeService | None:
        """A home's membership service; None unless a home."""

    @property
    def home_link(self) -> HomeLink | None:
        """A worker's link to its home; None unless a worker."""

    def owner_statuses(self) -> list[ActorStatus]: ...

    def tcp_listeners(self) -> list[TcpListenerStatus]:
        """The node's tcp listener and its owners' own ports, with what each shed."""

    def request_stop(self) -> None: ...


def serve(host: NodeHost, request: Request, principal: str | None, reply: ReplyFn) -> None:
    """The dispatcher's route for `node`: `principal` is a tcp peer's (None over ipc)."""
    home = host.home_service
    if not isinstance(request, MEMBER_REQUESTS):
        reply(answer(host, request))
    elif home is not None:
        home.serve(request, principal, reply)
    else:
        reply(
            MembershipRefused(
                f"this node is not a home ({request.type}); start one with "
                "`subagents-node start --home --listen tcp://HOST:PORT`",
                name="",
                reason="not_home",
            )
        )


def answer(host: NodeHost, request: Request) -> Outcome:
    uptime = time.time() - host.started_at if host.started_at else 0.0
    if isinstance(request, Ping):
        return Pong(node_id=host.node_id, version=VERSION, pid=os.getpid(), uptime_s=uptime)
    if isinstance(request, NodeStatus):
        return NodeStatusResult(
            node_id=host.node_id,
            version=VERSION,
            pid=os.getpid(),
            uptime_s=uptime,
            state_dir=str(host.state_dir),
            endpoints=host.endpoints,
            actors=host.owner_statuses(),
            containment=host.containment,
            cluster=cluster_status(host),
            tcp=host.tcp_listeners(),
        )
    curve = host.curve
    if isinstance(request, KEY_REQUESTS) and curve is not None:
        outcome = curve.serve(request)
        home = host.home_service
        if home is not None and not isinstance(request, KeysList):
            home.tell_owners()  # the owners' own tcp sockets take the change too
        return outcome
    if isinstance(request, Shutdown):
        # Reply first; the owner of the process (start's main loop) performs the stop.
        host.request_stop()
        return Ack()
    return BadRequest(f"the node does not serve {request.type}", reason="wrong_target")


def cluster_status(host: NodeHost) -> ClusterStatus | None:
    """A worker's link to its home, a home's own, or None for a node alone."""
    link, home, curve = host.home_link, host.home_service, host.curve
    if link is not None:
        return link.status()
    if home is not None and curve is not None:
        return ClusterStatus(
            role="home",
            name="home",
            home=",".join(tcp_endpoints(host.endpoints)),
            state="serving",
            public_key=curve.server.public,
        )
    return None


def tcp_endpoints(endpoints: list[str]) -> list[str]:
    return [e for e in endpoints if e.startswith("tcp://")]


def listeners(gateway: Gateway | None, owners: OwnerSupervisor | None) -> list[TcpListenerStatus]:
    """What `status` shows of the gateway's tcp listener (actors/tcpbudget.py), then of the
    owners' own ports (as they reported them: runtime/node/ownersup.py)."""
    theirs = owners.tcp_status() if owners is not None else []
    budget = gateway.budget if gateway is not None else None
    if budget is None:
        return theirs
    own = TcpListenerStatus(
        name=budget.name,
        budget=budget.limit,
        open=budget.open,
        sheds=budget.sheds,
        last_shed=budget.last_shed,
    )
    return [own, *theirs]
