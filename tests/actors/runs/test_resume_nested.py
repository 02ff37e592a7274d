"""Resume from inside a run: a nested resume (R-TOP-1, R-RES-3, R-RES-4, R-FAN-4, R-FAN-10).

A resume asked at depth > 0 (or with an inherited route) is not top-level, so it takes no
capacity: it neither transfers nor acquires (R-RES-3, R-TOP-7). Its run goes on with its
source's budget, claiming nothing there (R-RES-4, R-FAN-10), at the caller's depth, so the depth
limit still refuses it (R-RES-1, R-ADM). Launching anything from inside a run needs the caller's
own route, which only a `fanout: true` agent is given (§0.2, R-FAN-4): a resume starts children,
so it needs it too, and it claims one path on it (`resume[SOURCE]`): charged nowhere, as the
spec has it (R-FAN-23, R-TOP-7), one child could relaunch runs without bound. A paused source
that still holds its slot gives it to no one: it ends `stopped` (continued), and that terminal
report frees its slot (R-CAP-25; transfer is for top-level resumes only, R-CAP-18..20).

Embedded node, real children: the `resumer` agent runs `subagents-node resume` itself; the
kill -9 case uses real detached node processes (SUBAGENTS_TEST_KILL_AT).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import (
    FanoutBudgetUnavailable,
    FanoutDescriptorInvalid,
    FanoutLimitExceeded,
    FanoutNotAuthorized,
    NestedCallBlocked,
    SubagentsError,
)
from subagents_node.messages.fanout import FanoutDescriptor, decode_descriptor, encode_descriptor
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView, TaskItem
from tests.support.manage import assert_nested_continuation, hold_with_unknown_proof
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, ledgers, wait_until, wait_view, write_agent

LIMIT = 2
RESUMER = json.dumps(["{python}", "-m", "subagents_node", "resume", "{task}"])


@pytest.fixture
def ctx(agents: Path) -> LaunchContext:
    return launch_context(agents, max_active_async_runs_per_session=LIMIT)


def used(client: Client, ctx: LaunchContext) -> int:
    return client.capacity.snapshot(ctx.session_id, LIMIT).used


def finished_at_gate(client: Client, ctx: LaunchContext, gate: Gate) -> RunView:
    """A background `gate` run that completed and released its slot; its resume waits at the
    gate again, so the test sees the resumed run while it runs."""
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)
    child.release(0)
    done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "complete", done.error
    wait_until(lambda: used(client, ctx) == 0, what="release")
    return done


def nested_resume(client: Client, run_id: str, route: str | None, depth: int = 1) -> RunView:
    request = Resume(run_id=run_id, capacity_limit=LIMIT, depth=depth, inherited_fanout=route)
    return client.ask(request, LaunchResult).run


def a_route(client: Client) -> str:
    """The caller's own run tree's budget, as a `fanout: true` child is given it."""
    return encode_descriptor(client.fanout.create("caller00", 8))


def test_r_res_3_a_fanout_child_resumes_a_run_taking_no_capacity_on_the_sources_budget(
    client: Client, agents: Path, gate: Gate
) -> None:
    """`subagents-node resume` run by a `fanout: true` agent (SUBAGENTS_DEPTH=1 and
    SUBAGENTS_RUN_FANOUT in its environment) is admitted as a nested resume."""
    write_agent(agents, "resumer", "Resumes the run its task names.", RESUMER, fanout="true")
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    source = finished_at_gate(client, ctx, gate)
    budget = decode_descriptor(source.fanout_descriptor)
    fanout_before = client.fanout.snapshot(budget)

    caller = client.runs.launch(ctx.single("resumer", source.run_id, False, None))
    done = client.runs.wait(caller.run_id, timeout=30)
    assert done.state == "complete", done.error
    resumed = client.runs.show(done.output.strip())
    [child] = gate.accept(1)

    assert (resumed.source_run_id, resumed.depth, resumed.state) == (source.run_id, 1, "running")
    # R-RES-3 / R-TOP-7: not top-level, so no slot: nothing acquired, nothing transferred.
    assert resumed.snapshots.capacity_used is None
    assert client.capacity.inspect(resumed.run_id, ctx.session_id).relation == "none"
    assert used(client, ctx) == 0
    # R-RES-4 / R-FAN-10: the source's budget, nothing claimed on it; the caller's tree has
    # the resumer itself and its resume (`resume[SOURCE]`).
    assert resumed.fanout_descriptor == source.fanout_descriptor
    assert client.fanout.snapshot(budget) == fanout_before
    assert client.fanout.snapshot(decode_descriptor(done.fanout_descriptor)).used == 2

    child.release(0)
    assert client.runs.wait(resumed.run_id, timeout=20).state == "complete"
    assert used(client, ctx) == 0
    assert client.fanout.snapshot(budget) == fanout_before


def test_r_fan_4_a_child_whose_agent_lacks_fanout_may_not_resume_a_run(
    client: Client, agents: Path
) -> None:
    write_agent(agents, "resumer", "Resumes the run its task names.", RESUMER)
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    source = client.runs.wait(
        client.runs.launch(ctx.single("echo", "x", True, None)).run_id, timeout=20
    )
    wait_until(lambda: used(client, ctx) == 0, what="release")

    caller = client.runs.launch(ctx.single("resumer", source.run_id, False, None))
    done = client.runs.wait(caller.run_id, timeout=30)

    assert done.state == "failed"
    assert "may not launch subagents" in done.error
    assert {r.run_id for r in client.runs.list()} == {source.run_id, caller.run_id}


def test_r_res_3_a_nested_resume_leaves_a_finished_sources_held_slot_where_it_is(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """No transfer: the slot the source still holds stays its own, released by its proof."""
    source = finished_at_gate(client, ctx, gate)
    held = hold_with_unknown_proof(client, source, LIMIT)

    resumed = nested_resume(client, source.run_id, a_route(client))
    [child] = gate.accept(1)

    assert resumed.snapshots.capacity_used is None
    assert used(client, ctx) == 1
    assert client.capacity.inspect(source.run_id, ctx.session_id) == held
    assert client.capacity.inspect(resumed.run_id, ctx.session_id).relation == "none"
    child.release(0)
    assert client.runs.wait(resumed.run_id, timeout=20).state == "complete"
    assert client.capacity.inspect(source.run_id, ctx.session_id) == held


def test_r_res_3_a_nested_resume_of_a_paused_run_frees_the_slot_the_source_held(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """The continuation takes no slot; its source ends `stopped` and its slot is released
    (R-CAP-25), instead of moving to a run that is never charged (R-TOP-7)."""
    gate_step = ChainStep(items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))])
    tail = ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="{previous} then more")])
    run = client.runs.launch(ctx.launch("chain", True, chain=[gate_step, tail]))
    [child] = gate.accept(1)
    budget = decode_descriptor(run.fanout_descriptor)
    claims = client.fanout.snapshot(budget)
    client.runs.pause(run.run_id)
    wait_view(client, run.run_id, lambda v: v.state == "paused")
    child.wait_exit()
    assert used(client, ctx) == 1  # "run is still paused"
    route = a_route(client)

    resumed = nested_resume(client, run.run_id, route)
    [again] = gate.accept(1)

    assert_nested_continuation(client, resumed, run.run_id, ctx.session_id, LIMIT)
    assert resumed.fanout_descriptor == run.fanout_descriptor
    assert client.fanout.snapshot(budget) == claims
    assert client.fanout.snapshot(decode_descriptor(route)).used == 1  # resume[SOURCE]

    again.release(0)
    done = client.runs.wait(resumed.run_id, timeout=20)
    assert (done.state, done.output) == ("complete", "released 0 then more")
    assert used(client, ctx) == 0
    assert client.fanout.snapshot(budget) == claims


def test_nested_resumes_are_bounded_by_the_callers_fanout_limit(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """Each nested resume claims one path on its caller's route, so a child that resumes in a
    loop is stopped by its own tree's limit (FanoutLimitExceeded), and the refused one starts
    nothing."""
    source = finished_at_gate(client, ctx, gate)
    route = encode_descriptor(client.fanout.create("caller01", 1))

    first = nested_resume(client, source.run_id, route)
    [child] = gate.accept(1)
    with pytest.raises(FanoutLimitExceeded) as refused:
        nested_resume(client, source.run_id, route)

    assert refused.value.rejection.path == f"resume[{source.run_id[:8]}]"
    assert client.fanout.snapshot(decode_descriptor(route)).used == 1
    assert {r.run_id for r in client.runs.list() if r.source_run_id} == {first.run_id}
    child.release(0)
    assert client.runs.wait(first.run_id, timeout=20).state == "complete"


@pytest.mark.parametrize(
    ("depth", "route", "error", "message"),
    [
        (2, "valid", NestedCallBlocked, "Nested subagent call blocked (depth=2, max=2)."),
        (1, None, FanoutNotAuthorized, "may not launch subagents (its agent needs `fanout: true`)"),
        (1, "not a descriptor!", FanoutDescriptorInvalid, "Invalid inherited run fan-out budget"),
        (
            1,
            encode_descriptor(FanoutDescriptor(root_run_id="gone", budget_id="gone-1", limit=5)),
            FanoutBudgetUnavailable,
            "unknown budget gone-1",
        ),
    ],
    ids=["at max depth", "no route", "undecodable route", "unknown budget"],
)
def test_r_res_1_a_refused_nested_resume_changes_nothing(
    client: Client,
    ctx: LaunchContext,
    depth: int,
    route: str | None,
    error: type[SubagentsError],
    message: str,
) -> None:
    """The depth limit (R-RES-1 "resume at max depth is blocked") and the caller's own
    authorization (R-FAN-4, R-FAN-5) still apply to a nested resume."""
    source = client.runs.wait(
        client.runs.launch(ctx.single("echo", "x", True, None)).run_id, timeout=20
    )
    wait_until(lambda: used(client, ctx) == 0, what="release")
    caller = a_route(client)
    budget = decode_descriptor(source.fanout_descriptor)
    before = ledgers(client, ctx.session_id, LIMIT, budget)

    with pytest.raises(error) as refused:
        nested_resume(client, source.run_id, caller if route == "valid" else route, depth)

    assert message in refused.value.message
    assert ledgers(client, ctx.session_id, LIMIT, budget) == before
    assert client.fanout.snapshot(decode_descriptor(caller)).used == 0


@pytest.mark.slow
def test_r_res_3_kill_9_before_a_nested_continuation_said_so_still_frees_the_paused_slot(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
) -> None:
    """The node dies once a nested continuation is recorded, before its child is forked
    (`fork_shim`). With no slot to mark started, the source is ended in the transaction that
    records its continuation, and the report that frees its slot is owed durably with it: the
    restarted node sends it, so the slot is not left "still paused" for good."""
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    gate_step = ChainStep(items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))])
    run = client.runs.launch(ctx.launch("chain", True, chain=[gate_step]))
    [child] = gate.accept(1)
    client.runs.pause(run.run_id)
    wait_view(client, run.run_id, lambda v: v.state == "paused")
    child.wait_exit()
    route = a_route(client)
    first.cleanup()
    dying = start_node("--faults", state_dir=state_dir, kill_at="fork_shim")
    with pytest.raises(SubagentsError):
        nested_resume(dying.client(timeout=5), run.run_id, route)
    assert dying.wait_exited(10), "the node did not die at fork_shim"

    client = start_node(state_dir=state_dir).client()
    [going] = wait_until(
        lambda: [r for r in client.runs.list() if r.source_run_id == run.run_id],
        what="the recorded continuation",
    )
    assert client.runs.wait(going.run_id, timeout=20).state == "failed"  # started nothing
    assert client.runs.show(run.run_id).state == "stopped"
    wait_until(lambda: used(client, ctx) == 0, what="the paused source's slot to be freed")
