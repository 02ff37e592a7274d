"""ZAP (RFC 27) for a CURVE server socket: the handler socket and its verdict on each handshake.

Owns nothing but the protocol: a REP socket bound on `inproc://zeromq.zap.01` in one zmq
context (libzmq asks it about every handshake on that context's CURVE servers), and the rule:
admit a CURVE key of the allow-list on our tcp domain, refuse everything else, and answer
with the key itself as the ZAP User-Id (each frame carries it, so the socket's reader maps it
to a name per frame and refuses a key revoked while its peer stays connected). Used by the
node's gateway (runtime/node/curve.py) and by a home's ledger owners (actors/peergate.py),
each from the one thread that polls it.

It never logs a secret key and never blocks: `answer` handles what is waiting and returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq
from zmq.utils import z85

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: The ZAP domain of our tcp sockets: a CURVE request from any other domain is refused.
TCP_DOMAIN = b"subagents-tcp"
#: A client public key (z85) -> its allow-listed name, or None.
NameOf = Callable[[str], "str | None"]


def make_server(sock: zmq.Socket[bytes], secret_key: str) -> None:
    """Turn a ROUTER, before it binds, into a CURVE server judged by our ZAP handler."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret_key.encode("ascii"))
    sock.setsockopt(zmq.ZAP_DOMAIN, TCP_DOMAIN)


def open_handler(zctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
    """The context's ZAP socket (bind it before any CURVE socket of the context exists)."""
    sock = zctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(ZAP_ENDPOINT)
    return sock


def answer(sock: zmq.Socket[bytes], name_of: NameOf) -> None:
    """Answer every waiting ZAP request (200 admits, 400 refuses)."""
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            status, text, user = judge(frames, name_of)
        except Exception:  # a peer's handshake must never stop the thread that polls this
            log.exception("ZAP: refused a request that could not be judged")
            status, text, user = b"400", b"invalid request", b""
        request_id = frames[1] if len(frames) > 1 else b""
        sock.send_multipart([b"1.0", request_id, status, text, user, b""])


def judge(frames: list[bytes], name_of: NameOf) -> tuple[bytes, bytes, bytes]:
    """(status, status text, User-Id) for one ZAP request."""
    if len(frames) < 6 or frames[0] != b"1.0":
        return b"400", b"malformed ZAP request", b""
    domain, address, mechanism = frames[2], frames[3].decode(errors="replace"), frames[5]
    if domain != TCP_DOMAIN:
        # Not one of our tcp sockets (ipc has no mechanism and never asks); refuse.
        return b"400", b"unknown ZAP domain", b""
    if mechanism != b"CURVE" or len(frames) != 7 or len(frames[6]) != 32:
        log.warning("tcp peer %s refused: no CURVE credentials", address)
        return b"400", b"CURVE required", b""
    key = z85.encode(frames[6]).decode("ascii")
    name = name_of(key)
    if name is None:
        log.warning("tcp peer %s refused: key %s is not allowed", address, key)
        return b"400", b"key not allowed", b""
    log.info("tcp peer %s admitted as %s", address, name)
    return b"200", b"OK", key.encode("ascii")
