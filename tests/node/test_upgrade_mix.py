"""The documented upgrade (`stop`, then `start`) and kill -9 then `start`, with runs of every kind
in flight on one state dir at once (docs/operations.md, "Restart and recovery after kill -9").

At the restart: a single run (its child ends 3 after it), a parallel run with items still
queued, a chain waiting at a checkpoint (approved after it), a checkpoint wait whose deadline
passes while no node runs, a paused run (resumed after), a background workflow whose async
child runs on, and a session with a limit of 1 whose second launch was refused. After it every
run ends as it should, each slot is freed once its tree ended (R-CAP-21, R-CAP-22) and the
capped session's next launch is admitted, and the fan-out figures are the claims made before
it (R-FAN-15: never refunded). Each part has its own focused test elsewhere (test_runs_shims,
test_pause_recovery, test_workflows, test_runs_outbox); this one runs them together.

Real detached node processes and real children (gate agents the test releases).
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import CapacityExhausted
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView, TaskItem
from subagents_node.workflow.launch import workflow_launch
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, wait_until, wait_view

LIMIT = 10
#: The checkpoint wait that expires: long enough for the launches before the restart.
DEADLINE_MS = 6000
RESTARTED = "The node restarted before every child started."


def item(ctx: LaunchContext, agent: str, task: str) -> TaskItem:
    return TaskItem(agent=ctx.plan(agent), task=task)


def step(ctx: LaunchContext, agent: str, task: str) -> ChainStep:
    return ChainStep(items=[item(ctx, agent, task)])


def claims(client: Client, run: RunView) -> int:
    return client.fanout.snapshot(decode_descriptor(run.fanout_descriptor)).used


def used(client: Client, ctx: LaunchContext, limit: int = LIMIT) -> int:
    return client.capacity.snapshot(ctx.session_id, limit).used


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["stop", "kill"])
def test_every_kind_of_run_in_flight_ends_right_after_an_upgrade_or_a_kill_9(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
    tmp_path: Path,
    restart: str,
) -> None:
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, cwd=tmp_path, max_active_async_runs_per_session=LIMIT)
    capped = launch_context(agents, max_active_async_runs_per_session=1)
    gated = [item(ctx, "gate", str(gate.path))]

    single = client.runs.launch(ctx.launch("single", True, items=gated))
    [single_child] = gate.accept(1)
    queued = [*gated, item(ctx, "echo", "a"), item(ctx, "echo", "b")]
    parallel = client.runs.launch(ctx.launch("parallel", True, items=queued, concurrency=1))
    [parallel_child] = gate.accept(1)
    decided = [step(ctx, "echo", "one"), ChainStep(kind="checkpoint")]
    checkpoint = client.runs.launch(
        ctx.launch("chain", True, chain=[*decided, step(ctx, "echo", "after {previous}")])
    )
    expiring = client.runs.launch(
        ctx.launch(
            "chain", True, chain=[*decided, step(ctx, "echo", "two")], timeout_ms=DEADLINE_MS
        )
    )
    paused = client.runs.launch(ctx.launch("single", True, items=gated))
    [paused_child] = gate.accept(1)
    client.runs.pause(paused.run_id)
    script = tmp_path / "flow.py"
    script.write_text(
        textwrap.dedent(f"""
        def main(runs):
            return runs.run("slow", "gate", {str(gate.path)!r}, async_=True).run_id
        """)
    )
    flow = client.runs.launch(
        workflow_launch(ctx, script, background=True, agents_dirs=(str(agents),))
    )
    [flow_child] = gate.accept(1)
    held = client.runs.launch(
        capped.launch("single", True, items=[item(capped, "gate", str(gate.path))])
    )
    [held_child] = gate.accept(1)
    with pytest.raises(CapacityExhausted):
        client.runs.launch(capped.launch("single", True, items=[item(capped, "echo", "x")]))
    for run in (checkpoint, expiring, paused):
        wait_view(client, run.run_id, lambda v: v.state == "paused")
    assert client.runs.wait(flow.run_id, timeout=20).state == "complete"
    paused_child.wait_exit()
    deadline = expiring.deadline_at
    assert deadline is not None

    if restart == "stop":
        assert first.stop().returncode == 0
    else:
        first.kill()
    wait_until(lambda: time.time() > deadline, what="the checkpoint's deadline to pass")
    client = start_node(state_dir=state_dir).client()

    # Still as they were: nothing ended with the node, the capped slot is still held.
    assert client.runs.show(single.run_id).state == "running"
    assert client.runs.show(checkpoint.run_id).state == "paused"
    assert used(client, capped, 1) == 1
    single_child.release(3)
    parallel_child.release(0)
    flow_child.release(0)
    held_child.release(0)
    goes_on = client.runs.approve(checkpoint.run_id, capacity_limit=LIMIT)
    resumed = client.ask(Resume(run_id=paused.run_id, capacity_limit=LIMIT), LaunchResult).run
    [resumed_child] = gate.accept(1)
    resumed_child.release(0)

    ended = {r.run_id: client.runs.wait(r.run_id, timeout=30) for r in (single, parallel, held)}
    assert ended[single.run_id].state == "failed"
    assert [c.exit_code for c in ended[single.run_id].children] == [3]
    assert (ended[parallel.run_id].state, ended[parallel.run_id].error) == ("failed", RESTARTED)
    assert [c.state for c in ended[parallel.run_id].children] == ["complete", "stopped", "stopped"]
    assert ended[held.run_id].state == "complete"
    expired = client.runs.wait(expiring.run_id, timeout=30)
    assert (expired.state, expired.error) == ("failed", f"Run timed out after {DEADLINE_MS} ms.")
    after = client.runs.wait(goes_on.run_id, timeout=30)
    assert (after.state, after.output) == ("complete", "after one")
    assert client.runs.show(checkpoint.run_id).resumed_by == goes_on.run_id
    assert client.runs.wait(resumed.run_id, timeout=30).state == "complete"
    assert client.runs.show(paused.run_id).resumed_by == resumed.run_id

    # Every slot is freed (the workflow's once its async child ended), and the capped
    # session's next launch is admitted.
    wait_until(lambda: used(client, ctx) == 0, what="every slot of the session to be freed")
    wait_until(lambda: used(client, capped, 1) == 0, what="the capped session's slot")
    admitted = client.runs.launch(capped.launch("single", True, items=[item(capped, "echo", "y")]))
    assert client.runs.wait(admitted.run_id, timeout=30).state == "complete"
    # R-FAN-15: the claims made before the restart stand; the continuations claimed nothing.
    assert claims(client, parallel) == 3
    assert claims(client, checkpoint) == 2
    assert claims(client, paused) == 1
    assert claims(client, flow) == 1
