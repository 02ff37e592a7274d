"""The transport seam: send a request, get its result or its typed error.

- `ZmqTransport` (here) speaks msgpack envelopes over DEALER sockets to ROUTERs. Given the
  node's ipc socket in a state dir, it sends each request straight to the owner process that
  serves it (the address book's ipc endpoints sit beside the node's socket: `runs.sock`,
  `capacity.sock`, ...; DESIGN §1), and only node.* requests to the node; given any other
  address (tcp, or an ipc path elsewhere) it sends everything there and the node forwards.
  Each calling thread gets its own DEALER per endpoint (sockets are not thread-safe), so many
  threads can call at once with no extra hop; a thread may have many requests outstanding.
  Replies are matched by correlation id and stale replies (for requests that timed out) are
  dropped. ZeroMQ reconnects by itself after a node restart. Over ipc each channel knows the
  socket file it connected to (`PeerFile`): when an owner restarts (a new file), the next
  request goes out on a fresh connection, and one in flight is noticed a second late
  (`PEER_CHECK_S`): a resendable one (read-only or idempotent) is sent again, any other is a
  NodeTimeout at once with reason `owner_restarted` (its outcome is unknown). Over tcp a
  request in flight across a restart times out. A tcp address is always CURVE (DESIGN §3):
  the transport offers its client keypair and expects the server's public key
  (`client/keys.py`: explicit credentials, else `$SUBAGENTS_CLIENT_KEY` /
  `$SUBAGENTS_SERVER_KEY`, else the state dir's key files), and
  watches its socket's handshake events, so a node that refuses the key is reported as
  `NotAuthenticated` at once instead of a silent timeout (a refused peer gets no reply).
- `InProcessTransport` (subagents_node.node.inprocess) hands the request model to a node in the
  same process: no encoding, used by the embedded node and the fast unit tests.

It must never import the node or the actors: every child agent imports this module.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import zmq

from subagents_node.client.curve import (
    HANDSHAKE_REFUSED,
    curve_client,
    default_credentials,
    no_keys,
)
from subagents_node.client.keys import ClientCredentials
from subagents_node.client.paths import OWNER_SOCKETS, SOCKET_NAME, check_endpoint, ipc_path
from subagents_node.client.reachability import check_reachable, why_silent
from subagents_node.messages.base import Message, Request, parse_result, resendable
from subagents_node.messages.codec import decode, encode_request
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import (
    BadAddress,
    KeyFileInvalid,
    NodeNotRunning,
    NodeTimeout,
    NotAuthenticated,
    SubagentsError,
)

#: Replies may be larger than requests (status listings); the node caps what it sends.
MAX_REPLY = 64 << 20
_RCVTIMEO = int(zmq.RCVTIMEO)  # a plain int: pyzmq's enum costs a Python call per use

#: Every client DEALER's options: no linger on close, deep queues, quick reconnects.
DEALER_OPTIONS: tuple[tuple[int, int], ...] = (
    (zmq.LINGER, 0),
    (zmq.RCVHWM, 10_000),
    (zmq.SNDHWM, 10_000),
    (zmq.RECONNECT_IVL, 50),
    (zmq.RECONNECT_IVL_MAX, 1000),
)


#: How long a reply may be late before the transport looks whether its owner restarted.
PEER_CHECK_S = 1.0


class _PeerRestarted(Exception):
    """The socket file a channel connected to is not the one it connected to any more."""


class PeerFile:
    """The ipc socket file a connection was made to, as it was then (device, inode, ctime).

    An owner that restarts binds a new file in its place, and what was written to the old
    connection before the DEALER saw it close is lost; a changed identity says so without
    waiting for a timeout. The ctime is part of it because a file system may give the new
    file the inode number the old one just freed. One stat per check.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.identity = self.current()

    def current(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_ctime_ns)

    def changed(self) -> bool:
        return self.current() != self.identity


def endpoint_for(address: str, target: str) -> str:
    """Where a request for `target` goes: its owner's own socket beside the node's (a state
    dir's ipc socket: the address book's ipc part), else the node's address (which forwards)."""
    path = ipc_path(address)
    if path is None or path.name != SOCKET_NAME or target not in OWNER_SOCKETS:
        return address
    return f"ipc://{path.parent / OWNER_SOCKETS[target]}"


def outcome_of(request: Request, reply: Envelope) -> Message:
    """The typed result a reply carries, or its typed error raised."""
    if reply.type == ERROR:
        raise SubagentsError.from_wire(reply.body)
    return parse_result(request, reply.body)


def reply_envelope(frame: bytes) -> Envelope | None:
    """A reply frame decoded, or None when it is garbled (it cannot be matched to anything)."""
    try:
        return decode(frame, MAX_REPLY)
    except SubagentsError:
        return None


class Transport(Protocol):
    """Send one request and wait for its outcome.

    `target` names the owner for requests that do not fix one themselves (the `debug.*`
    fault-injection requests); a request with its own target ignores an empty one and refuses
    a different one (BadRequest, from the Dispatcher).
    """

    address: str

    def call(self, request: Request, timeout: float, target: str = "") -> Message: ...

    def close(self) -> None: ...


class PendingReply:
    """A request on the wire. Resolve it with `result()` on the thread that submitted it.

    If its owner restarts while it is in flight (its socket file is a new one), a resendable
    request (messages.base.resendable: read-only or idempotent) is sent again on a fresh
    connection within the same deadline; any other is a NodeTimeout at once, worded as an
    unknown outcome, instead of a wait for the whole timeout.
    """

    def __init__(
        self, transport: ZmqTransport, channel: _Channel, request: Request, env: Envelope
    ) -> None:
        self._transport = transport
        self._channel = channel
        self.request = request
        self.target = env.target
        self.id = env.id
        self.resent = 0

    def result(self, timeout: float) -> Message:
        if threading.get_ident() != self._channel.thread_id:
            raise RuntimeError("a PendingReply must be resolved on the thread that submitted it")
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._channel.wait(self.id, deadline, self.request)
            except _PeerRestarted:
                if not resendable(self.request):
                    raise NodeTimeout(
                        f"the owner serving {self.request.type} at {self._channel.endpoint} "
                        "restarted while the request was in flight; its outcome is unknown "
                        "(it may have been applied)",
                        address=self._channel.address,
                        reason="owner_restarted",
                    ) from None
                self._channel, env = self._transport.send(self.request, self.target)
                self.id = env.id
                self.resent += 1
                continue
            return outcome_of(self.request, reply)


class _Channel:
    """One thread's DEALER socket and the replies that arrived for it."""

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        address: str,
        diagnose: Callable[[], str],
        monitor: zmq.Socket[bytes] | None = None,
        endpoint: str = "",
        peer: PeerFile | None = None,
    ) -> None:
        self.sock = sock
        self.monitor = monitor  # tcp only: the socket's handshake events
        self.address = address
        self.endpoint = endpoint or address
        self.peer = peer  # ipc only: the socket file as it was when this channel connected
        self.diagnose = diagnose  # why a request timed out, when that can be told
        self.thread_id = threading.get_ident()
        self.generation = 0  # the transport's `reset` count when this channel was opened
        self.waiting: set[str] = set()
        self.arrived: dict[str, Envelope] = {}
        #: Set once a fresh channel replaced this one: closed when its last waiter is done.
        self.on_retired: Callable[[_Channel], None] | None = None

    def retire(self, close: Callable[[_Channel], None]) -> None:
        if self.waiting:
            self.on_retired = close
        else:
            close(self)

    def send(self, env: Envelope) -> None:
        frame = encode_request(env)  # FrameTooLarge before anything is sent
        self.waiting.add(env.id)
        self.sock.send(frame)

    def wait(self, corr: str, deadline: float, request: Request) -> Envelope:
        try:
            while corr not in self.arrived:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # The outcome is unknown (the request may have been applied), so this
                    # stays a timeout even when the node is known to be gone.
                    raise NodeTimeout(
                        f"the node at {self.address} did not answer {request.type} in time "
                        f"({self.diagnose()})",
                        address=self.address,
                    )
                # One blocking receive with a timeout: fewer calls (and system calls) per
                # reply than poll-then-receive, which matters at tens of µs per call on VMs.
                # A late reply (past PEER_CHECK_S) looks whether the owner restarted.
                late = self.peer is not None and remaining > PEER_CHECK_S
                frame = self._receive(PEER_CHECK_S if late else remaining)
                if frame is not None:
                    self._keep(frame)
                elif late and corr not in self.arrived and self.peer and self.peer.changed():
                    raise _PeerRestarted
            return self.arrived.pop(corr)
        finally:
            self.waiting.discard(corr)
            if self.on_retired is not None and not self.waiting:
                self.on_retired(self)

    def _receive(self, timeout_s: float) -> bytes | None:
        if self.monitor is not None:
            return self._receive_watching(timeout_s)
        self.sock.setsockopt(_RCVTIMEO, max(1, int(timeout_s * 1000)))
        try:
            return self.sock.recv()
        except zmq.Again:
            return None

    def _receive_watching(self, timeout_s: float) -> bytes | None:
        """Wait for a reply or a refused handshake (tcp): a refusal raises NotAuthenticated."""
        assert self.monitor is not None
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            events = dict(poller.poll(max(1, int(remaining * 1000))))
            if self.monitor in events:
                self._check_handshake()
            if self.sock in events:
                return self.sock.recv(zmq.NOBLOCK)
        return None

    def _check_handshake(self) -> None:
        # Here, not at the top: zmq.utils.monitor imports zmq.asyncio (all of asyncio), which
        # only a tcp channel needs, and every client and node process imports this module.
        from zmq.utils.monitor import recv_monitor_message

        assert self.monitor is not None
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if int(event["event"]) & HANDSHAKE_REFUSED:
                raise NotAuthenticated(
                    f"the node at {self.address} refused this client's CURVE key (not on its "
                    "allow-list, revoked, or the wrong server key); ask its owner to run "
                    "`subagents-node keys allow KEY --name NAME`",
                    address=self.address,
                    reason="handshake",
                )

    def _keep(self, frame: bytes) -> None:
        """File a reply under its correlation id; stale and garbled replies are dropped."""
        env = reply_envelope(frame)
        if env is None:
            return
        if env.corr is not None and env.corr in self.waiting:
            self.arrived[env.corr] = env


class ZmqTransport:
    def __init__(
        self,
        address: str,
        zctx: zmq.Context[zmq.Socket[bytes]] | None = None,
        sender: str = "",
        credentials: ClientCredentials | None = None,
        state_dir: Path | None = None,
        host: str = "",
    ) -> None:
        self.address = check_endpoint(address)
        #: Multi-host: the worker the home node at `address` carries every request on to
        #: (`Envelope.host`; sent to the node's own socket, which does the carrying).
        self.host = host
        #: tcp only: explicit keys, else those of `state_dir` (else the default state dir's)
        self._credentials = credentials
        self._state_dir = state_dir
        self._own_context = zctx is None
        self._zctx: zmq.Context[zmq.Socket[bytes]] = zctx or zmq.Context()
        self._sender = sender or f"client-{os.getpid()}"
        self._local = threading.local()
        self._channels: list[_Channel] = []
        self._lock = threading.Lock()  # guards _channels, appended from several threads
        self._closed = False
        self._endpoints: dict[str, str] = {}
        self._generation = 0

    def reset(self) -> None:
        """Open fresh connections for the next requests (each thread replaces its own idle
        ones). After a peer's restart, a request written to the old connection before its
        DEALER saw it close would be lost; a fresh connection queues until it connects."""
        self._generation += 1

    def _drop(self, channel: _Channel) -> None:
        with self._lock:
            if channel in self._channels:
                self._channels.remove(channel)
        if channel.monitor is not None:
            channel.sock.disable_monitor()
            channel.monitor.close(linger=0)
        channel.sock.close(linger=0)

    def endpoint_for(self, target: str) -> str:
        # Computed once per target: path parsing on every request shows in a claim's CPU.
        endpoint = self._endpoints.get(target)
        if endpoint is None:
            direct = endpoint_for(self.address, target) if not self.host else self.address
            endpoint = self._endpoints[target] = direct
        return endpoint

    def on_host(self, host: str) -> ZmqTransport:
        """A transport whose requests the home node at this address carries on to its worker
        `host` (the node's ipc socket only: a home carries nothing for a tcp peer)."""
        return ZmqTransport(
            self.address,
            sender=self._sender,
            credentials=self._credentials,
            state_dir=self._state_dir,
            host=host,
        )

    def _channel(self, target: str = "") -> _Channel:
        channels: dict[str, _Channel] | None = getattr(self._local, "channels", None)
        if channels is None:
            channels = self._local.channels = {}
        endpoint = self.endpoint_for(target)
        channel = channels.get(endpoint)
        if channel is not None and (
            channel.generation != self._generation
            or (channel.peer is not None and channel.peer.changed())
        ):
            # After `reset`, or its owner restarted (a new socket file): a fresh connection,
            # so nothing more is written to one the peer closed. The old one is closed here,
            # by its own thread, once no request of this thread waits on it.
            del channels[endpoint]
            channel.retire(self._drop)
            channel = None
        if channel is None:
            if self._closed:
                raise NodeNotRunning("this client is closed", address=self.address)
            self._check_reachable(stale=True)
            if endpoint != self.address:
                check_reachable(endpoint, stale=True)
            sock = self._zctx.socket(zmq.DEALER)
            for option, value in DEALER_OPTIONS:
                sock.setsockopt(option, value)
            monitor = None
            try:
                if self.address.startswith("tcp://"):
                    curve_client(sock, self._credentials or default_credentials(self._state_dir))
                    monitor = sock.get_monitor_socket(HANDSHAKE_REFUSED)
                sock.connect(endpoint)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise BadAddress(
                    f"cannot connect to {self.address}: {exc}", address=self.address
                ) from None
            except KeyFileInvalid as err:
                sock.close(linger=0)
                raise no_keys(self.address, err) from None
            path = ipc_path(endpoint)
            peer = None if path is None else PeerFile(str(path))
            channel = _Channel(sock, self.address, self._why_silent, monitor, endpoint, peer)
            channel.generation = self._generation
            channels[endpoint] = channel
            with self._lock:
                self._channels.append(channel)
        return channel

    def _why_silent(self) -> str:
        return why_silent(self.address)

    def _check_reachable(self, stale: bool = False) -> None:
        check_reachable(self.address, stale)

    def submit(self, request: Request, target: str = "") -> PendingReply:
        """Put `request` on the wire now; resolve the returned PendingReply later, same thread."""
        channel, env = self.send(request, target)
        return PendingReply(self, channel, request, env)

    def send(self, request: Request, target: str = "") -> tuple[_Channel, Envelope]:
        """Put `request` on this thread's channel to its owner (opened or renewed here).

        The one stat per request is the channel's check of its socket file: a file gone or
        replaced opens a fresh channel, which checks the node is there (NodeNotRunning)."""
        channel = self._channel(target or request.target)
        env = Envelope(
            type=request.type,
            body=request.to_body(),
            target=target or request.target,
            sender=self._sender,
            host=self.host,
        )
        channel.send(env)
        return channel, env

    def call(self, request: Request, timeout: float, target: str = "") -> Message:
        return self.submit(request, target).result(timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, []
        for channel in channels:
            if channel.monitor is not None:
                channel.sock.disable_monitor()
                channel.monitor.close(linger=0)
            channel.sock.close(linger=0)
        if self._own_context:
            self._zctx.term()
