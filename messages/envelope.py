"""The envelope: the one frame shape every message travels in.

Owns the header fields (protocol version, message id, correlation id, sender, target, type,
and the host a home node carries a request on to) and nothing about bodies. Header checks are
hand-written because they run on every frame; body validation is pydantic's job
(messages.protocol).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1

#: Reply types. Every other type names a request body in messages.protocol.
REPLY = "reply"
ERROR = "error"


def new_message_id() -> str:
    """A random 96-bit id for correlating a reply with its request.

    Uniqueness is all it needs, not secrecy: `random` (no system call per message, which costs
    several microseconds on small VMs) rather than `os.urandom`. Its bytes in hex, not an
    f-string's `024x`: the same 24 characters in a third of the time.
    """
    return random.getrandbits(96).to_bytes(12, "big").hex()


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message: header plus an untyped body (validated separately, once)."""

    type: str
    body: dict[str, Any]
    target: str = ""
    id: str = field(default_factory=new_message_id)
    corr: str | None = None
    sender: str = ""
    #: Multi-host: the worker node a home's local client addresses (its name); "" is the node
    #: the frame reached. Only a home serves it, and only to its ipc clients.
    host: str = ""
    v: int = PROTOCOL_VERSION

    def reply(self, type_: str, body: dict[str, Any], sender: str = "") -> Envelope:
        """The envelope answering this one (correlated by id)."""
        return Envelope(type=type_, body=body, target=self.sender, corr=self.id, sender=sender)
