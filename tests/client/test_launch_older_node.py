"""A client one release newer than its node (docs/api.md, "Launching again"): the launch id the
client chooses for each launch is a field the older node does not know, which it refuses (it
is strict about requests) and so changes nothing. The client then sends that launch once more
without the id, as the older release's clients did, on the sync and the asyncio client; an id
the caller set itself is never dropped.

The older node is a real node behind a ROUTER in this test that refuses, exactly as the older
release's node would, every `runs.launch` carrying a `launch_id`, and passes everything else
on. Real ZeroMQ sockets, a real node process, real children.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

from subagents_node import AsyncClient
from subagents_node.client.client import connect
from subagents_node.messages.envelope import ERROR
from subagents_node.messages.errors import BadRequest
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.runs import launch_context


def older_refusal() -> dict[str, object]:
    """What a node that knows no `launch_id` answers a launch that carries one."""
    return BadRequest(
        "invalid runs.launch request: launch_id: Extra inputs are not permitted",
        reason="schema",
        field="launch_id",
        errors=[{"loc": "launch_id", "msg": "Extra inputs are not permitted"}],
        error_count=1,
    ).to_wire()


class OlderNode:
    """A ROUTER in front of `node` that refuses each launch with a launch id (counted in
    `refused`) and passes every other request on; it records each launch it passed on."""

    def __init__(self, node: NodeProcess) -> None:
        self.refused = 0
        self.passed_launches: list[dict[str, object]] = []
        self._dir = Path(tempfile.mkdtemp(prefix="sa-older-", dir="/tmp"))
        self.address = f"ipc://{self._dir / 'older.sock'}"
        self._zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._front = self._zctx.socket(zmq.ROUTER)
        self._front.setsockopt(zmq.LINGER, 0)
        self._front.bind(self.address)
        self._back = self._zctx.socket(zmq.DEALER)
        self._back.setsockopt(zmq.LINGER, 0)
        self._back.connect(node.address)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="older-node")
        self._thread.start()

    def _serve(self) -> None:
        peers: dict[str, bytes] = {}
        poller = zmq.Poller()
        poller.register(self._front, zmq.POLLIN)
        poller.register(self._back, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(100))  # the stop flag is looked at between polls
            if self._front in ready:
                peer, frame = self._front.recv_multipart()
                raw = msgpack.unpackb(frame)
                if raw["type"] == "runs.launch" and "launch_id" in raw["body"]:
                    self.refused += 1
                    answer = {"v": raw["v"], "type": ERROR, "body": older_refusal()}
                    answer |= {"id": f"older-{raw['id']}", "corr": raw["id"], "sender": ""}
                    answer |= {"target": raw.get("sender", ""), "host": ""}
                    self._front.send_multipart([peer, msgpack.packb(answer)])
                    continue
                if raw["type"] == "runs.launch":
                    self.passed_launches.append(raw["body"])
                peers[raw["id"]] = peer
                self._back.send(frame)
            if self._back in ready:
                reply = self._back.recv()
                corr = msgpack.unpackb(reply)["corr"]
                self._front.send_multipart([peers.pop(corr), reply])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._front.close()
        self._back.close()
        self._zctx.term()
        for leftover in self._dir.iterdir():
            leftover.unlink()
        self._dir.rmdir()


@pytest.fixture
def older(node: NodeProcess) -> Iterator[OlderNode]:
    proxy = OlderNode(node)
    yield proxy
    proxy.close()


def test_a_launch_refused_for_its_launch_id_by_an_older_node_is_sent_once_more_without_it(
    older: OlderNode, agents: Path
) -> None:
    launch = launch_context(agents).single("echo", "from a newer client", True, None)
    assert launch.launch_id is None

    with connect(older.address, timeout=10) as client:
        run = client.runs.launch(launch)
        done = client.runs.wait(run.run_id, timeout=20)

    assert (done.state, done.output) == ("complete", "from a newer client")
    assert older.refused == 1  # the id this client chose, refused once
    assert [body.get("launch_id") for body in older.passed_launches] == [None]


def test_the_asyncio_client_launches_on_an_older_node_the_same_way(
    older: OlderNode, agents: Path
) -> None:
    launch = launch_context(agents).single("echo", "from an asyncio client", True, None)

    async def go() -> str:
        async with AsyncClient(older.address, timeout=10) as client:
            run = await client.runs.launch(launch)
            return (await client.runs.wait(run.run_id, timeout=20)).state

    assert asyncio.run(go()) == "complete"
    assert older.refused == 1 and len(older.passed_launches) == 1


def test_a_launch_id_the_caller_set_is_never_dropped_for_an_older_node(
    older: OlderNode, agents: Path
) -> None:
    launch = launch_context(agents).single("echo", "keep my id", True, None)
    chosen = launch.model_copy(update={"launch_id": "my-launch-1"})

    with connect(older.address, timeout=10) as client, pytest.raises(BadRequest) as refused:
        client.runs.launch(chosen)

    assert refused.value.details["field"] == "launch_id"
    assert older.refused == 1 and older.passed_launches == []
