"""The frames `subagents-node mcp` reads from stdin, and the answer to each the SDK cannot read.

Owns reading stdin's lines (FdLines: without a worker thread, a line over MAX_LINE_BYTES
dropped as it arrives, never held) and the JSON-RPC 2.0 answer to a frame that is no message
the SDK takes, which the SDK itself drops without a word: a parse error (-32700, id null) for a
line that is not JSON; an invalid request (-32600) for a JSON value that is not a message (with
the request's id when it has a valid one), for an over-long line (id null, naming its size and
the limit) and for a request whose id is no string or integer (id null, naming the id: the
SDK's models would read it as a notification). JSON the SDK's reader refuses although RFC 8259
takes it is still read: a lone surrogate escape ("\\ud83d", as JSON.stringify writes half of
a cut emoji) becomes U+FFFD, as bytes that are not UTF-8 do; a request nested deeper than the
SDK reads (MAX_DEPTH) is an invalid request answered with its own id, read without reading the
rest. Those answered here reach the SDK as marker lines no client can forge, which it fails to
read like any bad frame.

It must never write anything itself nor forward a frame anywhere: stdio.py does both.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import BaseModel, ConfigDict, ValidationError

from subagents_node.messages.codec import MAX_FRAME_BYTES

#: Bytes read from stdin at a time.
CHUNK = 1 << 16
#: The longest line (one message, its newline not counted) the server reads. A tool call is
#: passed on to the node in one frame of at most MAX_FRAME_BYTES (a task is at most
#: MAX_TASK_CHARS); 8 times that leaves room for such a call written with every character
#: JSON-escaped (`\u0001` is 6 bytes). A longer line is dropped as it arrives, never held.
MAX_LINE_BYTES = 8 * MAX_FRAME_BYTES
#: What FdLines hands the SDK in place of an over-long line: it starts with a lone surrogate,
#: which no decoded input can hold (bad UTF-8 becomes U+FFFD), so no client can forge it; the
#: SDK fails to read it like any bad frame, and `unreadable_answer` names the size and the limit.
_TOO_LONG = "\ud800subagents-node: over-long line of "
#: What FdLines hands the SDK in place of a request whose id is no string or integer (the SDK
#: would read it as a notification, its models ignoring the id, and answer nothing), followed
#: by the id as JSON, at most MAX_ID_SHOWN characters of it; unforgeable as _TOO_LONG is.
_BAD_ID = "\ud800subagents-node: request id "
MAX_ID_SHOWN = 64
#: What FdLines hands the SDK in place of a request nested deeper than MAX_DEPTH, followed by
#: `[its id, its depth]` as JSON; unforgeable as _TOO_LONG is.
_TOO_DEEP = "\ud800subagents-node: nested too deep: "
#: The deepest JSON the SDK's reader (pydantic's) takes, in levels of arrays and objects.
MAX_DEPTH = 200

#: In JSON text: an escaped backslash (kept; matched, it keeps the escapes after it aligned), a
#: surrogate pair's two escapes (kept), or a lone surrogate's escape (written as U+FFFD's).
_SURROGATE_ESCAPES = re.compile(
    r"(\\\\)|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    r"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)
#: The characters where a JSON value's depth changes, or a string starts.
_STRUCTURE = re.compile(r'["{}\[\]]')
_COLON = re.compile(r"\s*:\s*")


class FdLines:
    """Newline-delimited frames from a file descriptor, read without a thread: waiting for input
    is a plain await, so cancelling the server never waits for a blocked read. Lines that hold
    only whitespace are not frames and are skipped (as the JSON-RPC framing has nothing there to
    answer); bytes that are not UTF-8 become U+FFFD (the SDK's own choice), and so does a lone
    surrogate escape (checked_frame)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pollable = True
        self.buffer = bytearray()
        #: How much of `buffer` is known to hold no newline (each byte is searched once).
        self.scanned = 0
        #: Bytes dropped of the over-long line being read, None while no line is over-long.
        self.dropped: int | None = None
        self.eof = False
        self.waiting: anyio.CancelScope | None = None

    def close(self) -> None:
        """End the lines now, even while a read waits (the SDK's reader task ends with them)."""
        self.eof = True
        self.buffer.clear()
        if self.waiting is not None:
            self.waiting.cancel()

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        while True:
            end = self.buffer.find(b"\n", self.scanned)
            self.scanned = len(self.buffer) if end < 0 else end
            if self.dropped is not None or self.scanned > MAX_LINE_BYTES:
                if end < 0 and not self.eof:  # the rest of an over-long line: counted, dropped
                    self.dropped = (self.dropped or 0) + len(self.buffer)
                    self.buffer.clear()
                    self.scanned = 0
                    await self._fill()
                    continue
                size = (self.dropped or 0) + self.scanned
                self._take(self.scanned + 1)
                self.dropped = None
                return f"{_TOO_LONG}{size}"
            if end < 0 and self.eof:
                if not self.buffer:
                    raise StopAsyncIteration
                end = len(self.buffer)  # a last frame without its newline is still a frame
            if end >= 0:
                frame = self._take(end + 1)
                if frame.strip():
                    return checked_frame(frame.decode("utf-8", "replace"))
                continue
            await self._fill()

    def _take(self, size: int) -> bytes:
        """The first `size` bytes of the buffer, removed from it."""
        frame = bytes(self.buffer[:size])
        del self.buffer[:size]
        self.scanned = 0
        return frame

    async def _fill(self) -> None:
        with anyio.CancelScope() as self.waiting:
            if self.pollable:
                try:
                    await anyio.wait_readable(self.fd)
                except OSError:
                    # A regular file (`mcp < requests.jsonl`) cannot be polled; it never blocks.
                    self.pollable = False
            else:
                await anyio.lowlevel.checkpoint()
        self.waiting = None
        if self.eof:  # closed while it waited
            return
        chunk = os.read(self.fd, CHUNK)
        if chunk:
            self.buffer += chunk
        else:
            self.eof = True


class _Envelope(BaseModel):
    """The two members of a frame that make it a request; pydantic skips the others' values
    without building them, so reading them costs a fraction of the SDK's own validation."""

    model_config = ConfigDict(extra="ignore")

    id: Any = None
    method: Any = None


def checked_frame(frame: str) -> str:
    """`frame` as the SDK is to read it: as it came; with each lone surrogate escape as U+FFFD
    (`\\ufffd`); or a marker when it is a request the SDK would not answer with its id: one
    whose `id` is no string or integer (_BAD_ID: JSON-RPC 2.0 answers it as an invalid request,
    id null), or one nested deeper than MAX_DEPTH (_TOO_DEEP). A message with an id and no
    method is a response: the SDK's to read. A frame that is no JSON object is also left to the
    SDK, which answers it."""
    try:
        envelope = _Envelope.model_validate_json(frame)
    except ValidationError as exc:
        if not any(e["type"] == "json_invalid" for e in exc.errors()):
            return frame
        return _unread_json(frame)
    return _checked_id(envelope.model_fields_set, envelope.id, frame)


def _checked_id(given: set[str], rid: Any, frame: str) -> str:
    """`frame`, or the _BAD_ID marker when it is a request whose `id` is no valid one."""
    if "method" not in given or "id" not in given or _valid_id(rid):
        return frame
    shown = json.dumps(rid)
    if len(shown) > MAX_ID_SHOWN:
        shown = shown[: MAX_ID_SHOWN - 3] + "..."
    return f"{_BAD_ID}{shown}"


def _unread_json(frame: str) -> str:
    """A frame the SDK's reader refused as JSON, checked by Python's, which takes what RFC 8259
    allows and pydantic does not: a lone surrogate escape, and deeper nesting (to its own
    recursion limit). The frame with such escapes as U+FFFD when the SDK can read that; else,
    for a request too deep for it, the _TOO_DEEP marker (its id read from the top level only);
    else the frame, for the SDK to answer (a parse error, id null)."""
    repaired = _SURROGATE_ESCAPES.sub(_replace_lone, frame)
    if repaired != frame:
        try:
            envelope = _Envelope.model_validate_json(repaired)
        except ValidationError:
            pass  # still unread: too deep as well, or no JSON
        else:
            return _checked_id(envelope.model_fields_set, envelope.id, repaired)
    try:
        json.loads(repaired)
    except RecursionError:
        pass  # too deep for Python's reader too; the top level is read below
    except ValueError:
        return frame  # no JSON text
    top = _outline(repaired)  # (an id is answered as the SDK would read it: no lone surrogate)
    if top is None or top[2] <= MAX_DEPTH:
        return frame
    given, rid, depth = top
    if "method" in given and "id" in given and _valid_id(rid):
        return f"{_TOO_DEEP}{json.dumps([rid, depth])}"
    return _checked_id(given, rid, frame)  # no request (the SDK answers), or a bad id


def _valid_id(rid: Any) -> bool:
    return isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool))


def _replace_lone(match: re.Match[str]) -> str:
    return "\\ufffd" if match.group(2) else match.group(0)


def _outline(frame: str) -> tuple[set[str], Any, int] | None:
    """Which of `id` and `method` a JSON object's top level holds, its `id`, and how deep the
    object goes, read in one pass without building any nested value (each string is read by
    json's own scanner, every other character skipped but brackets); None when the frame is no
    object, or its top level cannot be read so."""
    decoder = json.JSONDecoder()
    given: set[str] = set()
    rid: Any = None
    depth = deepest = 0
    start = len(frame) - len(frame.lstrip())
    if not frame.startswith("{", start):
        return None
    pos = start
    try:
        while (found := _STRUCTURE.search(frame, pos)) is not None:
            char, pos = found.group(), found.end()
            if char == '"':
                text, pos = json.decoder.scanstring(frame, pos)  # type: ignore[attr-defined]
                colon = _COLON.match(frame, pos) if depth == 1 else None
                if colon is not None and text in ("id", "method"):
                    given.add(text)
                if colon is not None and text == "id":  # the one value read: where it ends
                    rid, pos = decoder.raw_decode(frame, colon.end())
            elif char in "{[":
                depth += 1
                deepest = max(deepest, depth)
            else:
                depth -= 1
                if depth == 0:
                    break
    except (ValueError, RecursionError):  # no string there, or an id nested too deep itself
        return None
    return given, rid, deepest


def unreadable_answer(exc: Exception) -> JSONRPCError:
    """The JSON-RPC answer to a frame the SDK could not read as a message (`exc`, its error)."""
    if not isinstance(exc, ValidationError):
        return JSONRPCError(
            jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message="Parse error")
        )
    errors = exc.errors(include_url=False)
    line = errors[0].get("input") if len(errors) == 1 else None
    if isinstance(line, str) and line.startswith(_TOO_LONG):
        size = int(line[len(_TOO_LONG) :])
        message = (
            f"Invalid Request: a line of {size:,} bytes is over the {MAX_LINE_BYTES:,}-byte "
            "limit of one message; it was dropped"
        )
        return JSONRPCError(
            jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message=message)
        )
    if isinstance(line, str) and line.startswith(_BAD_ID):
        message = f"Invalid Request: id must be a string or an integer, not {line[len(_BAD_ID) :]}"
        return JSONRPCError(
            jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message=message)
        )
    if isinstance(line, str) and line.startswith(_TOO_DEEP):
        rid, depth = json.loads(line[len(_TOO_DEEP) :])
        message = (
            f"Invalid Request: nested {depth:,} levels deep; the server reads JSON at most "
            f"{MAX_DEPTH} levels deep"
        )
        return JSONRPCError(
            jsonrpc="2.0", id=rid, error=ErrorData(code=INVALID_REQUEST, message=message)
        )
    if any(e["type"] == "json_invalid" for e in errors):
        why = next(e["msg"] for e in errors if e["type"] == "json_invalid")
        return JSONRPCError(
            jsonrpc="2.0",
            id=None,
            error=ErrorData(code=PARSE_ERROR, message=f"Parse error: {why}"),
        )
    top = _top_level(errors)
    if isinstance(top, list):
        message = "Invalid Request: batches are not supported; send one request per line"
    elif not isinstance(top, dict):
        message = "Invalid Request: a message is a JSON object"
    else:
        fields = sorted({".".join(str(p) for p in e["loc"][1:]) for e in errors if e["loc"][1:]})
        message = "Invalid Request: not a JSON-RPC 2.0 message" + (
            f" (check {', '.join(fields)})" if fields else ""
        )
    return JSONRPCError(
        jsonrpc="2.0",
        id=_request_id(top),
        error=ErrorData(code=INVALID_REQUEST, message=message),
    )


def _top_level(errors: list[Any]) -> Any:
    """The frame's JSON value, as far as the union's errors show it: a value that is no object
    fails each member at the top (`loc` of one part); an object lacks a field of some member
    (a request has no `result`), and that `missing` error's input is the object itself."""
    for e in errors:
        if len(e["loc"]) == 1 or (len(e["loc"]) == 2 and e["type"] == "missing"):
            return e["input"]
    return None


def _request_id(top: Any) -> str | int | None:
    """The id to answer with: a request's own id when it is a valid one, else null."""
    if not isinstance(top, dict) or "method" not in top:
        return None  # not a request (a response is never answered with our id guess)
    rid = top.get("id")
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        return None
    return rid
