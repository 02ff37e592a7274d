"""Wire schemas and codec for subagents-node.

This package owns the shape of every message that crosses a process boundary: the envelope,
the request/result body models (one module per actor protocol), the typed error tree, and the
msgpack codec. It imports nothing else of ours, so any process (a node, a CLI call, a child
agent) can speak the protocol with only this package.
"""

from messages.codec import MAX_FRAME_BYTES, decode, encode
from messages.envelope import PROTOCOL_VERSION, Envelope
from messages.errors import SubagentsError
from messages.protocol import Request, parse_request

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Envelope",
    "Request",
    "SubagentsError",
    "decode",
    "encode",
    "parse_request",
]
