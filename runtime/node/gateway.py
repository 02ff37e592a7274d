"""Gateway: the one I/O thread that owns the node's ROUTER socket(s).

Owns the sockets, the outbound reply queue and the wake-up pipe. It decodes and validates every
inbound frame once (size cap, msgpack, envelope, protocol version, body schema), answers a bad
frame with a typed error reply, and hands good requests to the Dispatcher. Actor threads never
touch a socket: their replies are encoded in their own thread, appended to a deque, and the
I/O thread is woken through a pipe it polls beside the sockets.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Sequence

import zmq

from subagents_node.actors.owner import Outcome, ReplyFn
from subagents_node.messages.codec import MAX_FRAME_BYTES, decode, encode, peek_id
from subagents_node.messages.envelope import ERROR, REPLY, Envelope
from subagents_node.messages.errors import MalformedFrame, SubagentsError
from subagents_node.messages.protocol import parse_request
from subagents_node.node.dispatch import Dispatcher

log = logging.getLogger(__name__)

#: Frames handled per wake-up before the gateway sends pending replies again (fairness).
_RECV_BATCH = 256
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
    ) -> None:
        self._zctx = zctx
        self.endpoints = list(endpoints)
        self._dispatcher = dispatcher
        self._node_id = node_id
        self._max_frame = max_frame
        self._hwm = hwm
        self._outbound: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_pending = False
        self._stopping = False
        self._ready = threading.Event()
        self._bind_error: BaseException | None = None
        self.bound: list[str] = []
        self.dropped = 0
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

    def reply_to(self, identity: bytes, request: Envelope) -> ReplyFn:
        def reply(outcome: Outcome) -> None:
            if isinstance(outcome, SubagentsError):
                env = request.reply(ERROR, outcome.to_wire(), sender=self._node_id)
            else:
                env = request.reply(REPLY, outcome.model_dump(mode="python"), self._node_id)
            self._outbound.append((identity, encode(env)))
            if not self._wake_pending:
                self._wake_pending = True
                self._wake()

        return reply

    def _wake(self) -> None:
        # A full pipe means a wake-up is already pending.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\x01")

    # -- the I/O thread -----------------------------------------------------------------------

    def _bind(self) -> zmq.Socket[bytes]:
        sock = self._zctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self._hwm)
        sock.setsockopt(zmq.RCVHWM, self._hwm)
        # zmq drops (and disconnects) only grossly oversized frames; anything up to 4x the cap
        # reaches us so that we can answer it with a typed FrameTooLarge.
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_frame * 4)
        try:
            for endpoint in self.endpoints:
                sock.bind(endpoint)
                self.bound.append(str(sock.getsockopt_string(zmq.LAST_ENDPOINT)))
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        return sock

    def _run(self) -> None:
        try:
            sock = self._bind()
        except BaseException as exc:
            self._bind_error = exc
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._stopping:
                events = dict(poller.poll())
                if self._wake_r in events:
                    self._drain_wake()
                if events.get(sock):
                    self._receive(sock)
                self._send(sock)
        finally:
            self._send(sock)
            # A short linger: the last replies (a shim's acknowledgement, which it would
            # otherwise resend to a node that is gone) reach their peers before the close.
            sock.close(linger=_CLOSE_LINGER_MS)

    def _drain_wake(self) -> None:
        # Empty the pipe first, then clear the flag: the other order loses a wake-up when a
        # reply thread sets the flag and writes between the two steps (the byte is drained, the
        # flag stays set, and later replies wait for an unrelated inbound frame).
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._wake_pending = False

    def _receive(self, sock: zmq.Socket[bytes]) -> None:
        for _ in range(_RECV_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            self._handle(frames)
            self._send(sock)

    def _handle(self, frames: list[bytes]) -> None:
        identity = frames[0]
        if len(frames) != 2:
            self._refuse(identity, None, MalformedFrame("expected exactly one frame per message"))
            return
        frame = frames[1]
        env: Envelope | None = None
        try:
            env = decode(frame, self._max_frame)
            request = parse_request(env.type, env.body)
            self._dispatcher.dispatch(request, env.target, self.reply_to(identity, env))
        except SubagentsError as err:
            self._refuse(identity, env.id if env else peek_id(frame), err, env)
        except Exception as exc:  # never let one frame take the node down
            log.exception("gateway: unexpected failure on a frame")
            self._refuse(identity, env.id if env else None, MalformedFrame(repr(exc)), env)

    def _refuse(
        self,
        identity: bytes,
        corr: str | None,
        err: SubagentsError,
        env: Envelope | None = None,
    ) -> None:
        log.warning("gateway: refused a frame: %s: %s", err.code, err.message)
        reply = Envelope(
            type=ERROR,
            body=err.to_wire(),
            target=env.sender if env else "",
            corr=corr,
            sender=self._node_id,
        )
        self._outbound.append((identity, encode(reply)))

    def _send(self, sock: zmq.Socket[bytes]) -> None:
        out = self._outbound
        while out:
            identity, frame = out.popleft()
            try:
                sock.send_multipart((identity, frame), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                # EHOSTUNREACH: the peer is gone; EAGAIN: its queue is full. Either way the
                # reply cannot be delivered now; the caller's timeout reports it.
                self.dropped += 1
                log.warning("gateway: dropped a reply: %s", exc)
