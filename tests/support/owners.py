"""Owners on a pykka thread, for unit tests of owner logic only (DESIGN §1 allows an in-memory
path for those): a route that hands a request to such an owner as its `Job`.

A node never does this; its owners are processes (runtime/node/ownersup.py).
"""

from __future__ import annotations

from typing import Any

import pykka

from subagents_node.actors.outcomes import ReplyFn
from subagents_node.actors.owner import Job
from subagents_node.messages.base import Request
from subagents_node.node.dispatch import Route


def thread_route(ref: pykka.ActorRef[Any]) -> Route:
    def route(request: Request, target: str, reply: ReplyFn) -> None:
        ref.tell(Job(request, reply))

    return route
