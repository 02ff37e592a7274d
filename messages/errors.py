"""The typed error tree, shared by actors (which raise) and clients (which re-raise).

    SubagentsError                       code            details
    ├── BadRequest                       bad_request     reason, and the field errors if any
    │   ├── MalformedFrame               malformed_frame reason
    │   ├── FrameTooLarge                frame_too_large size, limit
    │   ├── UnsupportedProtocol          unsupported_protocol got, supported
    │   └── UnknownMessageType           unknown_type    type
    ├── UnknownTarget                    unknown_target  target
    ├── Busy                             busy            target, mailbox, limit
    ├── Internal                         internal        actor
    ├── NodeError (client side, never on the wire)
    │   ├── NodeNotRunning               node_not_running address
    │   ├── NodeTimeout                  node_timeout    address, timeout_s
    │   └── BadAddress                   bad_address     address
    └── the ledgers' own errors, defined beside their protocols (messages.capacity, …)

An error crosses the wire as ``{code, message, details}``; ``SubagentsError.from_wire`` finds
the class for a code by walking this tree, so a client re-raises the exact type an actor raised.
"""

from __future__ import annotations

from typing import Any, ClassVar


class SubagentsError(Exception):
    """Base of every error this project raises on purpose."""

    code: ClassVar[str] = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> SubagentsError:
        code = str(body.get("code", "error"))
        message = str(body.get("message", ""))
        details = body.get("details")
        kind = _find(SubagentsError, code) or SubagentsError
        err = kind.__new__(kind)
        SubagentsError.__init__(err, message, **(details if isinstance(details, dict) else {}))
        return err

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.details))


def _rebuild(kind: type[SubagentsError], message: str, details: dict[str, Any]) -> SubagentsError:
    err = kind.__new__(kind)
    SubagentsError.__init__(err, message, **details)
    return err


def _find(root: type[SubagentsError], code: str) -> type[SubagentsError] | None:
    for sub in root.__subclasses__():
        if sub.code == code:
            return sub
        found = _find(sub, code)
        if found is not None:
            return found
    return None


class BadRequest(SubagentsError):
    code = "bad_request"


class MalformedFrame(BadRequest):
    code = "malformed_frame"


class FrameTooLarge(BadRequest):
    code = "frame_too_large"


class UnsupportedProtocol(BadRequest):
    code = "unsupported_protocol"


class UnknownMessageType(BadRequest):
    code = "unknown_type"


class UnknownTarget(SubagentsError):
    code = "unknown_target"


class Busy(SubagentsError):
    """The target's mailbox is full; nothing was queued. Retry later."""

    code = "busy"


class Internal(SubagentsError):
    """An actor failed unexpectedly on this message; it was restarted from the store."""

    code = "internal"


class NodeError(SubagentsError):
    """The node could not be reached; raised by clients, never sent on the wire."""

    code = "node_error"


class NodeNotRunning(NodeError):
    code = "node_not_running"


class NodeTimeout(NodeError):
    code = "node_timeout"


class BadAddress(NodeError):
    code = "bad_address"
