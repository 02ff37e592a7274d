"""Relay: the owner links the gateway's own thread uses to carry requests on to the owners.

Owns one OwnerLinks (a DEALER per owner endpoint: the owners' ipc sockets, or on a worker the
home's tcp endpoint with CURVE keys) used only from the gateway's I/O thread. A request that
reached one of the node's sockets for an owner (a tcp peer's, or a worker's local client's) is
sent from that thread and its reply is passed back from that thread, body unparsed: no hand-off
to another thread and no second validation of the result on the way through (the caller
validates it, once; one in another protocol version is passed on as the links' typed error
standing for it). The forwarder thread stays for what does not come from a socket (the
embedded node's in-process client, the node's own requests to the capacity owner).

It never decides anything about a request, except the rule both paths share: a worker fails
requests for its home's owners closed at once while its home link says the home cannot be
reached, or has fenced it (`home_refusal`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from subagents_node.actors.links import OwnerLinks, RawReplyFn, RemoteKeys
from subagents_node.messages.base import Request
from subagents_node.messages.errors import MembershipRefused, OwnerUnavailable, SubagentsError
from subagents_node.node.hostcalls import CARRIED_TIMEOUT_S

#: The home link's state and its reason, as the worker's home link last saw it.
HomeState = Callable[[], tuple[str, str]]


def home_refusal(state: tuple[str, str], request: Request, target: str) -> SubagentsError | None:
    """Why a request for the home's owner `target` is not sent now (None: send it)."""
    link, reason = state
    if link == "fenced":
        return MembershipRefused(f"{request.type} was not sent: {reason}", name="", reason="fenced")
    if link != "joined":
        return OwnerUnavailable(
            f"{target} lives on the home node, which this worker cannot reach now; "
            f"{request.type} was not sent (nothing was applied; retry once it is back)",
            owner=target,
            state="unreachable",
            reason="home_unreachable",
        )
    return None


class Relay:
    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        sender: str,
        endpoint_of: Callable[[str], str],
        targets: frozenset[str],
        remote: frozenset[str] = frozenset(),
        remote_keys: RemoteKeys | None = None,
        remote_timeout_s: float = 5.0,
        home_state: HomeState = lambda: ("joined", ""),
        home: str = "",
    ) -> None:
        self.links = OwnerLinks(
            zctx, sender, endpoint_of, remote_keys=remote_keys, other_host=remote
        )
        #: A worker's home endpoint (its gateway carries a request for another worker there).
        self.home = home
        self._targets = targets | remote
        self._remote = remote
        self._remote_timeout_s = remote_timeout_s
        self._home_state = home_state

    def serves(self, target: str) -> bool:
        return target in self._targets

    def send(
        self,
        request: Request,
        target: str,
        deliver: RawReplyFn,
        body: dict[str, Any] | None = None,
    ) -> None:
        """Send `request` to owner `target` (as `body` when given: the validated body as it
        came); raises its refusal (nothing sent) or Busy."""
        if target in self._remote:
            refusal = home_refusal(self._home_state(), request, target)
            if refusal is not None:
                raise refusal
            self.links.send_raw(request, target, deliver, self._remote_timeout_s, body=body)
        else:
            self.links.send_raw(request, target, deliver, body=body)

    def carry(self, request: Request, host: str, deliver: RawReplyFn) -> None:
        """Send a request for worker `host` to this worker's home, which carries it on (a
        nested child placed on another worker); raises its refusal (nothing sent) or Busy."""
        refusal = home_refusal(self._home_state(), request, f"worker {host}")
        if refusal is not None:
            raise refusal
        self.links.send_raw(request, "", deliver, CARRIED_TIMEOUT_S, host=host, endpoint=self.home)

    def close(self) -> None:
        self.links.close()
