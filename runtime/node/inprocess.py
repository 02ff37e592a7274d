"""InProcessTransport: the transport seam for a client in the node's own process.

It hands request models to the node's Dispatcher (no encoding) and waits for the outcome, so an
embedded node's client and the fast unit tests exercise the same owners as a socket would. It
lives on the node side because it needs the Dispatcher; the client side never imports it.

In a forked child the node's threads are not there (nothing would ever answer: every call
waited out its timeout, and `ping` was answered by the child as if it were the node), so a
child's calls go over the node's socket instead, through a transport of its own (offering the
node's own tcp keys, when its socket is tcp: the child has them from the fork). A pickled
client, in a process that is no fork, gets no such keys: it needs its own, as any other.
"""

from __future__ import annotations

import os
import threading

from subagents_node.client.channel import closed_error
from subagents_node.client.keys import ClientCredentials
from subagents_node.client.transport import Transport, ZmqTransport
from subagents_node.messages.base import Message, Request
from subagents_node.messages.errors import NodeTimeout, SubagentsError
from subagents_node.node.dispatch import Dispatcher


class _Box:
    __slots__ = ("_event", "value")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.value: Message | SubagentsError | None = None

    def set(self, value: Message | SubagentsError) -> None:
        """The first outcome wins: a close's `closed_error`, or the owner's reply."""
        if not self._event.is_set():
            self.value = value
            self._event.set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


class InProcessTransport:
    def __init__(
        self, dispatcher: Dispatcher, address: str, credentials: ClientCredentials | None = None
    ) -> None:
        self._dispatcher = dispatcher
        self.address = address
        #: The node's own tcp keys (a tcp `address`), for the socket a forked child calls over.
        self._credentials = credentials
        self._closed = False
        #: The calls waiting now, each ended by `close()` at once (a set: any thread may call).
        self._waiting: set[_Box] = set()
        #: Reentrant: a signal handler's close() may run while its thread holds it.
        self._lock = threading.RLock()
        self._pid = os.getpid()
        #: In a forked child: the socket transport its calls go through instead.
        self._forked: Transport | None = None

    def call(self, request: Request, timeout: float, target: str = "") -> Message:
        if self._closed:  # the node stopped (it closes its in-process clients) or the caller did
            raise closed_error(self.address)
        if os.getpid() != self._pid:
            if self._forked is None:
                self._forked = ZmqTransport(self.address, credentials=self._credentials)
            return self._forked.call(request, timeout, target)
        box = _Box()
        with self._lock:
            self._waiting.add(box)
        try:
            self._dispatcher.dispatch(request, target or request.target, box.set)
            if not box.wait(timeout):
                raise NodeTimeout(
                    f"no reply to {request.type} within {timeout:g}s",
                    address=self.address,
                    timeout_s=timeout,
                )
        finally:
            with self._lock:
                self._waiting.discard(box)
        assert box.value is not None
        if isinstance(box.value, SubagentsError):
            raise box.value
        return box.value

    def __reduce__(self) -> tuple[type[ZmqTransport], tuple[str]]:
        """In another process the node's threads are not there: its calls go over the node's
        socket, as in a forked child, but never with the node's own keys (their secret stays
        in this process and its forks)."""
        return (ZmqTransport, (self.address,))

    def close(self) -> None:
        """Every later call and every call waiting now raise `closed_error`, at once (a call
        in flight as its node stopped waited for the owners' stop, then said `OwnerUnavailable`
        "abandoned: the caller stopped"), as calls of a closed socket client do."""
        self._closed = True
        with self._lock:
            waiting, self._waiting = self._waiting, set()
        for box in waiting:
            box.set(closed_error(self.address))
        if self._forked is not None and os.getpid() != self._pid:
            self._forked.close()
