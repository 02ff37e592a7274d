"""The forwarder carries what reaches the node's own sockets (and an embedded node's
in-process clients) to the owner processes. One request it cannot send is answered with its
error and never ends its thread; once stopped, it answers instead of writing to a pipe whose
fd numbers may belong to someone else's file by now. Real node, real zmq context."""

from __future__ import annotations

import threading

import pytest
import zmq

from subagents_node.messages.base import Message
from subagents_node.messages.errors import BadRequest, NodeNotRunning, SubagentsError
from subagents_node.messages.fanout import CreateBudget
from subagents_node.messages.node import Ping, Pong
from subagents_node.node.forwarder import Forwarder
from subagents_node.node.node import Node


def test_a_value_the_wire_cannot_carry_is_refused_and_the_owners_keep_answering() -> None:
    """An integer beyond 64 bits used to raise OverflowError in the forwarder's thread, which
    ended it: every later in-process request timed out while status said all was running."""
    with Node.embedded() as node:
        client = node.client(timeout=5)
        # Built unchecked: the schema bounds it now, but the forwarder must hold whatever reaches
        # it (an in-process request is never validated on a wire).
        huge = CreateBudget.model_construct(root_run_id="r-huge", limit=2**64)
        with pytest.raises(BadRequest):
            client.ask(huge, Message)
        assert client.capacity.snapshot("s-after", 1).used == 0
        assert node.client(timeout=5).fanout.create("r-after", 3)


def test_an_in_process_client_of_a_stopped_node_is_told_so_at_once() -> None:
    with Node.embedded() as node:
        client = node.client(timeout=5)
        assert client.ask(Ping(), Pong).node_id
    for ask in (lambda: client.ask(Ping(), Pong), lambda: client.capacity.snapshot("s", 1)):
        with pytest.raises(NodeNotRunning):
            ask()


def test_a_request_handed_to_a_stopped_forwarder_is_answered_not_written_to_a_closed_pipe() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        forwarder = Forwarder(ctx, "test", lambda target: "ipc:///nonexistent/owner.sock")
        forwarder.stop()
        answered = threading.Event()
        outcomes: list[Message | SubagentsError] = []

        def reply(outcome: Message | SubagentsError) -> None:
            outcomes.append(outcome)
            answered.set()

        forwarder.submit(Ping(), "capacity", reply)
        assert answered.wait(5)
        [outcome] = outcomes
        assert isinstance(outcome, NodeNotRunning)
    finally:
        ctx.term()
