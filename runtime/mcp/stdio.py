"""The stdio transport of `subagents-node mcp`: the SDK's `stdio_server` fed from a stdin reader
of our own, a frame that is not a JSON-RPC message answered, and the signals that end it.

Owns three things the SDK leaves out. A line that is not JSON gets the JSON-RPC 2.0 answer,
a parse error (-32700, id null), and a JSON value that is not a request an invalid-request
error (-32600; with the request's id when it has one), where the SDK drops both without a
word (a client would wait for an answer forever). A line over MAX_LINE_BYTES is dropped as it
arrives (memory stays bounded whatever comes) and answered with an invalid-request error
naming its size and the limit. Stdin is read without a worker thread, so a signal ends the
server at once even while nothing arrives. SIGTERM, SIGHUP and SIGINT cancel
the server's calls (a foreground run's call stops its run, see tools.py) and then end it; the
caller exits 128 + the signal, as the CLI does for a foreground run.

It must never write to stdout itself (every frame goes through the SDK's writer, so frames
never interleave) nor decide anything about the tools.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ValidationError

from subagents_node.messages.codec import MAX_FRAME_BYTES
from subagents_node.messages.errors import BadRequest

#: What ends the server besides the end of its input: an agent CLI that exits sends TERM (or
#: its terminal closes: HUP); Ctrl-C in a terminal reaches every process of its group.
END_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
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


class FdLines:
    """Newline-delimited frames from a file descriptor, read without a thread: waiting for input
    is a plain await, so cancelling the server never waits for a blocked read. Lines that hold
    only whitespace are not frames and are skipped (as the JSON-RPC framing has nothing there to
    answer); bytes that are not UTF-8 become U+FFFD (the SDK's own choice)."""

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
                    return frame.decode("utf-8", "replace")
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


async def answer_unreadable(
    source: ObjectReceiveStream[SessionMessage | Exception],
    sink: ObjectSendStream[SessionMessage | Exception],
    write: ObjectSendStream[SessionMessage],
) -> None:
    """Forward the transport's messages to the server; answer each unreadable frame instead.
    It owns `source` and `sink` (closed when it ends), as the server owned the transport's."""
    async with source, sink:
        async for item in source:
            if isinstance(item, Exception):
                await write.send(SessionMessage(unreadable_answer(item)))
            else:
                await sink.send(item)


def check_stdio() -> None:
    """Refuse to serve when stdin or stdout was closed when the process started (`mcp <&-`):
    Python then has no sys.stdin / sys.stdout, and descriptor 0 or 1 may since belong to a
    socket of ours, which the server must never read or write as the MCP channel."""
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)):
        if stream is None:
            raise BadRequest(
                f"{name} is closed: the MCP server talks over stdin and stdout",
                reason="stdio_closed",
            )


async def serve_stdio(server: MCPServer[Any]) -> int | None:
    """Serve `server` on stdin/stdout until the input ends (None) or a signal in END_SIGNALS
    arrives (its number, once every call was cancelled: a foreground run's call stops it)."""
    ended: list[int] = []
    lowlevel = server._lowlevel_server  # the SDK's run_stdio_async, with our reader and filter
    # Only the process's own stdin is read from its descriptor; a stand-in (click's test
    # runner) is left to the SDK, which reads whatever sys.stdin is.
    lines = FdLines(0) if _on_fd(sys.stdin, 0) else None
    async with stdio_server(stdin=lines) as (read, write):  # type: ignore[arg-type]
        try:
            async with anyio.create_task_group() as tg:
                sink, checked = anyio.create_memory_object_stream[SessionMessage | Exception](0)
                tg.start_soon(answer_unreadable, read, sink, write)
                tg.start_soon(_watch_signals, tg.cancel_scope, ended)
                options = lowlevel.create_initialization_options()
                await lowlevel.run(checked, write, options)
                tg.cancel_scope.cancel()
        finally:
            if lines is not None:  # else the SDK's reader keeps the transport open until EOF
                lines.close()
    return ended[0] if ended else None


def _on_fd(stream: Any, fd: int) -> bool:
    """Whether `stream` reads descriptor `fd` (the SDK's own test before it claims one)."""
    try:
        return bool(stream.buffer.fileno() == fd)
    except (AttributeError, OSError, ValueError):
        return False


async def _watch_signals(scope: anyio.CancelScope, ended: list[int]) -> None:
    with anyio.open_signal_receiver(*END_SIGNALS) as signals:
        async for signum in signals:
            ended.append(signum)
            scope.cancel()
            return
