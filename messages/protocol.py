"""The request union: every request body model, keyed by `type`, validated once at the boundary.

The TypeAdapter is built once at import. Each actor protocol lives in its own module and lists
its request classes in `REQUESTS`; adding a protocol means adding it to `_PROTOCOLS` below.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter, ValidationError

from subagents_node.messages import (
    capacity,
    fanout,
    keys,
    node,
    retention,
    runs,
    session,
    supervisor,
)
from subagents_node.messages.base import Message, Request, schema_error
from subagents_node.messages.errors import UnknownMessageType

_PROTOCOLS: tuple[tuple[type[Request], ...], ...] = (
    node.REQUESTS,
    capacity.REQUESTS,
    fanout.REQUESTS,
    session.REQUESTS,
    supervisor.REQUESTS,
    keys.REQUESTS,
    retention.REQUESTS,
    runs.REQUESTS,
)

REQUEST_CLASSES: tuple[type[Request], ...] = tuple(c for p in _PROTOCOLS for c in p)
REQUEST_TYPES: frozenset[str] = frozenset(
    str(c.model_fields["type"].default) for c in REQUEST_CLASSES
)

_ADAPTER: TypeAdapter[Request] = TypeAdapter(
    Annotated[Union[REQUEST_CLASSES], Field(discriminator="type")]  # type: ignore[arg-type]  # noqa: UP007
)


def parse_request(type_: str, body: dict[str, Any]) -> Request:
    """Validate an inbound body into its request model, or raise a typed BadRequest."""
    if type_ not in REQUEST_TYPES:
        raise UnknownMessageType(f"unknown message type {type_!r}", type=type_)
    try:
        return _ADAPTER.validate_python({**body, "type": type_})
    except ValidationError as exc:
        raise schema_error(type_, exc) from None


__all__ = ["REQUEST_CLASSES", "REQUEST_TYPES", "Message", "Request", "parse_request"]
