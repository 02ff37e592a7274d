"""Dispatcher: routes a validated request to the actor that owns its state.

Owns the name -> actor table and the mailbox bound. A request for a saturated actor is refused
with `Busy` at once: nothing is queued, so memory stays bounded under any flood. Requests for
the node itself are answered by the node service in the caller's thread.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

import pykka

from subagents_node.actors.outcomes import Outcome, ReplyFn, answer_once
from subagents_node.actors.owner import Job
from subagents_node.messages.base import Request
from subagents_node.messages.errors import BadRequest, Busy, Internal, UnknownTarget
from subagents_node.messages.node import NODE


def mailbox_depth(ref: pykka.ActorRef[Any]) -> int:
    """Messages waiting for the actor (ThreadingActor inboxes are queue.Queue)."""
    inbox = ref.actor_inbox
    return inbox.qsize() if isinstance(inbox, queue.Queue) else 0


class Dispatcher:
    def __init__(self, node_service: Callable[[Request], Outcome], mailbox_limit: int) -> None:
        self._node_service = node_service
        self.mailbox_limit = mailbox_limit
        self._actors: dict[str, pykka.ActorRef[Any]] = {}

    def register(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        self._actors[name] = ref

    def actors(self) -> dict[str, pykka.ActorRef[Any]]:
        return dict(self._actors)

    def dispatch(self, request: Request, target: str, reply: ReplyFn) -> None:
        """Queue `request` for its owner, or raise a typed error (nothing queued)."""
        reply = answer_once(reply, request.type)
        owner = request.target or target
        if request.target and target and target != request.target:
            raise BadRequest(
                f"{request.type} is served by {request.target!r}, not {target!r}",
                reason="wrong_target",
            )
        if owner == NODE:
            reply(self._node_service(request))
            return
        ref = self._actors.get(owner)
        if ref is None:
            raise UnknownTarget(f"no actor named {owner!r} on this node", target=owner)
        depth = mailbox_depth(ref)
        if depth >= self.mailbox_limit:
            raise Busy(
                f"{owner} is saturated ({depth} messages waiting); retry later",
                target=owner,
                mailbox=depth,
                limit=self.mailbox_limit,
            )
        try:
            ref.tell(Job(request, reply))
        except pykka.ActorDeadError:
            # Only when the node is stopping, or an owner could not even reopen its store.
            raise Internal(f"{owner} is not running on this node", actor=owner) from None
