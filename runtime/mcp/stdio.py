"""The stdio transport of `subagents-node mcp`: the SDK's `stdio_server` fed from a stdin reader
of our own (frames.py), a frame that is not a JSON-RPC message answered, and the signals that
end it.

Owns forwarding the transport's messages to the server, each frame the SDK cannot read
answered instead (frames.py says how), and the end of the server. Stdin is read without a
worker thread, so a signal ends the server at once even while nothing arrives. SIGTERM, SIGHUP
and SIGINT cancel the server's calls (a foreground run's call stops its run, see tools.py) and
then end it; the caller exits 128 + the signal, as the CLI does for a foreground run.

It must never write to stdout itself (every frame goes through the SDK's writer, so frames
never interleave) nor decide anything about the tools.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from subagents_node.mcp.frames import FdLines, unreadable_answer
from subagents_node.messages.errors import BadRequest

#: What ends the server besides the end of its input: an agent CLI that exits sends TERM (or
#: its terminal closes: HUP); Ctrl-C in a terminal reaches every process of its group.
END_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


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
