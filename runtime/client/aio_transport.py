"""The asyncio transport: one DEALER (zmq.asyncio) per endpoint and a table of waiting calls.

Owns the sockets (one per owner it talks to, straight to the owner's socket beside a state
dir's node.sock, as `ZmqTransport` does; else one to the address, and for a transport `on_host`
a worker's name, every request to the node's socket, which carries it on) and the correlation table
`id -> future`. One reader task per socket receives every reply
and resolves the future filed under the reply's correlation id; a call removes its entry when
it ends for any reason (answered, timed out, cancelled), so a reply that arrives after its
caller gave up finds no entry and is dropped, never handed to a later call. Each request gets a
fresh message id, so a late reply cannot match a new request either. The sockets and readers
belong to one running loop at a time (`_bind_loop`): another running loop is refused, the next
loop after a closed one starts afresh. Every AsyncClient of a process opens its sockets on the
process's one zmq.asyncio context (never terminated here); a forked child gets its own, and
fresh sockets, leaving the parent's untouched. A call's deadline bounds its send too: a send
queue kept full by an owner that stopped reading is a NodeTimeout with nothing sent
(`unsent_error`), never a send that waits until the owner reads again. Closing (`shut`) is done
at once, with no await a cancel could cut short; `aclose` then waits for the reader tasks to
end, and a cancel of the task running it is that task's own, raised (never swallowed). A
transport dropped without `aclose()` is collected while its loop runs (its reader tasks hold
its sockets and table, never the transport), and its sockets are closed and its readers
ended then (`_released`), as a sync client's are.

It must never import the node or the actors (child agents import the client), and never block
the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from pathlib import Path

import zmq
import zmq.asyncio

from subagents_node.client.channel import (
    PEER_CHECK_S,
    PeerFile,
    closed_error,
    dealer_options,
    gone_error,
    outcome_of,
    read_reply,
    unsent_error,
)
from subagents_node.client.curve import curve_client, default_credentials, no_keys
from subagents_node.client.exhaustion import descriptors_needed, exhausted
from subagents_node.client.keys import ClientCredentials
from subagents_node.client.paths import check_endpoint, ipc_path
from subagents_node.client.reachability import UNKNOWN_OUTCOME, check_reachable, timed_out
from subagents_node.client.transport import endpoint_for
from subagents_node.messages.base import Message, Request, resendable
from subagents_node.messages.codec import Reply, encode_request
from subagents_node.messages.envelope import Envelope
from subagents_node.messages.errors import (
    BadAddress,
    BadRequest,
    KeyFileInvalid,
    NodeNotRunning,
    NodeTimeout,
)


class AsyncZmqTransport:
    """Send requests from coroutines of one event loop; many may be outstanding at once."""

    def __init__(
        self,
        address: str,
        sender: str = "",
        host: str = "",
        credentials: ClientCredentials | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.address = check_endpoint(address)
        #: tcp only: explicit keys, else those of `state_dir` (else the default state dir's)
        self._credentials = credentials
        self._state_dir = state_dir
        #: Multi-host: the worker the home node at `address` carries every request on to
        #: (`Envelope.host`; sent to the node's own socket, which does the carrying).
        self.host = host
        self._sender = sender or f"client-{os.getpid()}"
        self._pid = os.getpid()
        #: In a forked child: what the parent left in this object (`_after_fork`).
        self._parents: tuple[object, ...] = ()
        self._socks: dict[str, zmq.asyncio.Socket] = {}
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        #: Write ends of the pipes a wait in a thread of this client's polls (aio_runs.py: the
        #: next node's): closed by `shut`, so that wait ends with the client, not 30 s later.
        self._stops: set[int] = set()
        #: ipc only: each socket's peer file as it was when the socket connected
        self._peers: dict[str, PeerFile] = {}
        self._endpoints: dict[str, str] = {}
        #: The loop the sockets and reader tasks belong to (set by the first call).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._collected = self._on_collection()

    def _on_collection(self) -> weakref.finalize[..., AsyncZmqTransport]:
        """What closes this process's sockets and ends their reader tasks once the transport
        is collected without `aclose()` (`await AsyncClient(address).ping()`, a client
        dropped): each reader task held the transport, so neither was ever collected while
        the loop ran, and every such client kept its sockets (three descriptors) and a task
        for good. The finalizer holds the very dicts (they are emptied, never replaced). Not
        at exit: the loop's own end cancels the tasks and pyzmq closes the sockets."""
        collected = weakref.finalize(self, _released, os.getpid(), self._socks, self._readers)
        collected.atexit = False
        return collected

    def __reduce__(self) -> tuple[type[AsyncZmqTransport], tuple[object, ...]]:
        """The address, host and keys: another process opens sockets of its own."""
        return (
            AsyncZmqTransport,
            (self.address, "", self.host, self._credentials, self._state_dir),
        )

    @property
    def outstanding(self) -> int:
        """Calls waiting for their reply right now (a cancelled call is not one)."""
        return len(self._waiting)

    def _endpoint(self, target: str) -> str:
        # Once per target: path parsing on every request shows in a call's CPU (as the sync
        # transport's endpoint_for cache).
        endpoint = self._endpoints.get(target)
        if endpoint is None:
            direct = endpoint_for(self.address, target) if not self.host else self.address
            endpoint = self._endpoints[target] = direct
        return endpoint

    def on_host(self, host: str) -> AsyncZmqTransport:
        """A transport whose requests the home node at this address carries on to its worker
        `host` (the node's ipc socket only: a home carries nothing for a tcp peer)."""
        return AsyncZmqTransport(
            self.address,
            sender=self._sender,
            host=host,
            credentials=self._credentials,
            state_dir=self._state_dir,
        )

    def _bind_loop(self) -> None:
        """Belong to the running loop. Another loop that is running (on another thread) is
        refused at once: a socket used from two threads at once corrupts it. A loop that is
        closed or idle left its reader tasks pending for good, so its connections are
        dropped and this loop starts afresh."""
        if os.getpid() != self._pid:
            self._after_fork()
        loop = asyncio.get_running_loop()
        bound = self._loop
        if bound is loop:
            return
        if bound is not None and bound.is_running():
            raise BadRequest(
                "this AsyncClient is in use by another event loop that is running (on "
                "another thread); create one AsyncClient per event loop",
                reason="event_loop",
            )
        self._drop_connections(NodeNotRunning("its event loop ended", address=self.address))
        self._loop = loop

    def _after_fork(self) -> None:
        """In a forked child: connections of its own. The parent's sockets belong to a context
        whose I/O threads the child does not have (a request on them waited out its timeout):
        they are kept untouched, never closed or read from the child."""
        self._parents = (self._socks, self._readers, self._waiting, self._loop, self._parents)
        self._socks, self._readers, self._waiting, self._peers = {}, {}, {}, {}
        self._loop = None
        self._collected.detach()  # the parent's sockets are never closed from the child
        self._collected = self._on_collection()
        if self._sender == f"client-{self._pid}":
            self._sender = f"client-{os.getpid()}"
        self._pid = os.getpid()

    def _drop_connections(self, error: NodeNotRunning) -> list[asyncio.Task[None]]:
        """Close every socket, cancel its reader and fail its waiting calls with `error` (all
        of one loop); the reader tasks, whose end may be awaited (on their loop)."""
        # Emptied in place, not replaced: the finalizer (`_on_collection`) holds these dicts.
        readers = list(self._readers.values())
        self._readers.clear()
        for reader in readers:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing to cancel
                reader.cancel()
        with contextlib.suppress(RuntimeError):
            self._fail_waiting(error)
        self._waiting.clear()
        socks = list(self._socks.values())
        self._socks.clear()
        for sock in socks:
            sock.close(linger=0)
        return readers

    def _socket(self, target: str) -> zmq.asyncio.Socket:
        if self._closed:
            raise closed_error(self.address)
        self._bind_loop()
        endpoint = self._endpoint(target)
        sock = self._socks.get(endpoint)
        peer = self._peers.get(endpoint)
        if sock is not None and peer is not None and peer.changed():
            # Its owner restarted (a new socket file) or is gone: a fresh connection, so
            # nothing more is written to one the peer closed (sync transport: the same).
            self._socks.pop(endpoint).close(linger=0)
            reader = self._readers.pop(endpoint, None)
            if reader is not None:
                reader.cancel()
            sock = None
        if sock is None:
            check_reachable(self.address, stale=True)
            check_reachable(endpoint, stale=True)
            # The process's one asyncio context (a new one in a forked child): a context is
            # two I/O threads and five descriptors, so 200 clients each with their own held
            # 400 threads and ran out of descriptors at 1024 with 140.
            with descriptors_needed():
                sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            for option, value in dealer_options(endpoint):
                sock.setsockopt(option, value)
            try:
                if self.address.startswith("tcp://"):  # DESIGN §3: tcp is always CURVE
                    keys = self._credentials or default_credentials(self._state_dir)
                    curve_client(sock, keys)
                sock.connect(endpoint)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                if (typed := exhausted(exc)) is not None:
                    raise typed from exc
                raise BadAddress(
                    f"cannot connect to {self.address}: {exc}", address=self.address
                ) from None
            except KeyFileInvalid as err:
                sock.close(linger=0)
                raise no_keys(self.address, err) from None
            except BaseException:  # anything else: the socket is not left to the collector
                sock.close(linger=0)
                raise
            self._socks[endpoint] = sock
            path = ipc_path(endpoint)
            if path is not None:
                self._peers[endpoint] = PeerFile(str(path))
        reader = self._readers.get(endpoint)
        if reader is None or reader.done():
            reading = _read(sock, self._waiting, self.address)  # holds no `self`: _released
            self._readers[endpoint] = asyncio.get_running_loop().create_task(reading)
        return sock

    async def call(self, request: Request, timeout: float, target: str = "") -> Message:
        """Send `request` and await its outcome. If its owner restarts while it is in flight,
        a resendable one is sent again within the same deadline, any other is a NodeTimeout
        at once (an unknown outcome), as with the sync transport's PendingReply."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            sock = self._socket(target or request.target)
            endpoint = self._endpoint(target or request.target)
            peer = self._peers.get(endpoint)
            sent_to = peer.identity if peer is not None else None
            env = Envelope(
                type=request.type,
                body=request.to_body(),
                target=target or request.target,
                sender=self._sender,
                host=self.host,
            )
            frame = encode_request(env)  # FrameTooLarge, BadRequest before anything is sent
            waiter: asyncio.Future[Reply] = loop.create_future()
            self._waiting[env.id] = waiter
            try:
                if not await self._send(sock, frame, request, deadline, endpoint):
                    continue  # its socket was replaced before it went out: on the fresh one
                reply = await self._reply(waiter, request, deadline, peer, sent_to)
            finally:
                # Answered, timed out or cancelled: nobody waits for this id any more.
                self._waiting.pop(env.id, None)
            if reply is not None:
                return outcome_of(request, reply)
            if not resendable(request):
                raise NodeTimeout(
                    f"the owner serving {request.type} at {endpoint} restarted while the "
                    f"request was in flight; {UNKNOWN_OUTCOME}",
                    address=self.address,
                    reason="owner_restarted",
                )

    async def _send(
        self,
        sock: zmq.asyncio.Socket,
        frame: bytes,
        request: Request,
        deadline: float,
        endpoint: str,
    ) -> bool:
        """Put `frame` on `sock` by `deadline`: True once sent. A full send queue (an owner
        that stopped reading) is waited on until then, and the send is dropped unsent
        (`unsent_error`); so is a send whose caller is cancelled. False when the socket was
        closed under the waiting send (replaced after its owner restarted): nothing went out.
        Raises `closed_error` when that close was this client's."""
        # A future (zmq.asyncio; ensure_future only types it so), done at once unless the
        # queue is full.
        sending = asyncio.ensure_future(sock.send(frame))
        if not sending.done():
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait([sending], timeout=max(0.0, deadline - loop.time()))
            finally:
                we_dropped = not sending.done()
                if we_dropped:  # out of time, or the caller was cancelled: never sent later
                    sending.cancel()
            if we_dropped:
                raise unsent_error(request, self.address, endpoint)
            if sending.cancelled():  # zmq.asyncio cancels a closed socket's pending sends
                if self._closed:
                    raise closed_error(self.address)
                return False
        sending.result()  # a zmq error of the send, raised
        return True

    async def _reply(
        self,
        waiter: asyncio.Future[Reply],
        request: Request,
        deadline: float,
        peer: PeerFile | None,
        sent_to: tuple[int, int, int] | None,
    ) -> Reply | None:
        """The reply, or None once the peer's socket file is not the one it was sent to (raises
        `gone_error` once its node is known dead)."""
        loop = asyncio.get_running_loop()
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise NodeTimeout(timed_out(self.address, request), address=self.address)
            late = peer is not None and remaining > PEER_CHECK_S
            # asyncio.wait, not wait_for: Python 3.11's wait_for returns a result that arrived
            # as its task was cancelled and swallows the cancel (a cancelled `runs.wait` would
            # go on to the run's end); wait never cancels `waiter` when a slice runs out.
            await asyncio.wait([waiter], timeout=PEER_CHECK_S if late else remaining)
            if waiter.done():
                return waiter.result()
            if late and peer is not None and peer.current() != sent_to:
                return None
            if late and peer is not None and peer.gone():  # killed -9: the file stays
                raise gone_error(request, self.address)

    def _fail_waiting(self, error: NodeNotRunning) -> None:
        _fail_waiting(self._waiting, error)

    @property
    def closed(self) -> bool:
        return self._closed

    def ends_with_close(self, stopping: int) -> None:
        """Close descriptor `stopping` when this client closes (at once if it is closed), unless
        `release` takes it back first: both on the loop's thread, so exactly one closes it."""
        self._stops.add(stopping)
        if self._closed:
            self._close_stops()

    def release(self, stopping: int) -> bool:
        """Take `stopping` back: True when it is the caller's to close (not closed yet)."""
        if stopping not in self._stops:
            return False
        self._stops.discard(stopping)
        return True

    def _close_stops(self) -> None:
        stops = list(self._stops)
        self._stops.clear()
        for fd in stops:
            os.close(fd)

    def shut(self) -> list[asyncio.Task[None]]:
        """Close now, with nothing awaited (so no cancel can leave it half done): every later
        call and every call waiting now raise `closed_error`, the sockets are closed and their
        reader tasks cancelled. Returns those tasks, whose end the caller awaits."""
        self._bind_loop()  # from another running loop: refused; after a closed one: dropped
        self._closed = True
        self._close_stops()
        return self._drop_connections(closed_error(self.address))

    async def aclose(self) -> None:
        await readers_ended(self.shut())


async def _read(
    sock: zmq.asyncio.Socket, waiting: dict[str, asyncio.Future[Reply]], address: str
) -> None:
    """File each reply under its correlation id in `waiting`; replies nobody waits for are
    dropped. It holds no transport, so a transport dropped without `aclose()` is collected."""
    while True:
        try:
            frame = await sock.recv()
        except zmq.ZMQError as exc:  # the socket is unusable: fail every waiting call now
            if sock.closed:  # dropped on purpose: the calls waiting now are not its
                return
            why = f"the connection to {address} failed: {exc}"
            _fail_waiting(waiting, NodeNotRunning(why, address=address))
            return
        reply = read_reply(frame)
        if reply is None or reply.corr is None:
            continue
        waiter = waiting.get(reply.corr)
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)


def _fail_waiting(waiting: dict[str, asyncio.Future[Reply]], error: NodeNotRunning) -> None:
    """Every waiting call raises `error`, each an instance of its own (one exception raised in
    many tasks would gather all their tracebacks)."""
    for waiter in waiting.values():
        if not waiter.done():
            waiter.set_exception(NodeNotRunning(error.message, **error.details))
    waiting.clear()


def _released(
    pid: int, socks: dict[str, zmq.asyncio.Socket], readers: dict[str, asyncio.Task[None]]
) -> None:
    """A transport collected without `aclose()`: its reader tasks cancelled and its sockets
    closed, on their loop's thread when that loop runs (a collection may happen on any
    thread; a socket is not thread-safe), else here (its loop is idle or closed). Never in a
    forked child: the parent's sockets are the parent's."""
    if os.getpid() != pid or not (socks or readers):
        return

    def shut() -> None:
        for reader in list(readers.values()):
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing to cancel
                reader.cancel()
        readers.clear()
        for sock in list(socks.values()):
            sock.close(linger=0)
        socks.clear()

    loop = next((reader.get_loop() for reader in readers.values()), None)
    if loop is not None and loop.is_running():
        with contextlib.suppress(RuntimeError):  # it closed meanwhile: closed here, below
            loop.call_soon_threadsafe(shut)
            return
    shut()


async def readers_ended(readers: list[asyncio.Task[None]]) -> None:
    """Until the cancelled reader tasks have ended. `asyncio.wait`, not `await reader` under
    `suppress(CancelledError)`: that swallowed a cancel of the task closing the client too (the
    same exception), and a task cancelled during its `async with` exit went on running."""
    if readers:
        await asyncio.wait(readers)
