"""A node one release apart, made of a real node: a ROUTER in the test's process that passes
each request on to the node and each reply back, and may answer a request itself (as a node of
another release would refuse it) or rewrite a reply (as a newer node's would read).

Real ZeroMQ sockets on one thread, until `close`; used by the client compatibility tests
(tests/client/test_newer_node_replies.py, test_launch_older_node.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from tests.support.nodes import NodeProcess, short_dir

#: (reply type, body) -> the body the client gets.
Rewrite = Callable[[str, dict[str, Any]], dict[str, Any]]
#: A request as sent (its envelope as a map) -> the envelope to answer it with, or None to pass
#: it on to the node.
Intercept = Callable[[dict[str, Any]], dict[str, Any] | None]


def unchanged(type_: str, body: dict[str, Any]) -> dict[str, Any]:
    del type_
    return body


def passed_on(request: dict[str, Any]) -> dict[str, Any] | None:
    del request
    return None


class ProxyNode:
    """Serves `address` in front of `node`: `intercept` may answer a request itself, every other
    one goes on to the node; its reply's body is rewritten by `rewrite`, and carries protocol
    version `v` when one is given (None: the node's own)."""

    def __init__(
        self,
        node: NodeProcess,
        rewrite: Rewrite = unchanged,
        v: int | None = None,
        intercept: Intercept = passed_on,
    ) -> None:
        self.rewrite = rewrite
        self.v = v
        self.intercept = intercept
        self._dir = short_dir("sa-proxy-")
        self.address = f"ipc://{self._dir / 'proxy.sock'}"
        self._zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._front = self._zctx.socket(zmq.ROUTER)
        self._front.setsockopt(zmq.LINGER, 0)
        self._front.bind(self.address)
        self._back = self._zctx.socket(zmq.DEALER)
        self._back.setsockopt(zmq.LINGER, 0)
        self._back.connect(node.address)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="proxy-node")
        self._thread.start()

    def _serve(self) -> None:
        peers: dict[str, bytes] = {}  # request id -> the client's ROUTER identity
        poller = zmq.Poller()
        poller.register(self._front, zmq.POLLIN)
        poller.register(self._back, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(100))  # the stop flag is looked at between polls
            if self._front in ready:
                peer, frame = self._front.recv_multipart()
                request = msgpack.unpackb(frame)
                answer = self.intercept(request)
                if answer is not None:
                    self._front.send_multipart([peer, msgpack.packb(answer)])
                else:
                    peers[request["id"]] = peer
                    self._back.send(frame)
            if self._back in ready:
                raw = msgpack.unpackb(self._back.recv())
                raw["body"] = self.rewrite(raw["type"], raw["body"])
                if self.v is not None:
                    raw["v"] = self.v
                self._front.send_multipart([peers.pop(raw["corr"]), msgpack.packb(raw)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._front.close()
        self._back.close()
        self._zctx.term()
        for leftover in self._dir.iterdir():
            leftover.unlink()
        self._dir.rmdir()
