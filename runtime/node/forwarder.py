"""Forwarder: carries requests that reach the node's own sockets on to the owner processes.

Clients on the state dir's ipc sockets talk to each owner directly; what still comes to the
node is forwarded: requests from tcp peers (CURVE-authenticated by the gateway), from clients
that only know the node's address, and from the in-process transport of an embedded node.
Owns one thread, its OwnerLinks (a DEALER per owner) and a queue of requests handed over by
the gateway's thread. Replies go back through each request's reply function.

On a worker node (DESIGN §1 "Multi-host") the ledger owners are the home's: requests for
them go over one CURVE link to the home, with their own (shorter) timeout, and while the
worker's home link says the home is unreachable they fail closed at once with
`OwnerUnavailable` (reason `home_unreachable`) instead of waiting; those in flight when the
link turns unreachable are answered at once (`home_lost`: reason `home_unreachable_in_flight`,
outcome unknown). Their replies are read as a client reads a node's (a home one release newer
may add fields: actors/links.py `other_host`).

It never decides anything about a request; an owner that does not answer in time, or whose
process the node reaped with the request in flight (`owner_ended`), is answered
`OwnerUnavailable` by the links. One request that cannot be sent is answered with
its error and never ends the thread; a request handed over once it has stopped is answered
`NodeNotRunning`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable

import zmq

from subagents_node.actors.links import OwnerLinks, RemoteKeys
from subagents_node.actors.outcomes import ReplyFn
from subagents_node.messages.base import Request
from subagents_node.messages.errors import Internal, NodeNotRunning, SubagentsError
from subagents_node.node.relay import HomeState, home_refusal

log = logging.getLogger(__name__)


class Forwarder:
    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        sender: str,
        endpoint_of: Callable[[str], str],
        remote: frozenset[str] = frozenset(),
        remote_keys: RemoteKeys | None = None,
        remote_timeout_s: float = 5.0,
        home_state: HomeState = lambda: ("joined", ""),
    ) -> None:
        #: Targets served by the home node (a worker's ledgers), and the home link's state
        #: (joined, unreachable, fenced) with its reason.
        self.remote = remote
        self._home_state = home_state
        self._remote_timeout_s = remote_timeout_s
        self._queue: collections.deque[tuple[Request, str, ReplyFn]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller = zmq.Poller()
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._links = OwnerLinks(
            zctx,
            sender,
            endpoint_of,
            on_socket=self._watch,
            remote_keys=remote_keys,
            on_drop=self._poller.unregister,
            other_host=remote,
        )
        self._stopping = False
        #: Guards the wake-up pipe against a `submit` racing `stop`: once closed, its fd
        #: numbers may belong to anyone's file.
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="subagents-forward", daemon=True)
        self._thread.start()

    def submit(self, request: Request, target: str, reply: ReplyFn) -> None:
        """Queue `request` for its owner (any thread)."""
        with self._lock:
            if not self._stopping:
                self._queue.append((request, target, reply))
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"\x01")
                return
        reply(NodeNotRunning(f"the node stopped; {request.type} was not sent"))

    def owner_ended(self, endpoint: str) -> None:
        """Any thread (the node's, when it reaps an owner): what this forwarder has in flight
        to `endpoint` is answered now, not at its deadline."""
        self._links.peer_ended(endpoint)
        with self._lock:
            if not self._stopping:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"\x01")

    def home_lost(self, why: str) -> None:
        """Any thread (the home link's, when it turns unreachable): what this forwarder has in
        flight to the home is answered now, outcome unknown, not at its deadline."""
        self._links.other_host_lost(why)
        with self._lock:
            if not self._stopping:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"\x01")

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"\x01")
        self._thread.join(timeout=10)
        with self._lock:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _send_home(self, request: Request, target: str, reply: ReplyFn) -> None:
        refusal = home_refusal(self._home_state(), request, target)
        if refusal is not None:
            raise refusal
        self._links.send(request, target, reply, self._remote_timeout_s)

    def _watch(self, sock: zmq.Socket[bytes]) -> None:
        self._poller.register(sock, zmq.POLLIN)

    def _run(self) -> None:
        links = self._links
        try:
            while not self._stopping:
                wait = links.next_deadline()
                events = dict(
                    self._poller.poll(None if wait is None else max(1, int(wait * 1000) + 1))
                )
                if self._wake_r in events:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_r, 4096):
                            pass
                links.take_ended()  # before sending: not on a link to a process that is gone
                while self._queue:
                    request, target, reply = self._queue.popleft()
                    try:
                        if target in self.remote:
                            self._send_home(request, target, reply)
                        else:
                            links.send(request, target, reply)
                    except SubagentsError as err:
                        reply(err)
                    except Exception as exc:  # one request must never end the thread
                        log.exception("forwarder: cannot send %s", request.type)
                        reply(Internal(f"cannot send {request.type}: {exc!r}"[:500]))
                for sock in links.sockets:
                    if events.get(sock):
                        links.receive(sock)
                links.expire()
        finally:
            links.close()
