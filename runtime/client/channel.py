"""One thread's DEALER channel to one endpoint, and the replies that come back on it.

Owns what happens between putting an envelope on a socket and handing back its outcome:
the options every client DEALER is opened with, matching replies to requests by correlation
id (stale replies, for requests that timed out, and garbled ones are dropped; one in another
protocol version is its request's UnsupportedProtocol, `read_reply`), the timeout,
noticing that the owner behind an ipc socket restarted (`PeerFile`: a request in flight is
sent again if it is resendable, else a NodeTimeout at once, worded as an unknown outcome) or
that its node was killed (`gone_error`: a resendable request is told at once that no node
runs, so a follower takes the state dir over, and any other is an unknown outcome at once),
and, over tcp, a refused CURVE handshake reported as NotAuthenticated instead of a silent
timeout. `PendingReply` is a request on the wire, resolved on the thread that sent it. Also
what both transports open every socket with: the DEALER options (IPv6 for a bracketed host),
and the error a request gets when its connection's queue stays full until its deadline
(`unsent_error`: an owner that stopped reading; nothing was sent).

It must never choose where a request goes or open a socket (the transport does both, and
hands a channel its socket), never share a channel between threads (sockets are not
thread-safe), and never touch its socket outside its guard's `enter` ... `leave`: a client
closed from another thread closes the socket then (client/thread_channels.py). Like the rest
of the client, it never imports the node or the actors.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import zmq

from subagents_node.client.curve import HANDSHAKE_REFUSED
from subagents_node.client.fleetrole import start_advice
from subagents_node.client.reachability import UNKNOWN_OUTCOME, known_dead
from subagents_node.messages.base import Message, Request, parse_reply, resendable
from subagents_node.messages.codec import Reply, decode_reply, in_other_version
from subagents_node.messages.envelope import ERROR
from subagents_node.messages.errors import (
    NodeNotRunning,
    NodeTimeout,
    NotAuthenticated,
    SubagentsError,
    UnsupportedProtocol,
)

#: Replies may be larger than requests (status listings); the node caps what it sends.
MAX_REPLY = 64 << 20
_RCVTIMEO = int(zmq.RCVTIMEO)  # a plain int: pyzmq's enum costs a Python call per use
_NOBLOCK = int(zmq.NOBLOCK)
_ETERM = int(zmq.ETERM)
_POLLOUT = int(zmq.POLLOUT)

#: Every client DEALER's options: no linger on close, deep queues, quick reconnects.
DEALER_OPTIONS: tuple[tuple[int, int], ...] = (
    (zmq.LINGER, 0),
    (zmq.RCVHWM, 10_000),
    (zmq.SNDHWM, 10_000),
    (zmq.RECONNECT_IVL, 50),
    (zmq.RECONNECT_IVL_MAX, 1000),
)
_IPV6 = ((zmq.IPV6, 1),)


def dealer_options(endpoint: str) -> tuple[tuple[int, int], ...]:
    """DEALER_OPTIONS, plus IPV6 for a bracketed IPv6 host: zmq resolves tcp hosts as IPv4
    only unless a socket is told otherwise, so `tcp://[::1]:PORT` would never connect."""
    return DEALER_OPTIONS + _IPV6 if endpoint.startswith("tcp://[") else DEALER_OPTIONS


#: How long a reply may be late before the transport looks whether its owner restarted.
PEER_CHECK_S = 1.0


class _PeerRestarted(Exception):
    """The socket file a channel connected to is not the one it connected to any more."""


class _PeerGone(Exception):
    """The node behind the socket file a channel connected to is dead (killed with -9)."""


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

    def gone(self) -> bool:
        """Its node is dead: the socket file stayed, but nothing will ever answer on it."""
        return known_dead(Path(self.path))


def gone_error(request: Request, address: str) -> SubagentsError:
    """What a request in flight gets once its node is known dead. A resendable one (read-only
    or idempotent) lost nothing: no node runs, as a new request would be told (a foreground
    follow then takes the state dir over). Any other may have been applied before the node
    died: an unknown outcome, at once instead of after the whole timeout."""
    if resendable(request):
        return NodeNotRunning(
            f"no node is running at {address}: the node that served it is gone (it ended "
            f"while {request.type} was in flight); {start_advice(address)}",
            address=address,
        )
    return NodeTimeout(
        f"the node at {address} is gone: it ended while {request.type} was in flight; "
        f"{UNKNOWN_OUTCOME}",
        address=address,
        reason="node_gone",
    )


#: `details["reason"]` of the NodeNotRunning every call of a closed client raises: this client
#: was closed (by its caller, or an embedded node's stop), not a node that went. Nothing more is
#: sent through it, so a caller waiting for the next node (client/nodewait.py) stops at once.
CLIENT_CLOSED = "client_closed"


def closed_error(address: str) -> NodeNotRunning:
    """What a call of a closed client raises (and a call in flight as it was closed)."""
    return NodeNotRunning("this client is closed", address=address, reason=CLIENT_CLOSED)


def is_closed_error(err: SubagentsError) -> bool:
    """Whether `err` says the client that raised it was closed (`closed_error`)."""
    return isinstance(err, NodeNotRunning) and err.details.get("reason") == CLIENT_CLOSED


def unsent_error(request: Request, address: str, endpoint: str) -> NodeTimeout:
    """What a request gets when its connection's send queue (SNDHWM requests) stayed full until
    its deadline: the owner at `endpoint` is not reading (stopped, swapped out, stuck). The
    request was never sent, so nothing was applied: a timeout all the same, as a request the
    owner never answered, bounded by the caller's timeout like any other."""
    return NodeTimeout(
        f"the node at {address} did not take {request.type} in time: the queue of requests to "
        f"its owner at {endpoint} is full (the owner is not reading them); nothing was sent",
        address=address,
        reason="not_sent",
    )


def outcome_of(request: Request, reply: Reply) -> Message:
    """The typed result a reply carries, or its typed error raised. Fields this client does
    not know (its node is a release newer) are dropped, at any level (`parse_reply`)."""
    if reply.type == ERROR:
        raise SubagentsError.from_wire(reply.body)
    return parse_reply(request, reply.body)


def read_reply(frame: bytes) -> Reply | None:
    """A reply frame decoded, or None when it is garbled (it cannot be matched to anything).

    A reply in another protocol version (a node of another release, answering this client's
    request or refusing it for its version) is the UnsupportedProtocol its request gets, not
    a frame dropped as garbled: its caller would wait out its timeout and hear NodeTimeout."""
    try:
        return decode_reply(frame, MAX_REPLY)
    except UnsupportedProtocol as exc:
        return in_other_version(
            frame,
            exc,
            "the node",
            "this client",
            "use a client of the node's release (`subagents-node doctor` compares them)",
        )
    except SubagentsError:
        return None


class SocketGuard(Protocol):
    """Whether the channel's thread may touch its socket now (thread_channels.ThreadChannels):
    `enter` raises NodeNotRunning once the client is closed; `leave` closes the thread's
    sockets and raises it when the client was closed during the call (or, `terminated`, the
    call was cut short by the context's termination), unless the call ends with an exception
    of its own (`passing`), which goes on; `closing` says the client closed meanwhile."""

    @property
    def closing(self) -> bool: ...

    def enter(self) -> None: ...

    def leave(self, terminated: bool = False, passing: bool = False) -> None: ...

    def closed_error(self) -> NodeNotRunning: ...


class ChannelSender(Protocol):
    """Where a PendingReply sends its request again: a fresh channel of the same thread.

    A protocol, not the transport itself, so this module never imports the transport."""

    def send(
        self, request: Request, target: str = "", deadline: float | None = None
    ) -> tuple[Channel, str]: ...


class PendingReply:
    """A request on the wire. Resolve it with `result()` on the thread that submitted it.

    If its owner restarts while it is in flight (its socket file is a new one), a resendable
    request (messages.base.resendable: read-only or idempotent) is sent again on a fresh
    connection within the same deadline; any other is a NodeTimeout at once, worded as an
    unknown outcome, instead of a wait for the whole timeout.
    """

    def __init__(
        self, transport: ChannelSender, channel: Channel, request: Request, msg_id: str, target: str
    ) -> None:
        self._transport = transport
        self._channel = channel
        self.request = request
        self.target = target
        self.id = msg_id
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
                        f"restarted while the request was in flight; {UNKNOWN_OUTCOME}",
                        address=self._channel.address,
                        reason="owner_restarted",
                    ) from None
                sender = self._transport
                self._channel, self.id = sender.send(self.request, self.target, deadline)
                self.resent += 1
                continue
            except _PeerGone:
                raise gone_error(self.request, self._channel.address) from None
            return outcome_of(self.request, reply)


class Channel:
    """One thread's DEALER socket and the replies that arrived for it."""

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        guard: SocketGuard,
        address: str,
        diagnose: Callable[[Request], str],
        monitor: zmq.Socket[bytes] | None = None,
        endpoint: str = "",
        peer: PeerFile | None = None,
    ) -> None:
        self.sock = sock
        self.guard = guard
        self.monitor = monitor  # tcp only: the socket's handshake events
        self.address = address
        self.endpoint = endpoint or address
        self.peer = peer  # ipc only: the socket file as it was when this channel connected
        self.diagnose = diagnose  # a timeout's message, saying why when that can be told
        self.thread_id = threading.get_ident()
        self.generation = 0  # the transport's `reset` count when this channel was opened
        self.waiting: set[str] = set()
        self.arrived: dict[str, Reply] = {}
        self._rcvtimeo = -1  # the socket's RCVTIMEO in ms as last set (-1: zmq's default)
        #: Set once a fresh channel replaced this one: closed when its last waiter is done.
        self.on_retired: Callable[[Channel], None] | None = None

    def retire(self, close: Callable[[Channel], None]) -> None:
        if self.waiting:
            self.on_retired = close
        else:
            close(self)

    def write(
        self, frame: bytes, msg_id: str, request: Request, deadline: float | None = None
    ) -> None:
        """Put a request's frame on the socket and wait for replies to `msg_id`. The caller is
        inside the guard's `enter` ... `leave` (the transport opens or renews the channel and
        writes under one `enter`), and catches zmq.ContextTerminated there.

        A full send queue (SNDHWM frames the owner has not read: it stopped reading) is waited
        on until `deadline` at most (None: for as long as it takes), then `unsent_error`:
        a blocking send waited for the owner whatever the call's timeout, even 0."""
        while True:
            try:
                self.sock.send(frame, _NOBLOCK)
                break
            except zmq.Again:
                self._wait_for_room(request, deadline)
        self.waiting.add(msg_id)

    def _wait_for_room(self, request: Request, deadline: float | None) -> None:
        """Until the socket takes a frame again; `unsent_error` at `deadline`. In slices of
        PEER_CHECK_S, so a close from a signal handler on this thread (which cannot cut a
        poll short) ends the wait within one."""
        while True:
            if self.guard.closing:
                raise self.guard.closed_error()
            slice_s = PEER_CHECK_S
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise unsent_error(request, self.address, self.endpoint)
                slice_s = min(slice_s, remaining)
            if self.sock.poll(max(1, int(slice_s * 1000)), _POLLOUT):
                return

    def cut_short(self) -> None:
        """Make the receive this thread was interrupted in (by a signal handler that closed
        the client) return at once when it resumes: a receive timeout of nothing. Only from
        the channel's own thread, which is not inside any zmq call while its handler runs."""
        self.sock.setsockopt(_RCVTIMEO, 0)
        self._rcvtimeo = 0

    def wait(self, corr: str, deadline: float, request: Request) -> Reply:
        arrived = self.arrived
        try:
            while corr not in arrived:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # The outcome is unknown (the request may have been applied), so this
                    # stays a timeout even when the node is known to be gone.
                    raise NodeTimeout(self.diagnose(request), address=self.address)
                # One blocking receive with a timeout: fewer calls (and system calls) per
                # reply than poll-then-receive, which matters at tens of µs per call on VMs.
                # A late reply (past PEER_CHECK_S) looks whether the owner restarted. Written
                # out here rather than in helpers: this loop runs once per request. A tcp
                # channel waits in the same slices: its poll is not cut short by a close from
                # a signal handler on this thread, the next `leave` sees it.
                late = remaining > PEER_CHECK_S and (
                    self.peer is not None or self.monitor is not None
                )
                self.guard.enter()
                try:
                    frame = self._receive(PEER_CHECK_S if late else remaining)
                except zmq.ZMQError as exc:  # ETERM: the client closed under this call
                    self.guard.leave(terminated=exc.errno == _ETERM)  # NodeNotRunning once closed
                    raise
                except BaseException:  # its own (a signal handler's exit, a refused handshake)
                    self.guard.leave(passing=True)
                    raise
                self.guard.leave()  # NodeNotRunning once the client closed
                if frame is not None:
                    reply = read_reply(frame)
                    if reply is None:  # garbled: it cannot be matched to anything
                        continue
                    if reply.corr is not None and reply.corr in self.waiting:  # else stale
                        arrived[reply.corr] = reply
                elif late and corr not in arrived and self.peer:
                    if self.peer.changed():
                        raise _PeerRestarted
                    if self.peer.gone():  # killed -9: its socket file stays as it was
                        raise _PeerGone
            return arrived.pop(corr)
        finally:
            self.waiting.discard(corr)
            if self.on_retired is not None and not self.waiting:
                self.on_retired(self)

    def _receive(self, timeout_s: float) -> bytes | None:
        """A reply frame, or None after `timeout_s` (inside the guard)."""
        if self.monitor is not None:
            return self._receive_watching(timeout_s)
        timeout_ms = max(1, int(timeout_s * 1000))
        if timeout_ms != self._rcvtimeo:
            # Only when it changes: a request with more than PEER_CHECK_S left always waits
            # PEER_CHECK_S, and each setsockopt costs a lookup of the option in pyzmq.
            self.sock.setsockopt(_RCVTIMEO, timeout_ms)
            self._rcvtimeo = timeout_ms
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
