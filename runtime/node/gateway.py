"""Gateway: the one I/O thread that owns the node's ROUTER socket(s).

Owns the sockets, the outbound reply queue and the wake-up pipe. It decodes and validates every
inbound frame once (size cap, msgpack, envelope, protocol version, body schema), answers a bad
frame with a typed error reply, and hands good requests to the Dispatcher. Actor threads never
touch a socket: their replies are encoded in their own thread, appended to a deque, and the
I/O thread is woken through a pipe it polls beside the sockets.

Sockets: one ROUTER for the ipc endpoints (no security mechanism; the state dir's 0700 mode
guards them) and, when the node listens on tcp, a second ROUTER that is a CURVE server whose
peers the CurveGuard (runtime/node/curve.py) admits through ZAP, polled in this same thread;
its TcpBudget (actors/tcpbudget.py) unbinds it for a moment when it holds too many connections.
A reply leaves through the socket its request came in on. A tcp frame carries its peer's
authenticated key; it is refused (dropped, with no reply) once that key is revoked, and its
name is the request's principal: logged, passed to the dispatcher, and shown to the node's
`admit` check (a home node fences a forgotten worker there and stamps a worker's name on what
it asks the ledgers). `node.keys.*` requests, and every request that is an operator's act
(`capacity.release_host`, `node.members.forget`; `messages.protocol.local_only`), are served
on ipc only; `node.members.join|heartbeat|leave` (which name the peer) on tcp only.

On a home node, a frame from a local (ipc) client whose envelope names a worker `host` is
carried on to that worker over the connection the worker's home link opened, and the worker's
answer, arriving on the tcp socket as a reply, is carried back (runtime/node/hostcalls.py);
from a worker (tcp), only what the home's placement rule lets a nested child place on another
worker, and of those follow-ups only for a run the worker placed (the home's `settle` records
each placed run from its launch's answer before the answer goes on). On a worker, a local frame
naming another host is handed to the home (the relay).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Sequence

import zmq

from subagents_node.actors.inbound import bound_inbound
from subagents_node.actors.ipv6 import ipv6_for
from subagents_node.actors.links import RawReplyFn
from subagents_node.actors.loglimit import RepeatedWarnings
from subagents_node.actors.owner import Outcome, ReplyFn
from subagents_node.actors.tcpbudget import TcpBudget, earliest, tcp_listener
from subagents_node.messages.codec import MAX_FRAME_BYTES, decode, encode, encode_answer, peek_id
from subagents_node.messages.envelope import ERROR, REPLY, Envelope
from subagents_node.messages.errors import BadRequest, MalformedFrame, SubagentsError
from subagents_node.messages.members import PEER_ONLY_TYPES, MemberHeartbeat
from subagents_node.messages.protocol import local_only, parse_request
from subagents_node.node.curve import CurveGuard
from subagents_node.node.dispatch import Dispatcher
from subagents_node.node.hostcalls import HomeChecks, HostCalls, Settle
from subagents_node.node.relay import Relay

log = logging.getLogger(__name__)

#: Frames handled per wake-up before the gateway sends pending replies again (fairness).
_RECV_BATCH = 256
# Plain ints: pyzmq's flag enums cost a Python-level enum operation per use.
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
_NOBLOCK = int(zmq.NOBLOCK)
_SEND_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
#: How long a stopping gateway may spend delivering replies already sent.
_CLOSE_LINGER_MS = 500


class Gateway:
    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        endpoints: Sequence[str],
        dispatcher: Dispatcher,
        node_id: str,
        max_frame: int = MAX_FRAME_BYTES,
        hwm: int = 10_000,
        curve: CurveGuard | None = None,
        home: HomeChecks | None = None,
        relay: Relay | None = None,
        hosts: HostCalls | None = None,
        host_name: str = "",
    ) -> None:
        self._zctx = zctx
        #: A home's checks of its tcp peers' requests (None: not a home).
        self._home = home
        #: This node's name among its home's members (`home` on a home; "" alone): a request
        #: addressed to it by name is its own.
        self._host_name = host_name
        #: A home's requests in flight to its workers (None: not a home).
        self._hosts = hosts
        #: Owners this thread sends to itself (no hand-off to the forwarder's thread).
        self._relay = relay
        self.endpoints = list(endpoints)
        self._dispatcher = dispatcher
        self._node_id = node_id
        self._max_frame = max_frame
        self._hwm = hwm
        self.curve = curve
        #: (socket index, peer identity, frame); index 0 is the ipc ROUTER, 1 the tcp one.
        self._outbound: collections.deque[tuple[int, bytes, bytes]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_pending = False
        self._stopping = False
        self._ready = threading.Event()
        self._bind_error: BaseException | None = None
        self.bound: list[str] = []
        #: Its tcp listener's budget, once it listens on tcp (read by `status`, any thread).
        self.budget: TcpBudget | None = None
        self.dropped = 0
        #: What a peer makes it warn about at will (refused frames, replies it never reads),
        #: logged at most once a second per kind; used in the gateway thread only.
        self._warnings = RepeatedWarnings(log)
        self._thread = threading.Thread(target=self._run, name="subagents-gateway", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._bind_error is not None:
            raise self._bind_error

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        self._thread.join(timeout=10)
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- called from any thread ---------------------------------------------------------------

    def reply_to(self, identity: bytes, request: Envelope, via: int = 0) -> ReplyFn:
        def reply(outcome: Outcome) -> None:
            self._outbound.append((via, identity, encode_answer(request, outcome, self._node_id)))
            if not self._wake_pending:
                self._wake_pending = True
                self._wake()

        return reply

    def owner_ended(self, endpoint: str) -> None:
        """What the relay has in flight to the reaped owner at `endpoint` is answered now."""
        if self._relay is not None and not self._stopping:
            self._relay.links.peer_ended(endpoint)
            self._wake()

    def home_lost(self, why: str) -> None:
        """What the relay has in flight to this worker's home is answered now (outcome
        unknown): the home link says the home is unreachable."""
        if self._relay is not None and not self._stopping:
            self._relay.links.other_host_lost(why)
            self._wake()

    def _wake(self) -> None:
        # A full pipe means a wake-up is already pending.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\x01")

    # -- the I/O thread -----------------------------------------------------------------------

    def _bind(self) -> list[zmq.Socket[bytes]]:
        """The ipc ROUTER, then (when the node listens on tcp) the CURVE one."""
        ipc = [e for e in self.endpoints if not e.startswith("tcp://")]
        tcp = [e for e in self.endpoints if e.startswith("tcp://")]
        if tcp and self.curve is None:
            raise ValueError("a tcp listener needs CURVE keys (CurveGuard)")
        socks: list[zmq.Socket[bytes]] = []
        try:
            socks.append(self._router(ipc, secure=False))
            if tcp:
                socks.append(self._router(tcp, secure=True))
        except BaseException:  # a bind, or the server key refused: no socket may stay open
            for sock in socks:
                sock.close(linger=0)
            raise
        return socks

    def _router(self, endpoints: list[str], secure: bool) -> zmq.Socket[bytes]:
        sock = self._zctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self._hwm)
        # zmq cuts the connection of a frame far over the cap; one a little over reaches us
        # so that we answer it with a typed FrameTooLarge. A busy gateway's peers wait.
        bound_inbound(sock, self._max_frame)
        try:
            if secure and self.curve is not None:
                tcp_listener(sock)
                self.curve.make_server(sock)  # reads the server key, which may be refused
            for endpoint in endpoints:
                ipv6_for(sock, endpoint)
                sock.bind(endpoint)
                self.bound.append(str(sock.getsockopt_string(zmq.LAST_ENDPOINT)))
        except BaseException:
            sock.close(linger=0)
            raise
        return sock

    def _run(self) -> None:
        zap: zmq.Socket[bytes] | None = None
        try:
            if self.curve is not None and any(e.startswith("tcp://") for e in self.endpoints):
                zap = self.curve.open(self._zctx)  # bound before any CURVE socket exists
            socks = self._bind()
        except BaseException as exc:
            if self.curve is not None:
                self.curve.close()
            self._bind_error = exc
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
        if zap is not None:
            poller.register(zap, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        links = self._relay.links if self._relay is not None else None
        tcp = [e for e in self.bound if e.startswith("tcp://")]
        budget = self.budget = TcpBudget(socks[1], tcp, poller, "gateway") if tcp else None
        if links is not None:
            links.watch_with(lambda sock: poller.register(sock, zmq.POLLIN), poller.unregister)
        try:
            while not self._stopping:
                wait = earliest(
                    links.next_deadline() if links is not None else None,
                    self._hosts.next_deadline() if self._hosts is not None else None,
                    budget.next_deadline() if budget is not None else None,
                    self._warnings.next_deadline(),
                )
                events = dict(poller.poll(None if wait is None else int(wait * 1000) + 1))
                self._warnings.flush_due()
                if self._wake_r in events:
                    self._drain_wake()
                if links is not None:
                    links.take_ended()  # before relaying: not to an owner process that is gone
                if zap is not None and events.get(zap) and self.curve is not None:
                    self.curve.handle()
                if budget is not None:
                    budget.handle(events)
                for via, sock in enumerate(socks):
                    if events.get(sock):
                        self._receive(socks, via)
                if links is not None:
                    for sock in links.sockets:
                        if events.get(sock):
                            links.receive(sock)
                    links.expire()
                if self._hosts is not None:
                    self._outbound.extend(self._hosts.expire())
                self._send(socks)
        finally:
            if self._relay is not None:
                self._relay.close()  # what still waits is answered (OwnerUnavailable)
            self._send(socks)
            if budget is not None:
                budget.close()
            # A short linger: the last replies (a shim's acknowledgement, which it would
            # otherwise resend to a node that is gone) reach their peers before the close.
            for sock in socks:
                sock.close(linger=_CLOSE_LINGER_MS)
            if self.curve is not None:
                self.curve.close()

    def _drain_wake(self) -> None:
        # Empty the pipe first, then clear the flag: the other order loses a wake-up when a
        # reply thread sets the flag and writes between the two steps (the byte is drained, the
        # flag stays set, and later replies wait for an unrelated inbound frame).
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        self._wake_pending = False

    def _receive(self, socks: list[zmq.Socket[bytes]], via: int) -> None:
        sock = socks[via]
        for _ in range(_RECV_BATCH):
            # Ask the socket whether more is waiting rather than receive until zmq.Again: an
            # exception per wake-up costs more than the check on this hot path.
            if not int(sock.getsockopt(_EVENTS)) & _POLLIN:
                return
            if via == 0:
                self._handle(sock.recv_multipart(_NOBLOCK, copy=True))
            else:
                self._handle_tcp(sock.recv_multipart(_NOBLOCK, copy=False))
            self._send(socks)

    def _handle_tcp(self, frames: list[zmq.Frame]) -> None:
        """A frame from an authenticated tcp peer: refused silently once its key is revoked."""
        user_id = frames[-1].get("User-Id") if frames else ""
        principal = self.curve.principal(str(user_id)) if self.curve is not None else None
        if principal is None:
            self._warnings.warn(
                "frames from revoked keys",
                frames[0].bytes if frames else b"",
                f"gateway: dropped a tcp frame from a key no longer allowed: {user_id}",
            )
            return
        self._handle([f.bytes for f in frames], via=1, principal=principal)

    def _handle(self, frames: list[bytes], via: int = 0, principal: str = "") -> None:
        identity = frames[0]
        if len(frames) != 2:
            self._refuse(
                identity, None, MalformedFrame("expected exactly one frame per message"), via=via
            )
            return
        frame = frames[1]
        env: Envelope | None = None
        try:
            env = decode(frame, self._max_frame)
            if via and self._hosts is not None and env.type in (REPLY, ERROR):
                self._worker_answered(env, principal)
                return
            if env.host and env.host != self._host_name:
                self._carry(identity, env, via, principal)
                return
            if via and local_only(env.type):
                raise BadRequest(
                    f"{env.type} is served on the node's ipc socket only", reason="local_only"
                )
            if not via and env.type in PEER_ONLY_TYPES:  # they name the tcp peer that sends them
                raise BadRequest(
                    f"{env.type} is served to authenticated tcp peers only (a worker joins "
                    "over tcp with its CURVE key)",
                    reason="peer_only",
                )
            parsed = request = parse_request(env.type, env.body)
            settle: Settle | None = None
            if via:
                log.debug("gateway: %s from principal %s", env.type, principal)
                host = env.host or self._host_name
                if self._home is not None:
                    request = self._home.admit(request, principal, host)
                    settle = self._home.settler(request, principal, host)
            owner = request.target or env.target
            relay = self._relay
            if relay is not None and env.target in ("", owner) and relay.serves(owner):
                # The body as it came, when nothing changed it: re-encoded with every default
                # filled in, a request under the frame cap could come out over it.
                body = env.body if request is parsed else None
                relay.send(request, owner, self._relayed(identity, env, via, settle), body)
                return
            # A home's runs owner is always the relay's (above): what a worker placed on the
            # home is settled there; here, nothing is recorded, so nothing may be followed.
            reply = self.reply_to(identity, env, via)
            if via and self._hosts is not None and isinstance(request, MemberHeartbeat):
                reply = self._linking(reply, principal, identity)
            self._dispatcher.dispatch(request, env.target, reply, principal or None)
        except SubagentsError as err:
            hosts = self._hosts if via and env is None else None
            # A worker's answer in another protocol version: its client hears so at once.
            mismatch = hosts.in_other_version(frame, err, principal) if hosts else None
            if mismatch is not None:
                self._worker_answered(mismatch, principal)
                return
            corr = env.id if env else peek_id(frame)
            self._refuse(identity, corr, err, env, via, principal)
        except Exception as exc:  # never let one frame take the node down
            log.exception("gateway: unexpected failure on a frame")
            corr = env.id if env else None
            self._refuse(identity, corr, MalformedFrame(repr(exc)), env, via, principal)

    def _carry(self, identity: bytes, env: Envelope, via: int, principal: str) -> None:
        """Send a request for worker `env.host` on to it (raises why not): a home carries it
        over that worker's own connection; a worker hands it to its home."""
        if self._hosts is not None:
            settle: Settle | None = None
            if via:  # a worker's nested child, placed on another worker
                request = parse_request(env.type, env.body)
                if self._home is None:
                    raise BadRequest(
                        "this home carries nothing for a tcp peer", reason="local_only"
                    )
                # A fenced worker, a run not its own, or a non-member's request is refused.
                request = self._home.admit(request, principal, env.host)
                self._home.check_placement(request, principal)
                settle = self._home.settler(request, principal, env.host)
            carried = self._hosts.send(env, via, identity, settle)
            if carried is not None:  # None: a long poll held until its worker is back
                self._outbound.append(carried)
            return
        if self._relay is not None and self._relay.home and not via:
            request = parse_request(env.type, env.body)
            self._relay.carry(request, env.host, self._relayed(identity, env, via))
            return
        raise BadRequest(
            f"this node is not a home, so it has no worker {env.host!r} (address the home "
            "node's state dir, or drop the host)",
            reason="not_home",
        )

    def _worker_answered(self, reply: Envelope, principal: str) -> None:
        out = self._hosts.answer(reply, principal) if self._hosts is not None else None
        if out is None:
            log.debug("gateway: dropped an answer from %s nobody waits for", principal)
        else:
            self._outbound.append(out)

    def _linking(self, reply: ReplyFn, principal: str, identity: bytes) -> ReplyFn:
        """`reply`, and once the heartbeat was answered (not refused), this connection is the
        one a home reaches worker `principal` on (the long polls held for it go out on it).
        The home answers heartbeats on this thread, so HostCalls stays this thread's."""
        hosts = self._hosts

        def linked(outcome: Outcome) -> None:
            if hosts is not None and not isinstance(outcome, SubagentsError):
                self._outbound.extend(hosts.linked(principal, identity))
            reply(outcome)

        return linked

    def _relayed(
        self, identity: bytes, request: Envelope, via: int, settle: Settle | None = None
    ) -> RawReplyFn:
        """The relay's reply to `request`: the owner's reply body passed on as it came (or the
        typed error standing for it), from this thread: no wake-up needed; `settle` sees the
        owner's answer first."""

        def deliver(answer: Envelope | SubagentsError) -> None:
            if settle is not None and isinstance(answer, Envelope):
                answer = settle(answer.type, answer.body) or answer
            if isinstance(answer, SubagentsError):
                frame = encode_answer(request, answer, self._node_id)
            else:
                frame = encode(request.reply(answer.type, answer.body, self._node_id))
            self._outbound.append((via, identity, frame))

        return deliver

    def _refuse(
        self,
        identity: bytes,
        corr: str | None,
        err: SubagentsError,
        env: Envelope | None = None,
        via: int = 0,
        principal: str = "",
    ) -> None:
        self._warnings.warn(
            "refused frames",
            identity,
            f"gateway: refused a frame: {err.code}: {err.message[:200]} "
            f"(principal {principal or 'local'})",
        )
        reply = Envelope(
            type=ERROR,
            body=err.to_wire(),
            target=env.sender if env else "",
            corr=corr,
            sender=self._node_id,
        )
        self._outbound.append((via, identity, encode(reply)))

    def _send(self, socks: list[zmq.Socket[bytes]]) -> None:
        out = self._outbound
        while out:
            via, identity, frame = out.popleft()
            try:
                socks[via].send(identity, _SEND_MORE)
                socks[via].send(frame, _NOBLOCK)
            except zmq.ZMQError as exc:
                # EHOSTUNREACH: the peer is gone; EAGAIN: its queue is full. Either way the
                # reply cannot be delivered now; the caller's timeout reports it.
                self.dropped += 1
                self._warnings.warn("dropped replies", identity, f"gateway: dropped a reply: {exc}")
