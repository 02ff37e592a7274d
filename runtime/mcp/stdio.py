"""The stdio transport of `subagents-node mcp`: the SDK's `stdio_server` fed from a stdin reader
of our own (frames.py), each frame the SDK cannot read answered, and what ends the server:
the end of its input once every request read is answered, or a signal.

Owns forwarding the transport's messages to the server, keeping count of the requests it has
not settled, and the end of the server. Stdin is read without a worker thread, so a signal
ends the server at once even while nothing arrives. Every request read is answered once. The
end of the input (a file on stdin, or a client that wrote its requests and closed the pipe)
ends the server only once every request read before it is settled (answered, or cancelled by
the client): the SDK alone would cut those calls short, or drop their answers. It waits at
most EOF_GRACE_S: a call still running then (a foreground run) is cancelled as a signal
would, and answered with an error; the caller then exits 0, as for any end of input. Bounded,
because a server whose client is gone must not keep a run going unowned (and a client that
closes stdin to end a server sends SIGTERM soon after anyway). SIGTERM, SIGHUP and SIGINT
cancel the server's calls (a foreground run's call stops its run, see tools.py) and then end
it; the caller exits 128 + the signal, as the CLI does for a foreground run. A call cut short
either way is answered (`Connection closed`), unless the client no longer reads stdout.
A client that no longer reads stdout ends the server at the next answer: its calls are
cancelled as a signal's are, and the caller exits 141 (128 + SIGPIPE).

It must never write to stdout itself (every frame goes through the SDK's writer, so frames
never interleave) nor decide anything about the tools.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import ObjectSendStream
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import (
    CONNECTION_CLOSED,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
)

from subagents_node.mcp.endsignals import EndSignals
from subagents_node.mcp.frames import FdLines, unreadable_answer
from subagents_node.messages.errors import BadRequest

if TYPE_CHECKING:
    # The stream protocols the SDK's own run() takes (no public name exports them): named
    # for the type checker only, so an SDK release that moves them breaks no import.
    from mcp.shared._stream_protocols import ReadStream, WriteStream

#: How long the server goes on after its input ends while requests read before the end are
#: still unanswered. A client that closes stdin to end the server (the MCP stdio shutdown)
#: sends SIGTERM after a few seconds of its own (the Python SDK: 2), so the grace serves
#: scripted input (`mcp < requests.jsonl`, a pipe written then closed): quick calls and short
#: runs are answered; a call still running after it is cancelled as a signal would (a
#: foreground run stopped, the call answered with an error), never left running unowned.
EOF_GRACE_S = 10.0
#: Once the server is ending (its input ended past the grace, or a signal), the longest one
#: answer may wait for the client to read stdout; until then a write waits as long as it must.
SHUTDOWN_WRITE_S = 2.0


class Answers:
    """The server's write stream, counting the requests forwarded to it that are not settled
    yet: a request settles when its answer is handed to the stdout writer, or when the client
    cancels it (the SDK then never answers it)."""

    def __init__(self, write: WriteStream[SessionMessage]) -> None:
        self.write = write
        #: Unsettled requests by id as the client wrote it (one id may be pending twice).
        self.pending: dict[RequestId, int] = {}
        self.idle = anyio.Event()
        self.idle.set()
        #: The longest a write may wait for the client to read, once the server is ending.
        self.write_bound = math.inf
        self.writing: set[anyio.CancelScope] = set()

    def forwarded(self, rid: RequestId) -> None:
        if not self.pending:
            self.idle = anyio.Event()
        self.pending[rid] = self.pending.get(rid, 0) + 1

    def settled(self, rid: RequestId) -> None:
        count = self.pending.pop(rid, 0) - 1
        if count > 0:
            self.pending[rid] = count
        if not self.pending:
            self.idle.set()

    def cancelled(self, rid: RequestId) -> None:
        """The client cancelled `rid`: the SDK correlates "7" with 7, and so does this."""
        key = _correlated(rid)
        for pending in list(self.pending):
            if _correlated(pending) == key:
                self.settled(pending)
                return

    def unanswered(self) -> list[RequestId]:
        return [rid for rid, count in self.pending.items() for _ in range(count)]

    def ending(self) -> None:
        """The server is ending: a write now waits at most SHUTDOWN_WRITE_S for the client."""
        self.write_bound = SHUTDOWN_WRITE_S
        deadline = anyio.current_time() + SHUTDOWN_WRITE_S
        for scope in self.writing:
            scope.deadline = min(scope.deadline, deadline)

    async def send(self, item: SessionMessage, /) -> None:
        # Shielded: a cancel that tore a write would leave the SDK unsure the answer went out,
        # and it then answers neither way; a write is given up only once the server is
        # ending and the client has not read for SHUTDOWN_WRITE_S (it then never went out).
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + self.write_bound
            self.writing.add(scope)
            try:
                await self.write.send(item)
            finally:
                self.writing.discard(scope)
        if scope.cancelled_caught:
            raise anyio.BrokenResourceError
        message = item.message
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            self.settled(message.id)

    async def aclose(self) -> None:
        """Nothing: serve_stdio closes the transport's stream once the server ended and every
        request it left unanswered was answered."""

    async def __aenter__(self) -> Answers:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def forward_requests(
    source: ReadStream[SessionMessage | Exception],
    sink: ObjectSendStream[SessionMessage | Exception],
    write: WriteStream[SessionMessage],
    answers: Answers,
) -> None:
    """Forward the transport's messages to the server, counting its requests in `answers`;
    answer each unreadable frame instead. Once the input ends, the server's input ends when
    every request is settled, or EOF_GRACE_S later (the server then cancels what is left).
    It owns `source` and `sink` (closed when it ends), as the server owned the transport's."""
    async with source, sink:
        async for item in source:
            if isinstance(item, Exception):
                await write.send(SessionMessage(unreadable_answer(item)))
                continue
            message = item.message
            if isinstance(message, JSONRPCRequest):
                answers.forwarded(message.id)  # before the server has it: it may answer at once
            elif (
                isinstance(message, JSONRPCNotification)
                and message.method == "notifications/cancelled"
                and (rid := _cancelled_id(message.params)) is not None
            ):
                answers.cancelled(rid)
            await sink.send(item)
        with anyio.move_on_after(EOF_GRACE_S):
            await answers.idle.wait()
        if answers.pending:
            answers.ending()


def _correlated(rid: RequestId) -> RequestId:
    """The id as the SDK correlates it: a string holding an integer is that integer."""
    if isinstance(rid, str):
        try:
            return int(rid)
        except ValueError:
            pass
    return rid


def _cancelled_id(params: Any) -> RequestId | None:
    """The `requestId` of a `notifications/cancelled` (None when it holds no valid id)."""
    rid = params.get("requestId") if isinstance(params, dict) else None
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None


async def answer_left(answers: Answers) -> None:
    """Answer each request the ended server left unanswered (its answer was given up while the
    server ended): every request read is answered once, even then."""
    answers.ending()
    for rid in answers.unanswered():
        closed = ErrorData(code=CONNECTION_CLOSED, message="Connection closed")
        try:
            await answers.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=rid, error=closed)))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the client does not read: nothing more can reach it


def check_stdio() -> None:
    """Refuse to serve when stdin or stdout was closed when the process started (`mcp <&-`):
    Python then has no sys.stdin / sys.stdout, and descriptor 0 or 1 may since belong to a
    socket of ours, which the server must never read or write as the MCP channel. The command
    line puts /dev/null in its place first, and says so on the stream (`closed_at_start`,
    cli/main.py `open_standard_streams`)."""
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)):
        if stream is None or getattr(stream, "closed_at_start", False):
            raise BadRequest(
                f"{name} is closed: the MCP server talks over stdin and stdout",
                reason="stdio_closed",
            )


async def serve_stdio(server: MCPServer[Any], signals: EndSignals) -> int | None:
    """Serve `server` on stdin/stdout until the input ends and every request read before its
    end is answered (or EOF_GRACE_S passed: None), or until `signals` has one of END_SIGNALS
    (its number, once every call was cancelled: a foreground run's call stops it)."""
    ended: list[int] = []
    lowlevel = server._lowlevel_server  # the SDK's run_stdio_async, with our reader and filter
    # Only the process's own stdin is read from its descriptor; a stand-in (click's test
    # runner) is left to the SDK, which reads whatever sys.stdin is.
    lines = FdLines(0) if _on_fd(sys.stdin, 0) else None
    try:
        async with stdio_server(stdin=lines) as (read, write):  # type: ignore[arg-type]
            answers = Answers(write)
            try:
                async with anyio.create_task_group() as tg:
                    sink, checked = anyio.create_memory_object_stream[SessionMessage | Exception](0)
                    tg.start_soon(forward_requests, read, sink, write, answers)
                    tg.start_soon(_watch_signals, signals, tg.cancel_scope, ended, answers.ending)
                    options = lowlevel.create_initialization_options()
                    await lowlevel.run(checked, answers, options)
                    tg.cancel_scope.cancel()
                await answer_left(answers)
            finally:
                if lines is not None:  # else the SDK's reader keeps the transport open until EOF
                    lines.close()
                await write.aclose()
    except* BrokenPipeError:
        # The client stopped reading stdout (it closed its end, or died): the SDK's writer
        # failed, and the transport ended with it, cancelling every call (a foreground run's
        # call stops its run). Nothing more can reach the client: the server ends as a Unix
        # tool whose reader went away (141), where the error used to reach stderr as an
        # 80-line traceback and the server exit 1.
        _reader_gone()
        ended[:] = [signal.SIGPIPE]
    return ended[0] if ended else None


def _reader_gone() -> None:
    """Stdout becomes /dev/null: the interpreter's last flush of what the SDK's writer held
    has nothing left to fail on (as the CLI's `reader_gone`)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)


def _on_fd(stream: Any, fd: int) -> bool:
    """Whether `stream` reads descriptor `fd` (the SDK's own test before it claims one)."""
    try:
        return bool(stream.buffer.fileno() == fd)
    except (AttributeError, OSError, ValueError):
        return False


async def _watch_signals(
    signals: EndSignals, scope: anyio.CancelScope, ended: list[int], ending: Callable[[], None]
) -> None:
    ended.append(await signals.first())
    ending()
    scope.cancel()
