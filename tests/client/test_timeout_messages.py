"""What a client is told when its node does not answer in time (client/reachability.py).

It used to add "(is it running?)" to every timeout of a node it could see running: a `run`
whose launch waited behind a stopped owner sent the user to check a node that was up, and never
said that the launch may have happened all the same (its run was there, holding a slot, once
the owner went on). The message now says the node is running, with its pid, and, for any
request that is not read-only, that it may have been applied."""

from __future__ import annotations

import os
import signal

import pytest

from subagents_node.client.client import Client
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.errors import NodeTimeout
from subagents_node.messages.supervisor import (
    AgentPlan,
    Launch,
    LaunchResult,
    ListRuns,
    RunList,
    TaskItem,
)
from tests.support.nodes import NodeProcess
from tests.support.runs import stop_process


def _owner_pid(node: NodeProcess, name: str) -> int:
    with node.client() as client:
        pid = next(a.pid for a in client.status().actors if a.name == name)
    assert pid is not None
    return pid


def test_a_launch_behind_a_stopped_owner_is_told_the_node_runs_and_the_launch_may_exist(
    node: NodeProcess,
) -> None:
    supervisor = _owner_pid(node, "supervisor")
    launch = Launch(
        session_id="timeouts",
        mode="single",
        background=True,
        items=[TaskItem(agent=AgentPlan(name="t", command=["/bin/true"]), task="x")],
        cwd="/",
    )
    stop_process(supervisor)
    try:
        with Client(ZmqTransport(node.address), timeout=1.0) as client:
            with pytest.raises(NodeTimeout) as launched:
                client.ask(launch, LaunchResult)
            with pytest.raises(NodeTimeout) as listed:
                client.ask(ListRuns(), RunList)
    finally:
        os.kill(supervisor, signal.SIGCONT)
    running = f"its node, pid {node.pid}, is running but did not answer"
    assert running in launched.value.message
    assert "may have been applied" in launched.value.message
    assert "is it running?" not in launched.value.message
    assert running in listed.value.message
    assert "may have been applied" not in listed.value.message  # a read changes nothing
