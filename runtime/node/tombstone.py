"""Tombstone: the stand-in bound where a failed owner listened (DESIGN §1).

Owns one ROUTER socket on the failed owner's endpoint and the thread that serves it: every
request is answered `OwnerUnavailable` at once, naming the owner and why it failed, so its
callers learn it at once instead of timing out while the other owners keep serving.

It never opens the owner's database, never handles, forwards or queues a request, and never
restarts the owner: the OwnerSupervisor (ownersup.py) decides when one is bound and stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import zmq

from subagents_node.actors.inbound import bound_inbound
from subagents_node.messages.codec import MAX_FRAME_BYTES, decode, encode, peek_id
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import OwnerUnavailable
from subagents_node.messages.statefiles import restrict_socket

log = logging.getLogger(__name__)


class Tombstone:
    """Bound where a failed owner listened: answers every request `OwnerUnavailable` at once,
    so its callers learn it at once instead of timing out."""

    def __init__(
        self, zctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, owner: str, reason: str
    ) -> None:
        self._zctx = zctx
        self._endpoint = endpoint
        self._owner = owner
        self._reason = reason
        # stop() writes here: the loop waits on its socket and this pipe, with no timer.
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"failed-{owner}", daemon=True)
        # Set once the socket is bound (or could not be): the owner is shown `failed` only
        # after, so a caller who saw `failed` finds the stand-in, never a missing socket.
        self._settled = threading.Event()
        self._bound = False

    def start(self, timeout: float = 5.0) -> bool:
        """Start serving; return once the endpoint is bound (True), or binding failed (False,
        logged), or after `timeout`."""
        self._thread.start()
        self._settled.wait(timeout)
        return self._bound

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\x01")
        self._thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _run(self) -> None:
        sock = self._zctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        bound_inbound(sock, MAX_FRAME_BYTES)
        try:
            sock.bind(self._endpoint)
            if self._endpoint.startswith("ipc://"):  # DESIGN §3: sockets 0600, as the owner's
                restrict_socket(self._endpoint[len("ipc://") :])
        except (zmq.ZMQError, OSError) as exc:
            log.error("cannot stand in for failed owner %s: %s", self._owner, exc)
            sock.close()
            self._settled.set()
            return
        self._bound = True
        self._settled.set()
        error = OwnerUnavailable(
            f"{self._owner} is not serving: it failed ({self._reason}); the other owners "
            "keep serving; see `subagents-node status` and `doctor`",
            owner=self._owner,
            state="failed",
            reason=self._reason[:500],
        )
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if self._wake_r in events:
                    return
                frames = sock.recv_multipart()
                if len(frames) != 2:
                    continue
                try:
                    env = decode(frames[1])
                    corr: str | None = env.id
                    target = env.sender
                except Exception:
                    corr, target = peek_id(frames[1]), ""
                answer = Envelope(
                    type=ERROR,
                    body=error.to_wire(),
                    target=target,
                    corr=corr,
                    sender=self._owner,
                )
                with contextlib.suppress(zmq.ZMQError):
                    sock.send_multipart((frames[0], encode(answer)), zmq.NOBLOCK)
        finally:
            sock.close(linger=0)
