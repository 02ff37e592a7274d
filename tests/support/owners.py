"""Owners hosted for unit tests of their logic, without a node.

- `LoopHost`: one owner on the same single-threaded loop an owner process runs
  (actors/loop.py), in a thread of the test process, on its own ipc socket: the tests reach it
  with the real client over a real socket, and inject a manual clock through its context.
- `thread_route`: a route that hands a request to an owner on a pykka thread, for the few
  tests that drive an owner's inbox directly.

A node never does either: its owners are processes (runtime/node/ownersup.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pykka
import zmq

from subagents_node.actors.links import OwnerLinks
from subagents_node.actors.loop import OwnerLoop
from subagents_node.actors.outcomes import ReplyFn
from subagents_node.actors.owner import ActorContext, Job, OwnerActor
from subagents_node.client.client import Client
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Request
from subagents_node.messages.errors import NodeTimeout, SubagentsError
from subagents_node.messages.node import Ping
from subagents_node.node.dispatch import Route


def thread_route(ref: pykka.ActorRef[Any]) -> Route:
    def route(request: Request, target: str, reply: ReplyFn) -> None:
        ref.tell(Job(request, reply))

    return route


class LoopHost:
    """`cls` served by an OwnerLoop on `ipc://<directory>/<name>.sock`; restartable."""

    def __init__(self, cls: type[OwnerActor], ctx: ActorContext, directory: Path) -> None:
        self.cls = cls
        self.ctx = ctx
        self.endpoint = f"ipc://{directory / (cls.name + '.sock')}"
        self._zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._loop: OwnerLoop | None = None
        self._thread: threading.Thread | None = None
        self.client = Client(ZmqTransport(self.endpoint), timeout=10)
        self._started = False

    def start(self) -> LoopHost:
        links = OwnerLinks(self._zctx, self.cls.name, lambda target: self.endpoint)
        actor = self.cls(dataclasses.replace(self.ctx, dispatch=links.send))
        loop = OwnerLoop(actor, self._zctx, self.endpoint, links, mailbox_limit=1 << 20)
        loop.bind()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=loop.run, kwargs={"on_ready": ready.set}, name=f"loop-{self.cls.name}"
        )
        self._thread.start()
        assert ready.wait(10), f"{self.cls.name} did not start"
        self._loop = loop
        if self._started:
            self._reconnected()
        self._started = True
        return self

    def _reconnected(self) -> None:
        """After a restart, until the client's connection reaches the new loop: a request
        written to the old connection before its DEALER saw it close is lost (as a real
        owner's in-flight requests are), and the tests of owner logic want none lost. Any
        answer proves the new connection (`node.ping` is refused by an owner, with a reply)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.client.transport.call(Ping(), timeout=0.3)
            except NodeTimeout:
                continue
            except SubagentsError:
                return
        raise AssertionError(f"{self.cls.name} unreachable after its restart")

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.request_stop()
            self._thread.join(timeout=10)
        self._loop = self._thread = None

    def close(self) -> None:
        self.stop()
        self.client.close()
        self._zctx.term()
