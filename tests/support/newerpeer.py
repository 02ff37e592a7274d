"""A home and a worker of "different releases": a real CURVE proxy between a real worker node
and a real home node that rewrites the replies going each way (multi-host compatibility tests).

What it owns: one thread, a front CURVE server with the home's own keys on a base port and the
three ports above it (the home's node and its ledger owners), and, for each connection a worker
opens to it, a CURVE client to the matching home port with the worker's own keys (so the home
sees that worker's key, and reaches the worker over the connection it opened, as without the
proxy). Requests pass as they are (the home's may be given another protocol version:
`asks_to_worker`); every reply and error (a map with a `corr`) is rewritten:
toward the worker by `to_worker`, toward the home by `to_home` (`grown` adds a field to every
map, at the top and nested; a `v` replaced says another protocol version). The home's answer
to a join or heartbeat names its owners' ports: they are mapped onto the proxy's, so that the
worker's admissions pass through it too. No ZAP handler runs in its context: the home behind
it authenticates the worker's key.

It never sleeps: the thread polls its sockets with a short timeout only to see its stop flag.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from subagents_node.client.keys import Keypair

#: The field a later release adds, in every map of a reply (top level and nested).
ADDED = "added_in_a_later_release"
#: Maps keyed by data, not by field names (a later release adds entries, not fields, there).
KEYED = frozenset({"owner_ports", "data"})

#: Rewrites one reply's raw envelope map (header and body) in place of the original.
Rewrite = Callable[[dict[str, Any]], dict[str, Any]]


def grown(value: Any, keyed: bool = False) -> Any:
    """`value` with ADDED in every map that is a model's, at every depth."""
    if isinstance(value, dict):
        inner = {k: grown(v, keyed=k in KEYED) for k, v in value.items()}
        return inner if keyed else {**inner, ADDED: {"nested": [1, "two"]}}
    if isinstance(value, list):
        return [grown(item) for item in value]
    return value


def as_sent(raw: dict[str, Any]) -> dict[str, Any]:
    return raw


def grow(raw: dict[str, Any]) -> dict[str, Any]:
    """A reply as a node one release newer sends it: ADDED in every map of its body."""
    return {**raw, "body": grown(raw.get("body", {}))}


def in_version(v: int, then: Rewrite = as_sent) -> Rewrite:
    """`then`, and the reply carries protocol version `v`."""
    return lambda raw: {**then(raw), "v": v}


class NewerPeer:
    """The proxy: `endpoint` is what the worker joins; the home listens at `home_port`."""

    def __init__(self, home_key: Keypair, worker_key: Keypair, home_port: int, port: int) -> None:
        self.endpoint = f"tcp://127.0.0.1:{port}"
        #: How replies are rewritten on their way to the worker and to the home (swappable
        #: while it runs: one attribute, read once per reply).
        self.to_worker: Rewrite = as_sent
        self.to_home: Rewrite = as_sent
        #: How the home's own requests to the worker are rewritten (as sent, unless a test
        #: has the home speak another protocol version).
        self.asks_to_worker: Rewrite = as_sent
        self._home_key = home_key
        self._worker_key = worker_key
        self._offset = port - home_port
        self._zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._fronts: list[zmq.Socket[bytes]] = []
        for step in range(4):
            front = self._zctx.socket(zmq.ROUTER)
            front.setsockopt(zmq.LINGER, 0)
            front.curve_secretkey = home_key.secret.encode("ascii")
            front.curve_publickey = home_key.public.encode("ascii")
            front.curve_server = True
            front.bind(f"tcp://127.0.0.1:{port + step}")
            self._fronts.append(front)
        self._home_port = home_port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="newer-peer", daemon=True)
        self._thread.start()

    def _back(self, step: int) -> zmq.Socket[bytes]:
        back = self._zctx.socket(zmq.DEALER)
        back.setsockopt(zmq.LINGER, 0)
        back.curve_secretkey = self._worker_key.secret.encode("ascii")
        back.curve_publickey = self._worker_key.public.encode("ascii")
        back.curve_serverkey = self._home_key.public.encode("ascii")
        back.connect(f"tcp://127.0.0.1:{self._home_port + step}")
        return back

    def _serve(self) -> None:
        poller = zmq.Poller()
        for front in self._fronts:
            poller.register(front, zmq.POLLIN)
        backs: dict[tuple[int, bytes], zmq.Socket[bytes]] = {}
        peers: dict[zmq.Socket[bytes], tuple[zmq.Socket[bytes], bytes]] = {}
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(100):  # the stop flag is looked at between polls
                    if sock in peers:  # from the home
                        front, identity = peers[sock]
                        frame = self._rewritten(sock.recv(), self.to_worker, toward_worker=True)
                        front.send_multipart([identity, frame])
                        continue
                    step = self._fronts.index(sock)
                    identity, frame = sock.recv_multipart()
                    back = backs.get((step, identity))
                    if back is None:
                        back = backs[(step, identity)] = self._back(step)
                        peers[back] = (sock, identity)
                        poller.register(back, zmq.POLLIN)
                    back.send(self._rewritten(frame, self.to_home, toward_worker=False))
        finally:
            for back in backs.values():
                back.close(linger=0)

    def _rewritten(self, frame: bytes, rewrite: Rewrite, toward_worker: bool) -> bytes:
        raw = msgpack.unpackb(frame)
        if not isinstance(raw, dict):
            return frame
        if raw.get("corr") is None:  # a request: as it was sent, unless the home's is rewritten
            asked: bytes = msgpack.packb(self.asks_to_worker(raw)) if toward_worker else frame
            return asked
        body = raw.get("body")
        if toward_worker and isinstance(body, dict) and isinstance(body.get("owner_ports"), dict):
            ports = body["owner_ports"]
            raw["body"] = {**body, "owner_ports": {n: p + self._offset for n, p in ports.items()}}
        packed: bytes = msgpack.packb(rewrite(raw))
        return packed

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for front in self._fronts:
            front.close(linger=0)
        self._zctx.term()
