"""The request registry: every request body model, keyed by `type`, validated once at the boundary.

A body is validated by its own model, looked up by `type` (no union validator: each model
builds its validator the first time it is used, so a process pays only for the requests it
is sent). Each actor protocol lives in its own module and lists its request classes in
`REQUESTS`; `FAMILIES` names the modules that define the requests of each type prefix, and a
family's modules are imported the first time a request of it is looked up, so a process loads
only the protocols it speaks (a ledger owner never defines the run supervisor's forty
models). Adding a protocol means adding its module to `FAMILIES`; a test checks the table
against every module's `REQUESTS`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from subagents_node.messages.base import Message, Request, schema_error
from subagents_node.messages.errors import UnknownMessageType
from subagents_node.messages.keys import LOCAL_ONLY_PREFIX

#: A request type's first dotted part -> the modules (in messages/) that define its requests.
FAMILIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "node": ("node", "keys", "members"),
        "debug": ("node",),
        "capacity": ("capacity",),
        "fanout": ("fanout",),
        "session": ("session",),
        "runs": ("supervisor", "retention"),
        "child": ("runs",),
    }
)


@functools.cache  # one entry per FAMILIES prefix at most: request_class checks it first
def _family(prefix: str) -> Mapping[str, type[Request]]:
    """type -> request model of every request whose type starts with `prefix` (imported now)."""
    found: dict[str, type[Request]] = {}
    for module in FAMILIES[prefix]:
        requests = importlib.import_module(f"subagents_node.messages.{module}").REQUESTS
        found.update({str(c.model_fields["type"].default): c for c in requests})
    return MappingProxyType(found)


def request_class(type_: str) -> type[Request] | None:
    """The model of request type `type_`, or None when no protocol defines it."""
    prefix = type_.partition(".")[0]
    # A type off the wire names any prefix: only a known one may reach the cache.
    return _family(prefix).get(type_) if prefix in FAMILIES else None


def request_classes() -> tuple[type[Request], ...]:
    """Every request model of every protocol (imports them all: for tests and docs)."""
    return tuple(c for prefix in FAMILIES for c in _family(prefix).values())


def parse_request(type_: str, body: dict[str, Any]) -> Request:
    """Validate an inbound body into its request model, or raise a typed BadRequest."""
    kind = request_class(type_)
    if kind is None:
        raise UnknownMessageType(f"unknown message type {type_!r}", type=type_)
    try:
        return kind.model_validate({**body, "type": type_})
    except ValidationError as exc:
        raise schema_error(type_, exc) from None


def local_only(type_: str) -> bool:
    """Whether `type_` is served on the node's ipc socket only, never to a tcp peer: the
    allow-list's own requests (`node.keys.*`: a peer must never admit others) and every request
    that is an operator's act (`Request.local_only`, e.g. `capacity.release_host`)."""
    if type_.startswith(LOCAL_ONLY_PREFIX):
        return True
    kind = request_class(type_)
    return kind is not None and kind.local_only


__all__ = [
    "FAMILIES",
    "Message",
    "Request",
    "local_only",
    "parse_request",
    "request_class",
    "request_classes",
]
