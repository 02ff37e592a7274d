"""Approve from inside a run: a relaunch past a checkpoint is a nested resume (R-TOP-1, R-RES-3).

`approve` of a checkpoint whose execution a node restart ended launches a new run that goes on
after the checkpoint, like a resume of a paused run. Asked from inside a run (a depth, the
caller's route) it is not top-level, so it takes no slot (R-TOP-7): it neither transfers nor
acquires (R-RES-3), and the paused source, which gives its slot to no one, ends `stopped`
(continued) with a terminal report that frees it (R-CAP-25). Its budget is the source's,
nothing claimed (R-RES-4, R-FAN-23). The caller must show its own route, which only a
`fanout: true` agent is given (§0.2, R-FAN-4); it is validated (R-FAN-5) and charged one path
(`resume[RUN]`, as a nested resume is), and the depth limit still refuses the relaunch
(R-CFG-8). A refusal changes nothing: the run still waits at its checkpoint, holding its slot.
(A checkpoint still held in memory is decided in place: no launch, nothing to authorize.)

Real detached node processes killed with -9 (a checkpoint that a restart ended); in the first
test the `approver` agent, a `fanout: true` child, runs `subagents-node approve` itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.supervisor import ChainStep, RunView, TaskItem
from tests.support.manage import (
    NESTED_REFUSAL_IDS,
    NESTED_REFUSALS,
    a_route,
    assert_nested_continuation,
)
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.runs import launch_context, ledgers, wait_view, write_agent

LIMIT = 2
APPROVER = json.dumps(["{python}", "-m", "subagents_node", "approve", "{task}"])


def used(client: Client, ctx: LaunchContext) -> int:
    return client.capacity.snapshot(ctx.session_id, LIMIT).used


def restarted_at_checkpoint(
    start_node: Callable[..., NodeProcess], state_dir: Path, ctx: LaunchContext
) -> tuple[Client, RunView]:
    """A background chain paused at its checkpoint, whose node was killed -9 and restarted:
    the run holds its slot and no process, so `approve` relaunches it."""
    first = start_node(state_dir=state_dir)
    client = first.client()
    chain = [
        ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="one")]),
        ChainStep(kind="checkpoint"),
        ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="after {previous}")]),
    ]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain))
    wait_view(client, run.run_id, lambda v: v.state == "paused")
    first.kill()
    client = start_node(state_dir=state_dir).client()
    assert used(client, ctx) == 1  # "run is still paused"
    return client, client.runs.show(run.run_id)


def test_r_res_3_a_fanout_child_approves_a_restarted_checkpoint_taking_no_capacity(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """`subagents-node approve` run by a `fanout: true` agent (SUBAGENTS_DEPTH=1 and
    SUBAGENTS_RUN_FANOUT in its environment) relaunches the run as a nested resume."""
    write_agent(agents, "approver", "Approves the run its task names.", APPROVER, fanout="true")
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    client, waiting = restarted_at_checkpoint(start_node, state_dir, ctx)
    budget = decode_descriptor(waiting.fanout_descriptor)
    claims = client.fanout.snapshot(budget)

    caller = client.runs.launch(ctx.single("approver", waiting.run_id, False, None))
    done = client.runs.wait(caller.run_id, timeout=30)
    assert done.state == "complete", done.error
    going = client.runs.show(done.output.strip())

    # R-RES-3 / R-TOP-7: not top-level, so no slot: nothing acquired, nothing transferred.
    assert_nested_continuation(client, going, waiting.run_id, ctx.session_id, LIMIT)
    # R-RES-4 / R-FAN-23: the source's budget, nothing claimed on it; the caller's tree has the
    # approver itself and the relaunch (`resume[RUN]`).
    assert going.fanout_descriptor == waiting.fanout_descriptor
    assert client.fanout.snapshot(budget) == claims
    assert client.fanout.snapshot(decode_descriptor(done.fanout_descriptor)).used == 2

    finished = client.runs.wait(going.run_id, timeout=20)
    assert (finished.state, finished.output) == ("complete", "after one")
    assert [c.label for c in finished.children] == ["chain[2]"]
    assert used(client, ctx) == 0
    assert client.fanout.snapshot(budget) == claims


def test_r_fan_4_a_refused_nested_approve_changes_nothing_and_the_run_still_waits(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """The depth limit and the caller's own authorization (R-FAN-4, R-FAN-5) still apply to
    an approve that relaunches: each refusal is its typed error, no ledger moves, and the run
    stays paused at its checkpoint with its slot, so a later top-level approve goes on."""
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    client, waiting = restarted_at_checkpoint(start_node, state_dir, ctx)
    caller = a_route(client)
    budget = decode_descriptor(waiting.fanout_descriptor)
    before = ledgers(client, ctx.session_id, LIMIT, budget)
    slot = client.capacity.inspect(waiting.run_id, ctx.session_id)

    for (depth, route, error, message), case in zip(
        NESTED_REFUSALS, NESTED_REFUSAL_IDS, strict=True
    ):
        with pytest.raises(error) as refused:
            client.runs.approve(
                waiting.run_id,
                depth=depth,
                capacity_limit=LIMIT,
                inherited_fanout=caller if route == "valid" else route,
            )
        assert message in refused.value.message, case
        assert ledgers(client, ctx.session_id, LIMIT, budget) == before, case
        assert client.capacity.inspect(waiting.run_id, ctx.session_id) == slot, case
        assert client.runs.show(waiting.run_id).paused == "checkpoint", case
    assert client.fanout.snapshot(decode_descriptor(caller)).used == 0

    going = client.runs.approve(waiting.run_id, capacity_limit=LIMIT)  # top-level: transfers
    assert client.runs.wait(going.run_id, timeout=20).output == "after one"
    assert used(client, ctx) == 0
