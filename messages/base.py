"""Base classes for body models: immutable, no unknown fields, one `type` discriminator."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class Message(BaseModel):
    """A body model. Frozen, and unknown fields are errors: a typo must not pass silently."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_body(self) -> dict[str, Any]:
        return self.model_dump(mode="python", exclude={"type"})


class Ack(Message):
    """The result of a request whose only answer is 'done'."""

    ok: bool = True


ResultType = type[Message]
"""Alias: inside request classes the field `type` shadows the builtin in annotations."""


class Request(Message):
    """A request body. Subclasses fix `type` with a Literal and name the owning actor.

    `target` is the actor that owns the state the request touches ('' = any owner actor,
    chosen by the envelope; used only by fault-injection requests). `Result` is the model the
    reply body validates into on the client.
    """

    type: str
    target: ClassVar[str] = ""
    Result: ClassVar[ResultType] = Ack
    #: True for queries that never write: the owner may answer them without taking the
    #: store's write lock (only the owner writes its tables, so plain reads are consistent).
    read_only: ClassVar[bool] = False
