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
from pathlib import Path
from typing import Any

import pykka
import zmq

from subagents_node.actors.context import ActorContext
from subagents_node.actors.inbox import Job
from subagents_node.actors.links import OwnerLinks
from subagents_node.actors.loop import OwnerLoop
from subagents_node.actors.outcomes import ReplyFn
from subagents_node.actors.owner import OwnerActor
from subagents_node.client.client import Client
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Request
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
            # A fresh connection after a restart: a request written to the old one before its
            # DEALER saw it close would be lost (as a real owner's in-flight requests are).
            transport = self.client.transport
            assert isinstance(transport, ZmqTransport)
            transport.reset()
        self._started = True
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.request_stop()
            self._thread.join(timeout=10)
        self._loop = self._thread = None

    def close(self) -> None:
        self.stop()
        self.client.close()
        self._zctx.term()
