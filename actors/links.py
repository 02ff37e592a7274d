"""OwnerLinks: the DEALER sockets one thread uses to ask other owners, and what waits on them.

Owns one DEALER per peer endpoint (opened on first use), the requests sent and not yet
answered (by correlation id) and their deadlines. A reply is matched to its request and handed
to the request's reply function as the typed result or the typed error; a reply nobody waits
for any more (its request expired) is dropped. A request unanswered by its deadline is
answered `OwnerUnavailable` (its owner crashed with it in flight, or is restarting), so no
caller waits for ever and every request gets exactly one outcome.

A tcp endpoint is another host's (a worker node's links to its home's owners): its DEALER
is a CURVE client with the given credentials and exchanges ZMTP heartbeats, so a dead link is
dropped in seconds (what was in flight on it is answered `OwnerUnavailable` at its deadline).
Whether to send to a home that is known to be unreachable is the caller's decision (the
worker's forwarder fails such requests closed before they reach the links); what is in flight
to it when its caller learns it is unreachable is answered at once (`other_host_lost`:
reason `home_unreachable_in_flight`, outcome unknown), not at its deadline.

Replies from the owners of this node are read strictly (one release: an unknown field is a
bug). Replies for the targets another host answers (`other_host`: a worker's links to its
home's ledgers, whichever socket carries them) are read as a client reads a node's
(`parse_reply`): a home one release newer may have added fields, at any depth. A reply in
another protocol version is its request's UnsupportedProtocol at once, from any peer, never a
frame dropped as garbled while the request waits out its deadline.

A request in flight to an owner process that ended is lost with it: it is answered
`OwnerUnavailable` as soon as the links learn it, not at its deadline. An owner process's links
learn it by looking, while requests wait, whether the peer's ipc socket file was replaced (its
successor binds a new one: actors/peerfiles.py); the node's links are told by the node, which
reaps its owners (`peer_ended`). Either way the next request goes over a fresh link, to the
successor.

Not thread-safe by design: the thread that owns the links (an owner process's loop, the
node's forwarder, its gateway) is the only one that sends, receives and expires; `peer_ended`
alone may be called from any thread. It never decides anything about the requests it carries.
"""

from __future__ import annotations

import collections
import errno
import heapq
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from subagents_node.actors.ipv6 import ipv6_for
from subagents_node.actors.outcomes import ReplyFn
from subagents_node.actors.peerfiles import PeerFiles
from subagents_node.actors.records import Record, init_fields
from subagents_node.messages.base import Request, parse_reply, parse_result
from subagents_node.messages.codec import decode, encode_request, in_other_version, peek_id
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import (
    Busy,
    OwnerUnavailable,
    SubagentsError,
    UnsupportedProtocol,
)
from subagents_node.messages.members import ONE_PROTOCOL

log = logging.getLogger(__name__)

#: How long a request to another owner may stay unanswered (an owner restarts in well under
#: a second; a request lost in its crash must not hold a launch for ever). An owner process
#: takes its own from the node setting `owner_call_timeout_s` (runtime/node/ownerproc.py).
DEFAULT_TIMEOUT_S = 15.0
#: Replies can be larger than requests (listings); the owners cap what they send.
MAX_REPLY_BYTES = 64 << 20
#: ZMTP heartbeats on a link to another host: a silent peer is dropped after the timeout.
REMOTE_HEARTBEAT_MS = 500
REMOTE_HEARTBEAT_TIMEOUT_MS = 2000
# Plain ints: pyzmq's flag enums cost a Python-level enum operation per use.
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
_NOBLOCK = int(zmq.NOBLOCK)


class RemoteKeys(Record):
    """CURVE keys of a link to another host: ours (z85 public and secret), the server's public."""

    __slots__ = ("public", "secret", "server_public")
    public: str
    secret: str
    server_public: str

    def __init__(self, public: str, secret: str, server_public: str) -> None:
        init_fields(self, public=public, secret=secret, server_public=server_public)


#: Who gets a raw reply: the owner's reply envelope as it came, or the typed error that
#: stands for it (a timeout, the links closing).
RawReplyFn = Callable[[Envelope | SubagentsError], None]


class _Waiting:
    """A request sent and not answered yet. (Slotted, not a dataclass: ~1 ms of every start.)"""

    __slots__ = (
        "deadline",
        "endpoint",
        "raw",
        "reply",
        "request",
        "target",
        "timeout_s",
        "tolerant",
    )

    def __init__(
        self,
        request: Request,
        target: str,
        reply: Callable[[Any], None],
        timeout_s: float,
        raw: bool = False,
        tolerant: bool = False,
        endpoint: str = "",
    ) -> None:
        self.request = request
        self.target = target
        self.endpoint = endpoint
        self.reply = reply
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        #: hand over the reply envelope itself (a relay passes the body on unparsed)
        self.raw = raw
        #: another host answers it: fields this release does not know are dropped
        self.tolerant = tolerant


class OwnerLinks:
    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        sender: str,
        endpoint_of: Callable[[str], str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        on_socket: Callable[[zmq.Socket[bytes]], None] = lambda sock: None,
        remote_keys: RemoteKeys | None = None,
        on_drop: Callable[[zmq.Socket[bytes]], None] = lambda sock: None,
        other_host: frozenset[str] = frozenset(),
        peer_check_s: float | None = None,
    ) -> None:
        """`peer_check_s`: while requests wait, look that often whether the ipc socket file of
        their peer was replaced (its owner restarted: they are lost) instead of waiting out
        their deadline (None: never; an owner process's links look every second)."""
        self._zctx = zctx
        #: The targets another host answers (a worker's home's ledgers): read tolerantly.
        self._other_host = other_host
        self._remote_keys = remote_keys
        self._sender = sender
        self._endpoint_of = endpoint_of
        self._timeout_s = timeout_s
        self._on_socket = on_socket  # a new socket to poll (the owner's loop registers it)
        self._on_drop = on_drop  # a socket about to be closed: poll it no more
        self._sockets: dict[str, zmq.Socket[bytes]] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._peer_check_s = peer_check_s
        self._peers = PeerFiles()
        self._next_peer_check = 0.0
        #: Peers whose process ended, told by another thread (`peer_ended`): no lock needed.
        self._ended: collections.deque[str] = collections.deque()
        #: Why the other host became unreachable, told by another thread (`other_host_lost`).
        self._hosts_lost: collections.deque[str] = collections.deque()

    def watch_with(
        self,
        on_socket: Callable[[zmq.Socket[bytes]], None],
        on_drop: Callable[[zmq.Socket[bytes]], None] = lambda sock: None,
    ) -> None:
        """Who polls the sockets these links open (an OwnerLoop sets itself), and is told
        before one of them is closed."""
        self._on_socket = on_socket
        self._on_drop = on_drop

    @property
    def sockets(self) -> list[zmq.Socket[bytes]]:
        return list(self._sockets.values())

    def waiting(self) -> int:
        return len(self._waiting)

    def send(
        self, request: Request, target: str, reply: ReplyFn, timeout_s: float | None = None
    ) -> None:
        """Put `request` on the wire to `target`; its outcome reaches `reply` later (from
        `receive` or `expire`, after `timeout_s`, default the links' own). Raises Busy when
        the peer's queue is full (nothing sent)."""
        self._send(request, target, reply, timeout_s, raw=False)

    def send_raw(
        self,
        request: Request,
        target: str,
        deliver: RawReplyFn,
        timeout_s: float | None = None,
        host: str = "",
        endpoint: str = "",
        body: dict[str, Any] | None = None,
    ) -> None:
        """`send`, but the reply reaches `deliver` as the owner's envelope, unparsed: for a
        relay that passes the result on to its own caller (the result is validated by
        whoever reads it, once). `host` and `endpoint`: a request a home node is to carry on
        to its worker `host`, sent to the home at `endpoint`. `body`: the request's body as
        its sender wrote it (already validated into `request`), sent instead of a new one."""
        self._send(
            request, target, deliver, timeout_s, raw=True, host=host, endpoint=endpoint, body=body
        )

    def _send(
        self,
        request: Request,
        target: str,
        reply: Callable[[Any], None],
        timeout_s: float | None,
        raw: bool,
        host: str = "",
        endpoint: str = "",
        body: dict[str, Any] | None = None,
    ) -> None:
        target = target or request.target
        endpoint = endpoint or self._endpoint_of(target)
        sock = self._socket(endpoint)
        if self._peer_check_s is not None:
            self._peers.sending(endpoint)
        env = Envelope(
            type=request.type,
            body=request.to_body() if body is None else body,
            target=target,
            sender=self._sender,
            host=host,
        )
        frame = encode_request(env)  # FrameTooLarge: the owner would refuse it unread
        try:
            try:
                sock.send(frame, _NOBLOCK)
            except zmq.Again:
                if not endpoint.startswith("tcp://"):
                    raise
                # A link to another host with no connection left to queue on: libzmq gives
                # up on a peer that refused its handshake (a key that peer did not allow yet)
                # and never dials it again. A fresh socket queues until it connects; the
                # request's deadline still bounds the wait.
                self._renew(endpoint)
                self._socket(endpoint).send(frame, _NOBLOCK)
        except zmq.Again:
            raise Busy(
                f"{target} is not taking requests (its queue is full); retry later",
                target=target,
            ) from None
        # A long poll is held by its owner for its wait by design: that is no silence.
        budget = (self._timeout_s if timeout_s is None else timeout_s) + request.held_s
        # A request carried to another worker (`host`) is answered by that worker.
        tolerant = bool(host) or target in self._other_host
        waiting = self._waiting[env.id] = _Waiting(
            request, target, reply, budget, raw, tolerant, endpoint
        )
        heapq.heappush(self._deadlines, (waiting.deadline, env.id))

    def receive(self, sock: zmq.Socket[bytes]) -> int:
        """Hand every reply waiting on `sock` to its request; returns how many there were."""
        count = 0
        # The socket says whether more is waiting: cheaper than receiving until zmq.Again.
        while int(sock.getsockopt(_EVENTS)) & _POLLIN:
            count += 1
            self._deliver(sock.recv(_NOBLOCK))
        return count

    def _deliver(self, frame: bytes) -> None:
        try:
            env = decode(frame, MAX_REPLY_BYTES)
        except UnsupportedProtocol as exc:
            self._in_other_version(frame, exc)
            return
        except SubagentsError:
            log.warning("links: dropped a garbled reply")
            return
        waiting = self._waiting.pop(env.corr or "", None)
        if waiting is None:
            return  # its request expired: the caller has its answer already
        if waiting.raw:
            waiting.reply(env)
            return
        try:
            if env.type == ERROR:
                outcome: object = SubagentsError.from_wire(env.body)
            elif waiting.tolerant:
                outcome = parse_reply(waiting.request, env.body)
            else:
                outcome = parse_result(waiting.request, env.body)
        except SubagentsError as err:
            outcome = err
        waiting.reply(outcome)

    def _in_other_version(self, frame: bytes, refused: UnsupportedProtocol) -> None:
        """A reply in another protocol version (a peer of another release): its request is
        answered UnsupportedProtocol now (raw or not: the error stands for the reply)."""
        waiting = self._waiting.pop(peek_id(frame, "corr") or "", None)
        reply = (
            in_other_version(frame, refused, waiting.target, "this node", ONE_PROTOCOL)
            if waiting is not None
            else None
        )
        if waiting is None or reply is None:
            log.warning("links: dropped a reply in another protocol version: %s", refused.message)
            return
        waiting.reply(SubagentsError.from_wire(reply.body))

    def peer_ended(self, endpoint: str) -> None:
        """Any thread: the owner process behind `endpoint` ended (the node reaped it). What
        waits on it is answered at the links' own thread's next `take_ended` or `expire` (the
        caller wakes that thread)."""
        self._ended.append(endpoint)

    def other_host_lost(self, why: str) -> None:
        """Any thread: the other host these links reach (a worker's home) is unreachable, as
        the worker's home link says (`why`). What waits on it is answered at the links' own
        thread's next `take_ended` or `expire`, outcome unknown (the caller wakes that thread):
        its answer may never come, and the caller is not kept waiting for the deadline."""
        self._hosts_lost.append(why)

    def take_ended(self) -> None:
        """Answer what waits on each peer told ended (or on the other host told lost), and drop
        its link: call it before sending (a request sent on the old link after its owner died
        would be lost as well)."""
        if self._hosts_lost:
            why = self._hosts_lost.pop()  # the latest word; the rest say the same
            self._hosts_lost.clear()
            self._lost({w.endpoint for w in self._waiting.values() if w.tolerant}, "", why)
        if not self._ended:  # the common case, on every turn of the loop
            return
        # As many as are there now: another thread may append meanwhile (the next turn's).
        self._lost({self._ended.popleft() for _ in range(len(self._ended))}, "ended")

    def next_deadline(self) -> float | None:
        """Seconds until the earliest request expires, or its peer is looked at (None:
        nothing waits)."""
        while self._deadlines and self._deadlines[0][1] not in self._waiting:
            heapq.heappop(self._deadlines)
        if not self._deadlines:
            return None
        due = self._deadlines[0][0]
        if self._peer_check_s is not None:
            due = min(due, self._next_peer_check)
        return max(0.0, due - time.monotonic())

    def expire(self) -> None:
        """Answer every request past its deadline with OwnerUnavailable, and every request
        whose peer's socket file was replaced (its owner restarted with it in flight)."""
        self.take_ended()
        now = time.monotonic()
        if self._peer_check_s is not None and self._waiting and now >= self._next_peer_check:
            self._next_peer_check = now + self._peer_check_s
            self._lost_with_their_peer()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, corr = heapq.heappop(self._deadlines)
            waiting = self._waiting.pop(corr, None)
            if waiting is None:
                continue
            waiting.reply(
                OwnerUnavailable(
                    f"{waiting.target} did not answer {waiting.request.type} within "
                    f"{waiting.timeout_s:g}s (it may have restarted with the request in flight)",
                    owner=waiting.target,
                    state="unknown",
                    reason="timeout",
                )
            )

    def _lost_with_their_peer(self) -> None:
        """Answer the requests whose peer's socket file is not the one their link opened on:
        its owner was restarted (a new process binds a new file) and what it had not answered
        died with it. Only the peers something waits on are looked at."""
        replaced = self._peers.replaced({waiting.endpoint for waiting in self._waiting.values()})
        if replaced:
            self._lost(replaced, "restarted")

    def _lost(self, endpoints: set[str], how: str, home_lost: str = "") -> None:
        """Answer every request waiting on `endpoints` (their owner `how`, or the home that
        serves them unreachable, `home_lost` saying why: it will not answer them) and drop
        those links: a fresh one carries the next request. A late answer is then dropped."""
        for corr, waiting in list(self._waiting.items()):
            if waiting.endpoint not in endpoints:
                continue
            del self._waiting[corr]
            kind = waiting.request.type
            if home_lost:
                lost = OwnerUnavailable(
                    f"{waiting.target} is on the home node, which this worker cannot reach now "
                    f"({home_lost}), and {kind} was in flight: its outcome is unknown (it may "
                    "have been applied); look before sending it again once the home is back",
                    owner=waiting.target,
                    state="unknown",
                    reason="home_unreachable_in_flight",
                    outcome="unknown",
                )
            else:
                lost = OwnerUnavailable(
                    f"{waiting.target} {how} with {kind} in flight",
                    owner=waiting.target,
                    state="unknown",
                    reason="timeout",
                )
            waiting.reply(lost)
        for endpoint in endpoints:
            self._renew(endpoint)

    def _socket(self, endpoint: str) -> zmq.Socket[bytes]:
        sock = self._sockets.get(endpoint)
        if sock is None:
            try:
                sock = self._zctx.socket(zmq.DEALER)
            except zmq.ZMQError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                # Out of descriptors is load, not a bug: refused like a full queue, and the
                # owner keeps serving (no crash counted against its restart intensity).
                raise Busy(
                    f"cannot open a link to {endpoint}: no file descriptor left; retry later",
                    target=endpoint,
                ) from None
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 10_000)
            sock.setsockopt(zmq.RCVHWM, 10_000)
            sock.setsockopt(zmq.RECONNECT_IVL, 20)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
            ipv6_for(sock, endpoint)  # a home's owners may be at an IPv6 address
            if endpoint.startswith("tcp://"):
                self._secure(sock, endpoint)
            sock.connect(endpoint)
            self._sockets[endpoint] = sock
            self._peers.opened(endpoint)
            self._on_socket(sock)
        return sock

    def _renew(self, endpoint: str) -> None:
        """Close the link to `endpoint` (what waits on it runs out at its deadline)."""
        self._peers.forget(endpoint)
        sock = self._sockets.pop(endpoint, None)
        if sock is not None:
            self._on_drop(sock)
            sock.close(linger=0)

    def _secure(self, sock: zmq.Socket[bytes], endpoint: str) -> None:
        """A link to another host: CURVE (DESIGN §3), and heartbeats so that a partition is
        noticed."""
        keys = self._remote_keys
        if keys is None:
            sock.close(linger=0)
            raise OwnerUnavailable(
                f"no CURVE keys for the link to {endpoint}", owner=endpoint, reason="no_keys"
            )
        sock.curve_publickey = keys.public.encode("ascii")
        sock.curve_secretkey = keys.secret.encode("ascii")
        sock.curve_serverkey = keys.server_public.encode("ascii")
        sock.setsockopt(zmq.HEARTBEAT_IVL, REMOTE_HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, REMOTE_HEARTBEAT_TIMEOUT_MS)

    def close(self) -> None:
        """Answer whatever still waits (the owner is stopping) and close every socket."""
        waiting, self._waiting = self._waiting, {}
        for entry in waiting.values():
            entry.reply(
                OwnerUnavailable(
                    f"{entry.request.type} to {entry.target} was abandoned: the caller stopped",
                    owner=entry.target,
                    state="unknown",
                    reason="stopping",
                )
            )
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()
