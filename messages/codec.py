"""msgpack codec: Envelope <-> bytes, with the frame size cap and header checks.

Decoding never raises anything but a BadRequest subclass, so the gateway can answer any bad
frame with a typed error and carry on.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import msgpack

from subagents_node.messages.domains import MAX_BODY_DEPTH, MAX_WIRE_ITEMS
from subagents_node.messages.envelope import (
    ERROR,
    PROTOCOL_VERSION,
    REPLY,
    Envelope,
    new_message_id,
)
from subagents_node.messages.errors import (
    BadRequest,
    FrameTooLarge,
    MalformedFrame,
    SubagentsError,
    UnsupportedProtocol,
)

MAX_FRAME_BYTES = 1 << 20

_HEADER_STR = ("type", "id", "sender", "target", "host")


def encode(env: Envelope) -> bytes:
    header: dict[str, Any] = {
        "v": env.v,
        "id": env.id,
        "corr": env.corr,
        "sender": env.sender,
        "target": env.target,
        "type": env.type,
        "body": env.body,
    }
    if env.host:  # absent unless set: a single node's frames stay as they were
        header["host"] = env.host
    frame: bytes = msgpack.packb(header, use_bin_type=True)
    return frame


#: The integers msgpack can carry: int64 and uint64.
_WIRE_INTS = range(-(1 << 63), 1 << 64)


def _too_wide(value: Any, path: str = "") -> str | None:
    """The dotted path of the first integer in `value` that msgpack cannot encode."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return path if isinstance(value, int) and value not in _WIRE_INTS else None
    for key, item in items:
        found = _too_wide(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def peek_id(frame: bytes, key: str = "id") -> str | None:
    """Best effort: the message id (or, with `key="corr"`, the id it answers) of a frame that
    failed later checks, to correlate the error."""
    try:
        raw = msgpack.unpackb(
            frame,
            raw=False,
            max_bin_len=0,
            max_ext_len=0,
            max_array_len=MAX_WIRE_ITEMS,
            max_map_len=MAX_WIRE_ITEMS,
        )
    except Exception:
        return None
    if isinstance(raw, dict):
        mid = raw.get(key)
        if isinstance(mid, str) and 0 < len(mid) <= 64:
            return mid
    return None


def in_other_version(
    frame: bytes, refused: UnsupportedProtocol, answerer: str, reader: str, advice: str
) -> Reply | None:
    """A reply frame `decode` refused for its protocol version, as the UnsupportedProtocol its
    request gets (None: the frame answers no request). Its reader raises it at once, naming
    both versions, instead of dropping the frame as garbled and waiting out its timeout.

    The wording names who answered (`answerer`), who reads (`reader`) and what to do."""
    corr = peek_id(frame, "corr")
    if corr is None:
        return None
    return Reply(corr, ERROR, mismatch(refused, answerer, reader, advice).to_wire())


def mismatch(
    refused: UnsupportedProtocol, answerer: str, reader: str, advice: str
) -> UnsupportedProtocol:
    """The UnsupportedProtocol a reader raises for an answer in another protocol version,
    naming both versions (`refused`: the error the frame's check raised)."""
    got = refused.details.get("got")
    spoken = f"protocol version {got!r}" if got is not None else "another protocol version"
    return UnsupportedProtocol(
        f"{answerer} answered in {spoken}; {reader} speaks {PROTOCOL_VERSION}: {advice}",
        got=got,
        supported=PROTOCOL_VERSION,
    )


class Asked(Protocol):
    """What an answer needs of the request it answers: its id and who sent it (an Envelope,
    or the `Inbound` an owner's loop reads)."""

    @property
    def id(self) -> str: ...

    @property
    def sender(self) -> str: ...


def encode_answer(request: Asked, outcome: Any, sender: str) -> bytes:
    """The frame answering `request` with `outcome`: a typed error as `{code, message,
    details}`, else the result model's fields (every owner and the node answer this way).

    The frame `encode(request.reply(...))` makes, header for header, built without the reply
    Envelope in between: every answer of every owner passes here."""
    if isinstance(outcome, SubagentsError):
        type_, body = ERROR, outcome.to_wire()
    elif type(outcome).__pydantic_complete__:
        # `model_dump(mode="python")`, straight to the built serializer (as Message.to_body):
        # its keyword handling is a third of dumping a small result.
        type_, body = REPLY, outcome.__pydantic_serializer__.to_python(outcome)
    else:
        type_, body = REPLY, outcome.model_dump(mode="python")
    header = {
        "v": PROTOCOL_VERSION,
        "id": new_message_id(),
        "corr": request.id,
        "sender": sender,
        "target": request.sender,
        "type": type_,
        "body": body,
    }
    frame: bytes = msgpack.packb(header, use_bin_type=True)
    return frame


def encode_request(env: Envelope, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """A request's frame, refused before it is sent when no owner would accept it: a request
    whose fields are each within their bounds can still add up past the frame limit, and a
    value msgpack cannot carry (an integer beyond 64 bits) is a BadRequest naming its field,
    never msgpack's OverflowError (in a forwarding thread, that would end the thread)."""
    try:
        frame = encode(env)
    except (OverflowError, ValueError, TypeError) as exc:
        raise _unencodable(env.type, env.body, exc) from None
    return _within(env.type, frame, max_bytes)


def request_frame(
    type_: str, body: dict[str, Any], id_: str, sender: str, target: str, host: str
) -> bytes:
    """`encode_request` of the Envelope these fields make (no correlation id), built without
    the Envelope: a client's sync transport sends one per call and needs nothing else of it."""
    header: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "id": id_,
        "corr": None,
        "sender": sender,
        "target": target,
        "type": type_,
        "body": body,
    }
    if host:
        header["host"] = host
    try:
        frame: bytes = msgpack.packb(header, use_bin_type=True)
    except (OverflowError, ValueError, TypeError) as exc:
        raise _unencodable(type_, body, exc) from None
    return _within(type_, frame, MAX_FRAME_BYTES)


def _unencodable(type_: str, body: dict[str, Any], exc: Exception) -> BadRequest:
    if isinstance(exc, OverflowError):
        field = _too_wide(body) or "body"
        return BadRequest(
            f"invalid {type_} request: {field}: an integer outside the 64-bit range the "
            "wire carries",
            reason="schema",
            field=field,
        )
    return BadRequest(f"{type_} holds a value the wire cannot carry ({exc})", reason="unencodable")


def _within(type_: str, frame: bytes, max_bytes: int) -> bytes:
    if len(frame) > max_bytes:
        raise FrameTooLarge(
            f"{type_} would be a frame of {len(frame)} bytes, over the {max_bytes}-byte "
            "limit; send it in smaller parts",
            size=len(frame),
            limit=max_bytes,
        )
    return frame


def decode(frame: bytes, max_bytes: int = MAX_FRAME_BYTES) -> Envelope:
    raw = _checked(frame, max_bytes)
    return Envelope(
        type=raw["type"],
        body=raw.get("body", {}),
        target=raw.get("target", ""),
        id=raw["id"],
        corr=raw.get("corr"),
        sender=raw.get("sender", ""),
        host=raw.get("host", ""),
        v=raw["v"],
    )


class Reply(NamedTuple):
    """What a client reads of a reply frame: the request it answers, its type, its body."""

    corr: str | None
    type: str
    body: dict[str, Any]


class Inbound(NamedTuple):
    """What an owner's loop reads of a request frame: the Envelope's fields, as a named tuple
    (an owner reads one per request; a frozen dataclass costs twice as much to build)."""

    type: str
    body: dict[str, Any]
    target: str
    id: str
    corr: str | None
    sender: str
    host: str


def decode_request(frame: bytes, max_bytes: int = MAX_FRAME_BYTES) -> Inbound:
    """`decode`, checks and errors the same, as an `Inbound`."""
    raw = _checked(frame, max_bytes)
    get = raw.get
    return Inbound(
        raw["type"],
        get("body", {}),
        get("target", ""),
        raw["id"],
        get("corr"),
        get("sender", ""),
        get("host", ""),
    )


def decode_reply(frame: bytes, max_bytes: int = MAX_FRAME_BYTES) -> Reply:
    """`decode`, checks and errors the same, keeping only what a client matches and reads
    (a sync client decodes one per call; an Envelope costs more to build than this)."""
    raw = _checked(frame, max_bytes)
    return Reply(raw.get("corr"), raw["type"], raw.get("body", {}))


def _checked(frame: bytes, max_bytes: int) -> dict[str, Any]:
    """The frame's map, once its size, msgpack, protocol version and header are checked.

    Runs on every frame either side reads, so it is written for speed: msgpack builds plain
    dicts, lists and strs only, so exact type checks say what isinstance would."""
    if len(frame) > max_bytes:
        raise FrameTooLarge(
            f"frame of {len(frame)} bytes exceeds the {max_bytes}-byte limit",
            size=len(frame),
            limit=max_bytes,
        )
    try:
        # The length limits make msgpack refuse a huge container before building it.
        raw: Any = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            max_array_len=MAX_WIRE_ITEMS,
            max_map_len=MAX_WIRE_ITEMS,
        )
    except Exception as exc:
        raise MalformedFrame(f"frame is not valid msgpack: {exc}", reason="msgpack") from None
    if type(raw) is not dict:
        raise MalformedFrame("frame is not a msgpack map", reason="not_a_map")
    get = raw.get
    version = get("v")
    # `type(...) is int`: True and 1.0 compare equal to 1 but are not a protocol version.
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise _unsupported(version)
    for key in _HEADER_STR:
        value = get(key, "")
        if type(value) is not str or len(value) > 256:
            raise MalformedFrame(f"envelope field {key!r} must be a short string", reason=key)
    if not get("type") or not get("id"):
        raise MalformedFrame("envelope needs a non-empty 'type' and 'id'", reason="header")
    corr = get("corr")
    if corr is not None and type(corr) is not str:
        raise MalformedFrame("envelope field 'corr' must be a string or nil", reason="corr")
    body = get("body", {})
    if type(body) is not dict:
        raise MalformedFrame("envelope field 'body' must be a map", reason="body")
    if not _fits(body, MAX_BODY_DEPTH - 1):
        # Before any model sees it: validating (and reporting) a deep value costs time and
        # memory in proportion to its depth times its width.
        raise MalformedFrame(f"body is nested deeper than {MAX_BODY_DEPTH} levels", reason="depth")
    return raw


def _unsupported(version: Any) -> UnsupportedProtocol:
    # Echo a short version only: a 1 MB string `v` must not cost a 2 MB reply.
    shown = repr(version)
    shown = shown if len(shown) <= 40 else shown[:39] + "…"
    got = (
        version
        if isinstance(version, int) or (isinstance(version, str) and len(version) <= 40)
        else None
    )
    return UnsupportedProtocol(
        f"protocol version {shown} is not supported (this node speaks {PROTOCOL_VERSION})",
        got=got,
        supported=PROTOCOL_VERSION,
    )


def _fits(container: Any, levels: int) -> bool:
    """`container` (a dict or a list) holds no container more than `levels` below it: a body
    (level 1) within MAX_BODY_DEPTH levels is `_fits(body, MAX_BODY_DEPTH - 1)`.

    Recursive, but never deeper than `levels` frames: it stops at the first container past
    it. Exact type checks, not isinstance: msgpack builds plain dicts and lists, and this runs
    on every frame (about a microsecond for a typical body)."""
    for value in container.values() if type(container) is dict else container:
        kind = type(value)
        if (kind is dict or kind is list) and (levels == 0 or not _fits(value, levels - 1)):
            return False
    return True
