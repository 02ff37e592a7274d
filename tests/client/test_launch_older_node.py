"""A client one release newer than its node (docs/api.md, "Launching again"): the launch id the
client chooses for each launch is a field the older node does not know, which it refuses (it
is strict about requests) and so changes nothing. The client then sends that launch once more
without the id, as the older release's clients did, on the sync and the asyncio client; an id
the caller set itself is never dropped.

The older node is a real node behind a ROUTER in this test that refuses, exactly as the older
release's node would, every `runs.launch` carrying a `launch_id`, and passes everything else
on (tests/support/nodeproxy.py). Real ZeroMQ sockets, a real node process, real children.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from subagents_node import AsyncClient
from subagents_node.client.client import connect
from subagents_node.messages.envelope import ERROR
from subagents_node.messages.errors import BadRequest
from tests.support.nodeproxy import ProxyNode
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
    """`node` behind a ProxyNode that refuses each launch with a launch id (counted in
    `refused`) and passes every other request on; it records each launch it passed on."""

    def __init__(self, node: NodeProcess) -> None:
        self.refused = 0
        self.passed_launches: list[dict[str, object]] = []
        self._proxy = ProxyNode(node, intercept=self._intercept)
        self.address = self._proxy.address

    def _intercept(self, request: dict[str, Any]) -> dict[str, Any] | None:
        if request["type"] != "runs.launch":
            return None
        if "launch_id" not in request["body"]:
            self.passed_launches.append(request["body"])
            return None
        self.refused += 1
        return {
            "v": request["v"],
            "type": ERROR,
            "body": older_refusal(),
            "id": f"older-{request['id']}",
            "corr": request["id"],
            "sender": "",
            "target": request.get("sender", ""),
            "host": "",
        }

    def close(self) -> None:
        self._proxy.close()


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
