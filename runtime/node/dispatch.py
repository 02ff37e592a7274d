"""Dispatcher: routes a validated request that reached the node to whoever answers it.

Owns the name -> route table. Requests for the node itself are handed to the node service in
the caller's thread, with the authenticated principal of a tcp peer (None for the node's ipc
and in-process clients), and answered through the reply function (at once, or later for work
that asks an owner); a request for an owner is handed to its route (the forwarder, which
carries it to the owner's process). Mailbox bounds are the owners' own (actors/loop.py).
"""

from __future__ import annotations

from collections.abc import Callable

from subagents_node.actors.outcomes import ReplyFn, answer_once
from subagents_node.messages.base import Request
from subagents_node.messages.errors import BadRequest, UnknownTarget
from subagents_node.messages.node import NODE

Route = Callable[[Request, str, ReplyFn], None]
#: The node's own service: (request, the tcp peer's principal or None, reply).
NodeService = Callable[[Request, "str | None", ReplyFn], None]


class Dispatcher:
    def __init__(self, node_service: NodeService, mailbox_limit: int) -> None:
        self._node_service = node_service
        self.mailbox_limit = mailbox_limit
        self._routes: dict[str, Route] = {}

    def register(self, name: str, route: Route) -> None:
        self._routes[name] = route

    def dispatch(
        self, request: Request, target: str, reply: ReplyFn, principal: str | None = None
    ) -> None:
        """Hand `request` to its owner's route, or raise a typed error (nothing sent)."""
        reply = answer_once(reply, request.type)
        owner = request.target or target
        if request.target and target and target != request.target:
            raise BadRequest(
                f"{request.type} is served by {request.target!r}, not {target!r}",
                reason="wrong_target",
            )
        if owner == NODE:
            self._node_service(request, principal, reply)
            return
        route = self._routes.get(owner)
        if route is None:
            raise UnknownTarget(f"no actor named {owner!r} on this node", target=owner)
        route(request, owner, reply)
