"""The request union: every request body model, keyed by `type`, validated once at the boundary.

A body is validated by its own model, looked up by `type` (no union validator: each model
builds its validator the first time it is used, so a process pays only for the requests it
is sent). Each actor protocol lives in its own module and lists its request classes in
`REQUESTS`; adding a protocol means adding it to `_PROTOCOLS` below.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from subagents_node.messages import (
    capacity,
    capacity_holders,
    capacity_hosts,
    fanout,
    keys,
    lineage,
    members,
    node,
    pauses,
    peers,
    retention,
    runs,
    session,
    supervisor,
)
from subagents_node.messages.base import Message, Request, schema_error, validated
from subagents_node.messages.errors import UnknownMessageType

_PROTOCOLS: tuple[tuple[type[Request], ...], ...] = (
    node.REQUESTS,
    capacity.REQUESTS,
    capacity_holders.REQUESTS,
    capacity_hosts.REQUESTS,
    fanout.REQUESTS,
    session.REQUESTS,
    supervisor.REQUESTS,
    lineage.REQUESTS,
    pauses.REQUESTS,
    keys.REQUESTS,
    members.REQUESTS,
    peers.REQUESTS,
    retention.REQUESTS,
    runs.REQUESTS,
)

REQUEST_CLASSES: tuple[type[Request], ...] = tuple(c for p in _PROTOCOLS for c in p)
REQUEST_TYPES: frozenset[str] = frozenset(
    str(c.model_fields["type"].default) for c in REQUEST_CLASSES
)

#: type -> its request model; each model builds its validator on first use (`defer_build`), so
#: a process validates only the requests it is sent and pays for no other schema.
REQUEST_BY_TYPE: dict[str, type[Request]] = {
    str(c.model_fields["type"].default): c for c in REQUEST_CLASSES
}


def parse_request(type_: str, body: dict[str, Any]) -> Request:
    """Validate an inbound body into its request model, or raise a typed BadRequest."""
    kind = REQUEST_BY_TYPE.get(type_)
    if kind is None:
        raise UnknownMessageType(f"unknown message type {type_!r}", type=type_)
    try:
        # `validated`: straight to the built validator, once per request an owner reads.
        return validated(kind, {**body, "type": type_})
    except ValidationError as exc:
        raise schema_error(type_, exc) from None


def local_only(type_: str) -> bool:
    """Whether `type_` is served on the node's ipc socket only, never to a tcp peer: the
    allow-list's own requests (`node.keys.*`: a peer must never admit others) and every request
    that is an operator's act (`Request.local_only`, e.g. `capacity.release_host`)."""
    if type_.startswith(keys.LOCAL_ONLY_PREFIX):
        return True
    kind = REQUEST_BY_TYPE.get(type_)
    return kind is not None and kind.local_only


__all__ = [
    "REQUEST_CLASSES",
    "REQUEST_TYPES",
    "Message",
    "Request",
    "local_only",
    "parse_request",
]
