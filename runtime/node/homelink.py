"""HomeLink: a worker node's membership in its home (DESIGN §1 "Multi-host").

Owns the worker's side of membership: the join at start (refused joins are the worker's start
failing with the home's typed reason), then one thread and one CURVE connection to the home
that heartbeats at the interval the home gives, tells the forwarder the link's state (joined,
unreachable, fenced), so that admissions fail closed at once while the home cannot be reached
or has fenced this worker, and serves what the home asks of this worker (`run --on`, the
home's views of every host) on that same connection: the home reaches its workers over the
connections they opened, so a worker needs no listener of its own. The heartbeat says how many
runs and children this worker has (asked of its own run supervisor). A heartbeat refused as
`fenced` (the operator forgot this worker, or a newer start of it joined) leaves the worker
fenced: it stops forwarding and serving for good, until it is started again with `--join`.
Forgotten (the refusal's `cause`), the home released its runs' slots: the link says so
(`on_forgotten`), and the node stops those runs; fenced by a newer start, it stops nothing
(that start owns the runs now).
When the node stops cleanly while joined, the link tells the home it leaves (best effort, for
at most `LEAVE_TIMEOUT_S`), so a stop then a start of the worker (an upgrade) joins at once
instead of being refused as a live member until the heartbeat timeout has passed.

The home's answers (a join's, a heartbeat's, a leave's) are read as a client reads a node's:
fields a home one release newer added, at any depth, are dropped (`validated_reply`). An answer
in another protocol version is an UnsupportedProtocol at once (the link is `unreachable`, saying
so), and a request of the home in another version is answered with one, never dropped unread.
What the home asks stays strict (runtime/node/homeasks.py).

It never decides admissions itself, never writes a ledger, and never decides whether it serves
a request of the home (`serve`, the node's, does); it talks to the home's node only.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable

import zmq

from subagents_node.actors.ipv6 import ipv6_for
from subagents_node.client.channel import DEALER_OPTIONS
from subagents_node.client.curve import curve_client
from subagents_node.client.keys import ClientCredentials
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import validated_reply
from subagents_node.messages.codec import (
    MAX_FRAME_BYTES,
    decode,
    encode,
    in_other_version,
    mismatch,
    peek_id,
)
from subagents_node.messages.constants import VERSION
from subagents_node.messages.envelope import ERROR, REPLY, Envelope
from subagents_node.messages.errors import (
    MembershipRefused,
    SubagentsError,
    UnsupportedProtocol,
)
from subagents_node.messages.members import (
    FENCED_FORGOTTEN,
    ONE_PROTOCOL,
    MemberHeartbeat,
    MemberJoin,
    MemberLeave,
    Membership,
)
from subagents_node.messages.node import ClusterStatus

log = logging.getLogger(__name__)

#: How long a worker waits for its home to answer the join at start.
JOIN_TIMEOUT_S = 10.0
#: How often the counts a heartbeat carries are asked of the run supervisor again: a listing
#: of every active run is far more work than a beat, and `nodes` needs no fresher figure.
COUNTS_EVERY_S = 5.0
#: How long a stopping worker waits for its home to take its leave (a home that does not
#: answer in time sees the worker go silent instead, and frees its name at the timeout).
LEAVE_TIMEOUT_S = 1.0
#: Frames read per wake-up before queued answers are sent again.
_RECV_BATCH = 256
#: Why a worker whose key the home refused at the handshake is unreachable (`status`, `doctor`).
KEY_REFUSED = (
    "the home refused this worker's key at the handshake: revoked, or no longer allowed "
    "under this name?"
)

#: Sends one frame to the home on the link's connection (from any thread).
SendFn = Callable[[bytes], None]
#: Serves one request the home sent: (its envelope, how to send the answer frame).
ServeFn = Callable[[Envelope, SendFn], None]
#: Asks for (active runs, running children) and calls back with them, from any thread.
CountsFn = Callable[[Callable[[tuple[int, int]], None]], None]


def _no_counts(done: Callable[[tuple[int, int]], None]) -> None:
    done((0, 0))


def _refuse_all(request: Envelope, send: SendFn) -> None:
    err = SubagentsError(f"this worker serves its home nothing ({request.type})")
    send(encode(request.reply(ERROR, err.to_wire())))


class HomeLink:
    def __init__(
        self,
        home: str,
        credentials: ClientCredentials,
        name: str,
        on_state: Callable[[str, str], None],
        counts: CountsFn = _no_counts,
        serve: ServeFn = _refuse_all,
        on_lost: Callable[[str], None] = lambda why: None,
        on_forgotten: Callable[[str], None] = lambda why: None,
    ) -> None:
        self.home = home
        self.name = name
        self.instance = uuid.uuid4().hex
        self._credentials = credentials
        self._sender = f"worker-{name}"
        self._zctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._on_state = on_state
        #: Told once per outage that the home is lost (silent for the membership's timeout, or
        #: refusing this worker), so that what is in flight to it is answered: not at the first
        #: missed beat, which a busy home's late answer makes too (admissions then only fail
        #: closed for a moment, and what is in flight is still answered).
        self._on_lost = on_lost
        self._lost_told = False
        #: Told once, when a heartbeat's refusal says the operator forgot this worker (not a
        #: newer start of it): the home released its runs' slots, so they must stop.
        self._on_forgotten = on_forgotten
        self._last_ok_at = time.monotonic()
        self._counts = counts
        self._serve = serve
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.membership: Membership | None = None
        self.state = "joining"  # joined | unreachable | fenced
        self.reason = ""
        #: Unreachable because the home refused this worker's key at a fresh connection's
        #: handshake (a revoke): the home drops an established connection's frames silently,
        #: which alone would read as a network fault.
        self.key_refused = False
        #: The current connection's handshake events (its monitor), and whether it was refused.
        self._monitor: zmq.Socket[bytes] | None = None
        self._sock_refused = False
        self.last_ok: float | None = None
        self._counts_asked = float("-inf")
        self._counted: tuple[int, int] = (0, 0)
        #: Answers to the home's requests, queued by whichever thread has them; sent by ours.
        self._outbound: collections.deque[bytes] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pipe_open = True
        self._pipe_lock = threading.Lock()

    def join(self, timeout_s: float = JOIN_TIMEOUT_S) -> Membership:
        """Join the home (raises its typed refusal, or a NodeError when it cannot be reached)."""
        request = MemberJoin(name=self.name, instance=self.instance, version=VERSION)
        # A transport of its own: it tells a key the home refused at the handshake
        # (NotAuthenticated) from a home that does not answer.
        transport = ZmqTransport(self.home, credentials=self._credentials, sender=self._sender)
        try:
            result = transport.call(request, timeout_s)
        except UnsupportedProtocol as exc:  # worded for a worker, not for a client
            raise mismatch(exc, f"home {self.home}", "this worker", ONE_PROTOCOL) from None
        finally:
            transport.close()
        assert isinstance(result, Membership)
        self.membership = result
        self.state, self.last_ok = "joined", time.time()
        self._last_ok_at = time.monotonic()
        log.info("joined home %s as %s (generation %d)", self.home, self.name, result.generation)
        return result

    def start(self, zctx: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        self._zctx = zctx
        self._thread = threading.Thread(target=self._run, name="subagents-home", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._pipe_lock:  # a late answer's wake-up must not write to a reused number
            self._pipe_open = False
            os.close(self._wake_r)
            os.close(self._wake_w)

    def status(self) -> ClusterStatus:
        member = self.membership
        return ClusterStatus(
            role="worker",
            name=self.name,
            home=self.home,
            state=self.state,
            reason=self.reason,
            generation=member.generation if member else 0,
            last_heartbeat_ok=self.last_ok,
            key_refused=self.key_refused,
        )

    # -- any thread ------------------------------------------------------------------------

    def _send_later(self, frame: bytes) -> None:
        self._outbound.append(frame)
        self._wake()

    def _wake(self) -> None:
        with self._pipe_lock, contextlib.suppress(BlockingIOError):  # full: one is pending
            if self._pipe_open:
                os.write(self._wake_w, b"\x01")

    def _counted_now(self, counts: tuple[int, int]) -> None:
        self._counted = counts  # one tuple, replaced whole

    # -- the link's thread -------------------------------------------------------------------

    def _open(self, zctx: zmq.Context[zmq.Socket[bytes]], poller: zmq.Poller) -> zmq.Socket[bytes]:
        """A fresh connection to the home, polled, with its handshake events watched."""
        sock = zctx.socket(zmq.DEALER)
        for option, value in DEALER_OPTIONS:
            sock.setsockopt(option, value)
        ipv6_for(sock, self.home)  # the home may be at an IPv6 address
        curve_client(sock, self._credentials)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._sock_refused = False
        sock.connect(self.home)
        poller.register(sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        return sock

    def _close(self, sock: zmq.Socket[bytes], poller: zmq.Poller | None) -> None:
        monitor, self._monitor = self._monitor, None
        if poller is not None:
            poller.unregister(sock)
            if monitor is not None:
                poller.unregister(monitor)
        if monitor is not None:
            sock.disable_monitor()
            monitor.close(linger=0)
        sock.close(linger=0)

    def _handshakes(self) -> None:
        """Read the connection's handshake events: a refusal (the home's ZAP denied this key)
        makes the link unreachable for that reason at once, not a silent heartbeat's."""
        # Here, not at the top: zmq.utils.monitor imports zmq.asyncio (all of asyncio).
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor is not None:
            try:
                event = int(recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"])
            except zmq.Again:
                return
            if event & zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._sock_refused = True
                self._set("unreachable", KEY_REFUSED, key_refused=True)

    def _run(self) -> None:
        member = self.membership
        if member is None:
            return
        zctx = self._zctx or zmq.Context.instance()
        poller = zmq.Poller()
        sock = self._open(zctx, poller)
        poller.register(self._wake_r, zmq.POLLIN)
        # The first beat goes out at once: it is what tells the home which connection
        # reaches this worker.
        next_beat = time.monotonic()
        beat: tuple[str, float] | None = None  # (message id, answer deadline)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if beat is not None and now >= beat[1]:
                    if self._sock_refused:
                        self._set("unreachable", KEY_REFUSED, key_refused=True)
                    else:
                        silent = f"no answer to a heartbeat in {member.heartbeat_s}s"
                        self._set("unreachable", silent)
                    # The next beat goes out on a fresh connection: one that stalled in a
                    # partition would otherwise wait out TCP's retransmission backoff after
                    # the link is back; and a home that revoked this worker's key drops an
                    # established connection's frames unread, but refuses a new one's
                    # handshake, which says why (`_handshakes`).
                    self._close(sock, poller)
                    sock = self._open(zctx, poller)
                    beat = None
                self._lost_if_silent(member)
                if beat is None and now >= next_beat:
                    beat = (self._send_beat(sock, member), now + member.heartbeat_s)
                    next_beat = now + member.heartbeat_s
                wake_at = beat[1] if beat is not None else next_beat
                events = dict(poller.poll(max(0, int((wake_at - time.monotonic()) * 1000)) + 1))
                if self._wake_r in events:
                    self._drain_wake()
                if self._monitor is not None and events.get(self._monitor):
                    self._handshakes()
                if events.get(sock):
                    for env in self._receive(sock):
                        if beat is not None and env.corr == beat[0]:
                            beat = None
                            member = self._answered(env) or member
                            if self.state == "fenced":
                                return
                        elif env.corr is None and env.type not in (REPLY, ERROR):
                            self._serve(env, self._send_later)
                self._flush(sock)
            self._flush(sock)
            if self.state == "joined":
                self._leave(sock, member)
        finally:
            self._flush(sock)
            self._close(sock, None)

    def _send_beat(self, sock: zmq.Socket[bytes], member: Membership) -> str:
        now = time.monotonic()
        if now - self._counts_asked >= COUNTS_EVERY_S:
            self._counts_asked = now
            with contextlib.suppress(SubagentsError):  # restarting: the last counts stand
                self._counts(self._counted_now)
        runs, children = self._counted
        request = MemberHeartbeat(
            name=self.name,
            instance=self.instance,
            generation=member.generation,
            runs=runs,
            children=children,
        )
        env = Envelope(type=request.type, body=request.to_body(), sender=self._sender)
        with contextlib.suppress(zmq.Again):  # not connected yet: the beat's deadline says so
            sock.send(encode(env), zmq.NOBLOCK)
        return env.id

    def _leave(self, sock: zmq.Socket[bytes], member: Membership) -> None:
        """Tell the home this process stops, and wait (at most LEAVE_TIMEOUT_S) for its word;
        what else arrives meanwhile is dropped (the home times out what it asked)."""
        request = MemberLeave(name=self.name, instance=self.instance, generation=member.generation)
        env = Envelope(type=request.type, body=request.to_body(), sender=self._sender)
        try:
            sock.send(encode(env), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("home %s: could not send this worker's leave: %s", self.home, exc)
            return
        deadline = time.monotonic() + LEAVE_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
            answer = next((got for got in self._receive(sock) if got.corr == env.id), None)
            if answer is not None:
                if answer.type == ERROR:
                    refusal = SubagentsError.from_wire(answer.body).message
                    log.warning("home %s refused this worker's leave: %s", self.home, refusal)
                else:
                    log.info("left home %s as %s", self.home, self.name)
                return
        log.warning("home %s did not take this worker's leave in %gs", self.home, LEAVE_TIMEOUT_S)

    def _receive(self, sock: zmq.Socket[bytes]) -> list[Envelope]:
        got: list[Envelope] = []
        for _ in range(_RECV_BATCH):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                got.append(decode(frame, MAX_FRAME_BYTES))
            except UnsupportedProtocol as err:
                self._in_other_version(frame, err, got)
            except SubagentsError as err:  # the home is trusted, but a bad frame is no crash
                log.warning("home link: dropped a frame from the home: %s", err.message)
        return got

    def _in_other_version(
        self, frame: bytes, refused: UnsupportedProtocol, got: list[Envelope]
    ) -> None:
        """A frame of a home of another release: an answer is read as the UnsupportedProtocol
        its request gets (added to `got`); a request of the home is answered with one."""
        answer = in_other_version(frame, refused, f"home {self.home}", "this worker", ONE_PROTOCOL)
        if answer is not None:
            got.append(Envelope(type=answer.type, body=answer.body, corr=answer.corr))
            return
        asked = peek_id(frame)
        log.warning("home link: the home asked in another protocol version: %s", refused.message)
        if asked is not None:
            refusal = Envelope(type=ERROR, body=refused.to_wire(), corr=asked, sender=self._sender)
            self._send_later(encode(refusal))

    def _answered(self, env: Envelope) -> Membership | None:
        """A heartbeat's answer: the membership it renews, or the refusal it is."""
        if env.type == ERROR:
            err = SubagentsError.from_wire(env.body)
            if isinstance(err, MembershipRefused):
                self._set("fenced", err.message)
                log.error("home %s fenced this worker: %s", self.home, err.message)
                if err.details.get("cause") == FENCED_FORGOTTEN:
                    self._on_forgotten(str(err.details.get("forget_reason") or ""))
            else:
                self._set("unreachable", err.message)
            return None
        try:  # a newer home's answer may hold fields this worker does not know
            renewed = validated_reply(Membership, env.body)
        except ValueError:
            self._set("unreachable", "the home answered a heartbeat with something else")
            return None
        self.membership = renewed
        self.last_ok = time.time()
        self._last_ok_at = time.monotonic()
        self._set("joined", "")
        return renewed

    def _flush(self, sock: zmq.Socket[bytes]) -> None:
        out = self._outbound
        while out:
            frame = out.popleft()
            try:
                sock.send(frame, zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # the home is gone or slow: it times the request out
                log.warning("home link: dropped an answer to the home: %s", exc)

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _set(self, state: str, reason: str, key_refused: bool = False) -> None:
        if state != self.state or key_refused != self.key_refused:
            log.warning("home %s: %s -> %s %s", self.home, self.state, state, reason)
        self.state, self.reason, self.key_refused = state, reason, key_refused
        self._on_state(state, reason)
        if state == "joined":
            self._lost_told = False
        elif state == "fenced" or key_refused:
            self._lost(reason)

    def _lost_if_silent(self, member: Membership) -> None:
        """The home silent for the membership's timeout (as long as the home waits before it
        calls this worker unreachable): it is lost, not slow."""
        silent = time.monotonic() - self._last_ok_at
        if self.state == "unreachable" and silent >= member.timeout_s:
            self._lost(f"no answer from the home for {silent:.1f}s")

    def _lost(self, why: str) -> None:
        if not self._lost_told:
            self._lost_told = True
            self._on_lost(why)
