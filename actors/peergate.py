"""PeerGate: who may reach a home ledger owner's own tcp socket, and as whom (DESIGN §1, §3).

Owns, in one owner process and for its loop's thread only, what the node last said about tcp
peers (`owner.peers`: each allowed key by name, the live members, the fenced names) and the
ZAP handler of the process's zmq context, which admits only an allowed key at the CURVE
handshake. Each frame from the tcp socket is then judged by `admit`: its key must still be
allowed (a key revoked while its peer stays connected is refused from its next frame on), a
fenced worker is refused everything (`membership_refused`, reason `fenced`), an operator's
request (`local_only`) is refused, and a member's name is stamped as the `host` of what it asks
(a worker can neither hide nor spoof where a slot is held). The same rule serves the home
node's own gateway (runtime/node/home.py, `stamp_host`).

Until the node's first word after a start it admits nobody (fail closed). It never writes
anything and never decides a ledger question.
"""

from __future__ import annotations

import logging

import zmq

from subagents_node.actors import zap
from subagents_node.messages.base import Request
from subagents_node.messages.errors import BadRequest, MembershipRefused
from subagents_node.messages.members import FENCED_FORGOTTEN
from subagents_node.messages.peers import OwnerPeers
from subagents_node.messages.protocol import local_only

log = logging.getLogger(__name__)


def stamp_host(request: Request, principal: str, member: bool) -> Request:
    """`request` as a tcp peer named `principal` may send it: a request with a `host` field
    names the peer (a member's name; "" for any other key), whatever the peer wrote there."""
    if "host" in type(request).model_fields:
        return request.model_copy(update={"host": principal if member else ""})
    return request


def fenced_error(name: str, reason: str) -> MembershipRefused:
    return MembershipRefused(
        f"worker {name!r} was forgotten by the home's operator ({reason}); it is fenced "
        "until it joins again (restart it with `subagents-node start --join ...`)",
        name=name,
        reason="fenced",
        # Why it is fenced: a worker told it was forgotten stops the runs whose slots the
        # home released (runtime/node/homelink.py); one a newer start fenced ("superseded")
        # leaves them to that start.
        cause=FENCED_FORGOTTEN,
        forget_reason=reason,
    )


class PeerGate:
    def __init__(self, server_secret: str) -> None:
        self._secret = server_secret
        self._names: dict[str, str] = {}  # client public key -> name
        self._members: frozenset[str] = frozenset()
        self._fenced: dict[str, str] = {}
        self._zap: zmq.Socket[bytes] | None = None
        self.told = False

    def update(self, peers: OwnerPeers) -> None:
        self._names = {key: name for name, key in peers.allowed.items()}
        self._members = frozenset(peers.members)
        self._fenced = dict(peers.fenced)
        self.told = True
        log.info(
            "tcp peers: %d keys, %d members, %d fenced",
            len(self._names),
            len(self._members),
            len(self._fenced),
        )

    # -- sockets (the loop's thread) ------------------------------------------------------------

    def open(self, zctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        self._zap = zap.open_handler(zctx)
        return self._zap

    def make_server(self, sock: zmq.Socket[bytes]) -> None:
        zap.make_server(sock, self._secret)

    def handle(self) -> None:
        if self._zap is not None:
            zap.answer(self._zap, self._names.get)

    def close(self) -> None:
        if self._zap is not None:
            self._zap.close(linger=0)
            self._zap = None

    # -- each frame -----------------------------------------------------------------------------

    def principal(self, user_id: str) -> str | None:
        """The allowed name of an authenticated key, or None once it is revoked."""
        return self._names.get(user_id)

    def admit(self, request: Request, principal: str) -> Request:
        """The request as this peer may send it, or raise why it is refused."""
        if local_only(request.type):
            raise BadRequest(
                f"{request.type} is served on the owner's ipc socket only", reason="local_only"
            )
        reason = self._fenced.get(principal)
        if reason is not None:
            raise fenced_error(principal, reason)
        return stamp_host(request, principal, principal in self._members)
