"""The MCP `pause`, `approve` and `reject` answers carry their run tree's fan-out budget as the
fan-out owner has it now (R-FAN-25, R-FAN-26), not the figure the run recorded at admission.

A run records its budget when it is admitted; every later claim on its tree (a sibling launch
made by one of the tree's children, a relaunch charged to it) leaves that record behind. Each
test makes such a claim after the run's record was written, on a real node, then asks the
tool through a real `subagents-node mcp` server (the SDK's stdio client): its answer must
show the owner's count. A budget the owner refuses to read keeps the recorded figure, marked
`fanout_recorded` with the reason, and the answer is still given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp.types import CallToolResult

from subagents_node.client.client import Client
from subagents_node.messages.constants import ENV_DEPTH, ENV_FANOUT
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.supervisor import RunView
from tests.mcp.test_mcp_server import data, mcp_session, run_id, server_env, text_of
from tests.node.test_quarantine import corrupt, stop
from tests.support.nodes import NodeProcess
from tests.support.runs import launch_context, wait_view

pytestmark = pytest.mark.processes

SLEEP = {"agent": "sleeper", "task": "seconds=0"}
#: A background chain that waits at its checkpoint: `chain[0]` and `chain[2]` claimed (2 used).
GATED = {"chain": [SLEEP, {"checkpoint": "ok?"}, SLEEP], "background": True}


def call(env: dict[str, str], name: str, arguments: dict[str, Any]) -> CallToolResult:
    """One tool call on a fresh server."""

    async def go() -> CallToolResult:
        async with mcp_session(env) as session:
            return await session.call_tool(name, arguments)

    return asyncio.run(go())


def at_checkpoint(client: Client, env: dict[str, str]) -> RunView:
    started = call(env, "run", GATED)
    return wait_view(client, run_id(started), lambda v: v.state == "paused")


def sibling_launch(client: Client, run: RunView) -> int:
    """A nested launch in `run`'s tree, as a `fanout: true` child of it makes one (its route
    and depth 1): one more claim on the tree's budget, after `run` recorded its figure. The
    budget's used count as its owner has it afterwards."""
    ctx = launch_context(env={ENV_FANOUT: run.fanout_descriptor, ENV_DEPTH: "1"})
    nested = client.runs.launch(ctx.single("sleeper", "seconds=0", False, None))
    assert client.runs.wait(nested.run_id, timeout=30).state == "complete"
    used = client.fanout.snapshot(decode_descriptor(run.fanout_descriptor)).used
    assert used == client.runs.show(run.run_id).snapshots.fanout_used + 1  # the record lags
    return used


def assert_live(result: CallToolResult, used: int) -> None:
    answer = data(result)
    assert answer["fanout"] == {"used": used, "limit": 64}, text_of(result)
    assert "fanout_recorded" not in answer


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_r_fan_26_a_checkpoint_decision_answers_with_the_trees_live_fan_out(
    node: NodeProcess, decision: str
) -> None:
    """A sibling launch claimed on the waiting run's tree after its record was written: the
    approve (or reject) answer shows the owner's count, the record's plus that claim."""
    env = server_env(SUBAGENTS_NODE=node.address)
    client = node.client()
    waiting = at_checkpoint(client, env)
    used = sibling_launch(client, waiting)

    decided = call(env, decision, {"run_id": waiting.run_id})

    assert not decided.is_error, text_of(decided)
    assert_live(decided, used)
    if decision == "approve":  # R-FAN-25: a launch result's first line is its budget's
        assert text_of(decided).splitlines()[0] == f"Run fan-out: {used}/64 used"
    ended = client.runs.wait(waiting.run_id, timeout=30).state
    assert ended == ("complete" if decision == "approve" else "rejected")


def test_r_fan_26_a_pause_answers_with_the_trees_live_fan_out(node: NodeProcess) -> None:
    """A sibling launch claimed on a running run's tree after its record was written: the
    pause answer shows the owner's count."""
    env = server_env(SUBAGENTS_NODE=node.address)
    client = node.client()
    started = call(env, "run", {"agent": "sleeper", "task": "seconds=60", "background": True})
    running = wait_view(
        client, run_id(started), lambda v: any(c.state == "running" for c in v.children)
    )
    used = sibling_launch(client, running)

    paused = call(env, "pause", {"run_id": running.run_id})

    assert not paused.is_error, text_of(paused)
    assert_live(paused, used)
    wait_view(client, running.run_id, lambda v: v.state == "paused")
    client.runs.stop(running.run_id)
    assert client.runs.wait(running.run_id, timeout=30).state == "stopped"


def test_r_fan_25_an_approve_that_relaunches_from_inside_the_tree_answers_after_its_claim(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    """A node restart ended the checkpoint's execution: an approve from a server running
    inside the run's tree (its route, depth 1) relaunches it and claims `resume[RUN]` on that
    tree. The answer (the relaunched run, on the same budget) counts that claim and a sibling
    launch made after the paused run's record, and, being a launch result, says so on its
    first line (R-FAN-25)."""
    first = start_node(state_dir=state_dir)
    waiting = at_checkpoint(first.client(), server_env(SUBAGENTS_NODE=first.address))
    first.kill()
    restarted = start_node(state_dir=state_dir)
    client = restarted.client()
    used = sibling_launch(client, client.runs.show(waiting.run_id))
    inside = server_env(
        SUBAGENTS_NODE=restarted.address,
        **{ENV_FANOUT: waiting.fanout_descriptor, ENV_DEPTH: "1"},
    )

    approved = call(inside, "approve", {"run_id": waiting.run_id})

    assert not approved.is_error, text_of(approved)
    going = run_id(approved)
    assert going != waiting.run_id and data(approved)["source_run_id"] == waiting.run_id
    assert_live(approved, used + 1)
    assert text_of(approved).splitlines()[0] == f"Run fan-out: {used + 1}/64 used"
    assert client.runs.wait(going, timeout=30).state == "complete"


def test_r_fan_26_a_budget_that_cannot_be_read_leaves_reject_its_recorded_figure_marked(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    """The waiting run's budget is quarantined (broken while no node ran): the reject is still
    made and answered, with the figure the run recorded, marked with the owner's reason."""
    first = start_node(state_dir=state_dir)
    waiting = at_checkpoint(first.client(), server_env(SUBAGENTS_NODE=first.address))
    stop(first)
    budget = decode_descriptor(waiting.fanout_descriptor)
    sql = "UPDATE fanout_budgets SET used = 'lots' WHERE budget_id = ?"
    corrupt(state_dir, "fanout", sql, budget.budget_id)
    env = server_env(SUBAGENTS_NODE=start_node(state_dir=state_dir).address)

    rejected = call(env, "reject", {"run_id": waiting.run_id})

    answer = data(rejected)
    assert answer["state"] == "rejected", text_of(rejected)
    assert answer["fanout"] == {"used": 2, "limit": 64}  # as recorded at admission
    assert "quarantined" in answer["fanout_recorded"]
