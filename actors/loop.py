"""OwnerLoop: the single-threaded loop of an owner process (DESIGN §1 "Owner process").

Owns the owner's ROUTER socket, its mailbox (the messages read and not yet handled), the wake
pipe that other threads of the process (timers, the shim watch) use to post ticks, and the
outbound replies. One pass: wait for the socket, the wake pipe, a peer's reply or the earliest
link deadline; read every frame already waiting (up to `GROUP_MAX`), decode and validate each
once; hand them all to the owner, which applies them in one transaction and commits when its
mailbox is empty (group commit); then send every reply. No thread hand-off on the hot path.

On a home node a ledger owner also owns a second ROUTER, a CURVE server on tcp whose peers its
PeerGate admits (actors/peergate.py): a worker's admission reaches the owner straight, with no
hop through the node. A frame from it carries its peer's key; the gate judges it (revoked,
fenced, operator-only) and stamps the peer's name as the `host` of what it asks. The node's
`owner.peers` (ipc only) is the gate's allow-list, handled here, never by the owner. A TcpBudget
(actors/tcpbudget.py) unbinds that socket for a moment when it holds too many connections at
once, so that a flood of idle ones never takes the owner's last descriptor.

Rules it enforces: a frame that does not decode or validate is answered with a typed error and
never reaches the owner; a request for another owner is refused (`wrong_target`); a mailbox at
its limit answers `Busy` at once (memory stays bounded under a flood); every request is
answered exactly once (`answer_once`). It never touches the owner's database.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
from collections.abc import Callable

import zmq

from subagents_node.actors.inbound import bound_inbound
from subagents_node.actors.inbox import Job, Tick
from subagents_node.actors.ipv6 import ipv6_for
from subagents_node.actors.links import OwnerLinks
from subagents_node.actors.loglimit import RepeatedWarnings
from subagents_node.actors.outcomes import Outcome, ReplyFn, answer_once
from subagents_node.actors.owner import OwnerActor
from subagents_node.actors.peergate import PeerGate
from subagents_node.actors.tcpbudget import Report, TcpBudget, earliest, tcp_listener
from subagents_node.messages.base import Ack
from subagents_node.messages.codec import (
    MAX_FRAME_BYTES,
    Inbound,
    decode_request,
    encode,
    encode_answer,
    peek_id,
)
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import BadRequest, Busy, MalformedFrame, SubagentsError
from subagents_node.messages.peers import OwnerPeers
from subagents_node.messages.protocol import parse_request
from subagents_node.messages.statefiles import restrict_socket

log = logging.getLogger(__name__)

#: Frames read per pass before the owner handles them (the largest possible group).
READ_BATCH = 256
#: ...and the bytes read per pass: 256 frames at the cap would put 256 MiB in the mailbox.
READ_BATCH_BYTES = 16 << 20
# Plain ints: pyzmq's flag enums cost a Python-level enum operation per use, several per
# message on this hot path.
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_SEND_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


class OwnerLoop:
    def __init__(
        self,
        actor: OwnerActor,
        zctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        links: OwnerLinks,
        max_frame: int = MAX_FRAME_BYTES,
        mailbox_limit: int = 1024,
        gate: PeerGate | None = None,
        tcp_endpoint: str = "",
        report_tcp: Report | None = None,
    ) -> None:
        self.actor = actor
        self.endpoint = endpoint
        #: A home's ledger owner: its tcp endpoint (CURVE) and the gate of its peers.
        self.tcp_endpoint = tcp_endpoint
        self._gate = gate
        self._tcp: zmq.Socket[bytes] | None = None
        self._zap: zmq.Socket[bytes] | None = None
        #: The tcp connections the tcp socket may hold at once (unbound past them).
        self.budget: TcpBudget | None = None
        #: Where its figures go (the node's `status`, through the owner's control pipe).
        self._report_tcp = report_tcp
        self.links = links
        self.mailbox_limit = mailbox_limit
        self._max_frame = max_frame
        self._zctx = zctx
        self._inbox: collections.deque[Job | Tick] = collections.deque()
        #: (the socket the request came in on, the peer's routing id, the reply frame)
        self._outbound: collections.deque[tuple[zmq.Socket[bytes], bytes, bytes]] = (
            collections.deque()
        )
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        #: The signal number Python's wakeup fd writes into the pipe that stops the loop.
        self._stop_bytes = b""
        self._stopping = False
        self._poller = zmq.Poller()
        self._router: zmq.Socket[bytes] | None = None
        self.dropped = 0
        #: What a peer makes it warn about at will, at most once a second per kind.
        self._warnings = RepeatedWarnings(log)
        links.watch_with(self.watch)

    # -- the Mailbox protocol (any thread) ----------------------------------------------------

    def post(self, message: Job | Tick) -> None:
        if self._stopping:
            return
        self._inbox.append(message)
        self._wake()

    def empty(self) -> bool:
        return not self._inbox

    def request_stop(self) -> None:
        """Finish the pass under way, commit, and leave `run` (safe from a signal handler)."""
        self._stopping = True
        self._wake()

    def stop_on_signal(self, signum: int) -> None:
        """Leave `run` on `signum`, told by the kernel itself: its handler (set here) and
        Python's wakeup fd, which is the loop's wake-up pipe. Python runs a handler only between
        two bytecodes of the main thread: a TERM that came while the loop was busy in libzmq's
        calls ran no handler before the loop slept in its poll again, and the owner slept
        through its stop until a second signal (the node waited, the node's caller killed it).
        The signal's number in the pipe stops the loop whether or not the handler has run."""
        signal.signal(signum, lambda *_: self.request_stop())
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self._stop_bytes = bytes([signum])

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: a wake-up is pending
            os.write(self._wake_w, b"\x01")

    # -- the loop ------------------------------------------------------------------------------

    def bind(self) -> None:
        """Bind the owner's socket(s) (before `run`, so a bind error is a failed start)."""
        self._router = self._bound(self.endpoint, secure=False)
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        if self._gate is not None and self.tcp_endpoint:
            # The ZAP handler is bound before any CURVE socket of the context exists.
            self._zap = self._gate.open(self._zctx)
            self._poller.register(self._zap, zmq.POLLIN)
            self._tcp = self._bound(self.tcp_endpoint, secure=True)
            self._poller.register(self._tcp, zmq.POLLIN)
            bound = str(self._tcp.getsockopt_string(zmq.LAST_ENDPOINT))
            self.budget = TcpBudget(
                self._tcp, [bound], self._poller, self.actor.name, report=self._report_tcp
            )
            self.budget.report()  # its budget, before any connection

    def _bound(self, endpoint: str, secure: bool) -> zmq.Socket[bytes]:
        sock = self._zctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 500)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        bound_inbound(sock, self._max_frame)  # a flood waits in its senders, not here
        ipv6_for(sock, endpoint)  # a home's tcp address may be IPv6
        if secure and self._gate is not None:
            tcp_listener(sock)
            self._gate.make_server(sock)
        try:
            sock.bind(endpoint)
            if endpoint.startswith("ipc://"):
                # DESIGN §3: sockets 0600, as node.sock; the 0700 state dir is not the only guard
                # (libzmq creates the file under the process umask, 0755 by default).
                restrict_socket(endpoint[len("ipc://") :])
        except (zmq.ZMQError, OSError):
            sock.close(linger=0)
            raise
        return sock

    def watch(self, sock: zmq.Socket[bytes]) -> None:
        """Poll a peer link's socket too (OwnerLinks calls this when it opens one)."""
        self._poller.register(sock, zmq.POLLIN)

    def run(self, on_ready: Callable[[], None] = lambda: None) -> None:
        """Recover the owner, say it is ready, and serve until `request_stop`."""
        assert self._router is not None, "bind() first"
        self.actor.host(self)
        self.actor.on_start()  # opens the store, recover(), commits
        self._send()
        on_ready()
        try:
            while not self._stopping:
                self._pass()
        finally:
            try:
                self._finish()
            finally:
                self._close()

    def _finish(self) -> None:
        """Before the sockets close: the mailbox handled, the owner stopped, the last replies
        sent. Each step on its own: one that raises (an owner whose loop ended on an error
        raises again on the next message it handles) is logged and the next still runs. The
        closes after it once did not, and the process's `zctx.term()` then waited for good
        for the sockets left open: the owner lived on, `running` to the node and never
        restarted, answering nothing."""
        steps = (self._drain, self._stop_actor, self._send, self.links.close, self._drain)
        for step in (*steps, self._send):
            try:
                step()
            except Exception:
                log.exception("%s: stopping: %s failed", self.actor.name, step.__name__)

    def _stop_actor(self) -> None:
        with contextlib.suppress(Exception):
            self.actor.on_stop()

    def _close(self) -> None:
        assert self._router is not None
        try:
            self._router.close(linger=500)
            if self.budget is not None:
                self.budget.close()
            if self._tcp is not None:
                self._tcp.close(linger=500)
            if self._gate is not None:
                self._gate.close()
            if self._stop_bytes:  # before the pipe closes: no signal may write to its number
                signal.set_wakeup_fd(-1)
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _pass(self) -> None:
        assert self._router is not None
        budget = self.budget
        wait = earliest(
            self.links.next_deadline(),
            budget.next_deadline() if budget else None,
            self._warnings.next_deadline(),
        )
        timeout_ms = None if wait is None else max(1, int(wait * 1000) + 1)
        events = dict(self._poller.poll(timeout_ms))
        self._warnings.flush_due()
        if self._wake_r in events:
            with contextlib.suppress(BlockingIOError):
                while woken := os.read(self._wake_r, 4096):
                    if self._stop_bytes and self._stop_bytes in woken:
                        self._stopping = True
        if events.get(self._router):
            self._read(self._router)
        if self._tcp is not None:
            if self._zap is not None and events.get(self._zap) and self._gate is not None:
                self._gate.handle()
            if events.get(self._tcp):
                self._read_tcp(self._tcp)
            if budget is not None:
                budget.handle(events)
        for sock in self.links.sockets:
            if events.get(sock):
                self.links.receive(sock)
        self.links.expire()
        self._drain()
        self._send()

    def _read(self, router: zmq.Socket[bytes]) -> None:
        # The poll reported a message waiting, so the first needs no check; for each later one,
        # ask the socket rather than receive until zmq.Again (an exception per pass costs more
        # than the check). A ROUTER's routing id is always followed by a part, so only the
        # parts after the first body part need the RCVMORE call (each costs a microsecond).
        taken = 0
        try:
            for n in range(READ_BATCH):
                if taken >= READ_BATCH_BYTES or (
                    n and not int(router.getsockopt(_EVENTS)) & _POLLIN
                ):
                    return
                frames = [router.recv(_NOBLOCK), router.recv(_NOBLOCK)]
                while router.getsockopt(_RCVMORE):
                    frames.append(router.recv(_NOBLOCK))
                taken += len(frames[-1])
                self._frame(frames)
        except zmq.Again:  # the poll's report was stale: nothing to read after all
            return

    def _read_tcp(self, sock: zmq.Socket[bytes]) -> None:
        """Frames from authenticated tcp peers: each judged by its key's current standing."""
        gate = self._gate
        assert gate is not None
        taken = 0
        for _ in range(READ_BATCH):
            if taken >= READ_BATCH_BYTES:
                return
            try:
                frames = sock.recv_multipart(_NOBLOCK, copy=False)
            except zmq.Again:
                return
            taken += len(frames[-1])
            user_id = frames[-1].get("User-Id") if frames else ""
            principal = gate.principal(str(user_id))
            if principal is None:
                self._warnings.warn(
                    "frames from revoked keys",
                    frames[0].bytes if frames else b"",
                    f"{self.actor.name}: dropped a tcp frame from a key no longer allowed",
                )
                continue
            self._frame([f.bytes for f in frames], sock, principal)

    def _drain(self) -> None:
        inbox = self._inbox
        while inbox:
            self.actor.on_receive(inbox.popleft())  # commits when the inbox is empty

    # -- one frame -----------------------------------------------------------------------------

    def _frame(
        self, frames: list[bytes], sock: zmq.Socket[bytes] | None = None, principal: str = ""
    ) -> None:
        """One message: from the ipc socket (`principal` ""), or from tcp peer `principal`."""
        via = sock if sock is not None else self._router
        assert via is not None
        identity = frames[0]
        if len(frames) != 2:
            self._refuse(
                identity, None, MalformedFrame("expected exactly one frame per message"), via=via
            )
            return
        env: Inbound | None = None
        try:
            env = decode_request(frames[1], self._max_frame)
            request = parse_request(env.type, env.body)
            if principal and self._gate is not None:
                request = self._gate.admit(request, principal)
            if type(request) is OwnerPeers:  # exact: a parsed request is its model, no subclass
                self._told(request, identity, env, via)
                return
            owner = request.target or env.target
            if owner and owner != self.actor.name:
                raise BadRequest(
                    f"{request.type} is served by {owner!r}, not by {self.actor.name!r}",
                    reason="wrong_target",
                )
            if len(self._inbox) >= self.mailbox_limit:
                depth = len(self._inbox)
                raise Busy(
                    f"{self.actor.name} is saturated ({depth} messages waiting); retry later",
                    target=self.actor.name,
                    mailbox=depth,
                    limit=self.mailbox_limit,
                )
            reply = answer_once(self._reply_to(identity, env, via), request.type)
            self._inbox.append(Job(request, reply))
        except SubagentsError as err:
            self._refuse(identity, env.id if env else peek_id(frames[1]), err, env, via)
        except Exception as exc:  # one frame must never end the owner
            log.exception("%s: unexpected failure on a frame", self.actor.name)
            self._refuse(identity, env.id if env else None, MalformedFrame(repr(exc)), env, via)

    def _told(
        self, peers: OwnerPeers, identity: bytes, env: Inbound, via: zmq.Socket[bytes]
    ) -> None:
        """The node's `owner.peers`: the gate's new allow-list (a home's ledger owners only)."""
        if self._gate is None:
            raise BadRequest(
                f"{self.actor.name} has no tcp socket of its own (not a home's ledger owner)",
                reason="wrong_target",
            )
        self._gate.update(peers)
        self._reply_to(identity, env, via)(Ack())

    def _reply_to(self, identity: bytes, env: Inbound, via: zmq.Socket[bytes]) -> ReplyFn:
        out = self._outbound
        sender = self.actor.name

        def reply(outcome: Outcome) -> None:
            out.append((via, identity, encode_answer(env, outcome, sender)))

        return reply

    def _refuse(
        self,
        identity: bytes,
        corr: str | None,
        err: SubagentsError,
        env: Inbound | None = None,
        via: zmq.Socket[bytes] | None = None,
    ) -> None:
        self._warnings.warn(
            "refused frames",
            identity,
            f"{self.actor.name}: refused a frame: {err.code}: {err.message[:200]}",
        )
        answer = Envelope(
            type=ERROR,
            body=err.to_wire(),
            target=env.sender if env else "",
            corr=corr,
            sender=self.actor.name,
        )
        sock = via if via is not None else self._router
        assert sock is not None
        self._outbound.append((sock, identity, encode(answer)))

    def _send(self) -> None:
        out = self._outbound
        while out:
            sock, identity, frame = out.popleft()
            try:
                sock.send(identity, _SEND_MORE)
                sock.send(frame, _NOBLOCK)
            except zmq.ZMQError as exc:
                # The peer is gone (EHOSTUNREACH) or its queue is full: its timeout reports it.
                self.dropped += 1
                log.debug("%s: dropped a reply: %s", self.actor.name, exc)
