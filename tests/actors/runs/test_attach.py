"""Attach as chain root (SPEC R-RES-6, R-RES-1, R-ADM-2/3).

A live background run becomes step 0 of a new background chain: the chain acquires exactly one
new `runner` slot (the source keeps its own), gets a new fan-out budget with its own static
claims (chain[1], ...), waits for the source and hands the source's output to its first step as
`{previous}`. A launch that fails at any admission step rolls the new slot back and leaves the
source exactly as it was. Refused attaches (a finished or foreground source) change no ledger.

Embedded nodes, real children. Fault points fail every launch, so the fault tests start the
source on one node and attach on a second node over the same state dir, which adopts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from subagents_node.actors.runs.admission import FAULT_POINTS
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import (
    BadRequest,
    InjectedFault,
    RunNotResumable,
    TaskUndeliverable,
)
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import (
    AgentPlan,
    ChainStep,
    LaunchResult,
    RunView,
    TaskItem,
)
from subagents_node.node.node import Node
from tests.support.manage import embedded
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, events_of, launch_context, ledgers, wait_until, wait_view

LIMIT = 3


@pytest.fixture
def ctx(agents: Path) -> LaunchContext:
    return launch_context(agents, max_active_async_runs_per_session=LIMIT)


def steps(ctx: LaunchContext) -> list[ChainStep]:
    return [ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="after {previous}")])]


def attach(
    client: Client, run_id: str, ctx: LaunchContext, chain: list[ChainStep] | None = None
) -> RunView:
    request = Resume(run_id=run_id, capacity_limit=LIMIT, attach=chain or steps(ctx))
    return client.ask(request, LaunchResult).run


def echo(ctx: LaunchContext, task: str) -> ChainStep:
    return ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task=task)])


def trace(client: Client, run: RunView) -> list[str]:
    """The run's steps as they happened: each child started (by label), each expansion and
    each checkpoint pause (by chain index)."""
    labels = {c.index: c.label for c in client.runs.show(run.run_id).children}
    out = []
    for event in events_of(client, run.run_id):
        if event.kind == "child.started":
            out.append(f"started {labels[int(str(event.data['child']))]}")
        elif event.kind == "step.expanded":
            out.append(f"expanded chain[{event.data['step']}]")
        elif event.kind == "run.paused":
            out.append(f"paused chain[{event.data['step']}]")
    return out


def test_r_res_6_attach_as_root_charges_exactly_one_new_slot(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """Also R-FAN-10 (A-12): attaching a live run as a new chain's root always creates a new
    budget; the source's is left as it was."""
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    source_budget = decode_descriptor(source.fanout_descriptor)
    source_fanout = client.fanout.snapshot(source_budget)
    source_slot = client.capacity.inspect(source.run_id, ctx.session_id)
    assert client.capacity.snapshot(ctx.session_id, LIMIT).used == 1

    chain = attach(client, source.run_id, ctx)

    # Exactly one new slot, the chain's own; the source keeps its slot as it was.
    assert client.capacity.snapshot(ctx.session_id, LIMIT).used == 2
    slot = client.capacity.inspect(chain.run_id, ctx.session_id)
    assert slot.relation == "current" and slot.owner is not None
    assert (slot.owner.kind, slot.owner.source_run_id) == ("runner", None)
    assert slot.owner.runner_id == chain.runner_id  # started (R-ADM-4)
    assert client.capacity.inspect(source.run_id, ctx.session_id) == source_slot
    # A new budget with the chain's own claim (its step 0 is the source: chain[1] is its first).
    assert chain.root_run_id != source.root_run_id
    chain_budget = decode_descriptor(chain.fanout_descriptor)
    assert client.fanout.snapshot(chain_budget).used == 1
    assert client.fanout.snapshot(source_budget) == source_fanout
    assert (chain.mode, chain.background, chain.state) == ("chain", True, "running")
    assert (chain.source_run_id, chain.source_kind) == (source.run_id, "attach")
    assert [(c.label, c.state) for c in chain.children] == [("chain[1]", "pending")]

    held.release(0)
    done = client.runs.wait(chain.run_id, timeout=20)
    assert done.state == "complete", done.error
    assert done.output.strip() == "after released 0"  # the source's output as {previous}
    assert client.runs.show(source.run_id).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")


def test_r_res_6_a_chain_attached_to_a_source_that_fails_fails_without_starting_its_steps(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    chain = attach(client, source.run_id, ctx)

    held.release(4)
    done = client.runs.wait(chain.run_id, timeout=20)

    assert done.state == "failed"
    assert done.error == f"Attached run {source.run_id} (chain step 0) ended failed."
    assert [c.state for c in done.children] == ["stopped"]
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")


def test_r_res_6_only_a_live_background_run_is_attached_and_a_refusal_changes_nothing(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    finished = client.runs.wait(
        client.runs.launch(ctx.single("echo", "done", True, None)).run_id, timeout=20
    )
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")
    foreground = client.runs.launch(ctx.single("gate", str(gate.path), False, None))
    [held] = gate.accept(1)
    before = ledgers(client, ctx.session_id, LIMIT)

    for run, reason in ((finished, "complete"), (foreground, "foreground")):
        with pytest.raises(RunNotResumable) as refused:
            attach(client, run.run_id, ctx)
        assert refused.value.details["reason"] == reason
    with pytest.raises(BadRequest):  # only runs.resume attaches
        client.runs.launch(
            ctx.launch("chain", True, chain=steps(ctx)).model_copy(
                update={"attached_run_id": foreground.run_id}
            )
        )
    assert ledgers(client, ctx.session_id, LIMIT) == before
    held.release(0)
    client.runs.wait(foreground.run_id, timeout=20)


@pytest.mark.slow
@pytest.mark.parametrize("point", FAULT_POINTS)
def test_r_res_6_an_attach_failing_at_each_admission_step_rolls_its_new_slot_back(
    state_dir: Path, ctx: LaunchContext, gate: Gate, point: str
) -> None:
    with Node.embedded(state_dir=state_dir) as first:  # the source outlives this node
        source = first.client().runs.launch(ctx.single("gate", str(gate.path), True, None))
        [held] = gate.accept(1)

    with embedded(state_dir, faults=True, settings={"fault_points": [point]}) as node:
        client = node.client()
        before = ledgers(client, ctx.session_id, LIMIT)
        source_slot = client.capacity.inspect(source.run_id, ctx.session_id)
        assert before.capacity.used == 1

        with pytest.raises(InjectedFault) as failed:
            attach(client, source.run_id, ctx)
        assert failed.value.point == point

        after = ledgers(client, ctx.session_id, LIMIT)
        if point == "mark_started":
            # Recorded before the step failed: the chain is failed (R-ADM-5) and owns nothing.
            [stray] = [r for r in client.runs.list() if r.source_run_id == source.run_id]
            assert client.runs.wait(stray.run_id, timeout=20).state == "failed"
            assert client.capacity.inspect(stray.run_id, ctx.session_id).relation == "none"
            after = replace(ledgers(client, ctx.session_id, LIMIT), runs=before.runs)
        assert after.capacity == before.capacity  # no new slot survives the failed attach
        assert after.runs == before.runs
        assert client.capacity.inspect(source.run_id, ctx.session_id) == source_slot
        held.release(0)
        assert client.runs.wait(source.run_id, timeout=20).state == "complete"


@pytest.mark.slow
def test_r_res_6_a_node_kill_9_while_the_chain_waits_leaves_no_stuck_run_and_no_leaked_slot(
    start_node: Callable[..., NodeProcess], state_dir: Path, ctx: LaunchContext, gate: Gate
) -> None:
    first = start_node(state_dir=state_dir)
    client = first.client(timeout=20)
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    chain = attach(client, source.run_id, ctx)
    assert client.capacity.snapshot(ctx.session_id, LIMIT).used == 2

    first.kill()
    client = start_node(state_dir=state_dir).client(timeout=20)

    # The waiting chain had started nothing: the restarted node fails it and frees its slot;
    # the source, adopted, keeps running and keeps its own.
    failed = client.runs.wait(chain.run_id, timeout=20)
    assert failed.state == "failed" and [c.state for c in failed.children] == ["stopped"]
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 1, what="release")
    assert client.runs.show(source.run_id).state == "running"
    held.release(0)
    assert client.runs.wait(source.run_id, timeout=20).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")
    assert client.runs.list(active_only=True) == []


def test_r_res_6_an_attached_chains_checkpoint_pauses_after_the_step_before_it(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """The chain's steps are chain[1], chain[2], ...: a checkpoint written between `one` and
    `two` pauses once `one` ran. It used to be keyed one group early: the run paused at
    chain[1] before `one` started, and approving ran `one` and `two` with no pause between."""
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    chain = [
        echo(ctx, "one {previous}"),
        ChainStep(kind="checkpoint", note="mid"),
        echo(ctx, "two {previous}"),
    ]
    run = attach(client, source.run_id, ctx, chain)
    held.release(0)

    waiting = wait_view(client, run.run_id, lambda v: v.paused == "checkpoint")

    assert (waiting.paused_step, waiting.checkpoint_note) == (2, "mid")
    assert [(c.label, c.state) for c in waiting.children] == [
        ("chain[1]", "complete"),
        ("chain[3]", "pending"),
    ]
    assert trace(client, run) == ["started chain[1]", "paused chain[2]"]

    client.runs.approve(run.run_id)
    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "complete", done.error
    assert done.output.strip() == "two one released 0"
    assert trace(client, run) == ["started chain[1]", "paused chain[2]", "started chain[3]"]
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")


def test_r_fan_21_an_attached_chains_expand_step_splits_the_step_before_it(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """The expand step at chain[2] splits chain[1]'s output. It used to take chain[1]'s
    place: chain[1] never ran, the step split the attached run's output, and the run still
    ended `complete`."""
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    template = TaskItem(agent=ctx.plan("echo"), task="got {item}")
    chain = [echo(ctx, "a\nb\nc"), ChainStep(kind="expand", items=[template])]
    run = attach(client, source.run_id, ctx, chain)
    held.release(0)

    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "complete", done.error
    paths = [f"chain[2].expand[{j}]" for j in range(3)]
    assert [(c.label, c.state) for c in done.children] == [
        ("chain[1]", "complete"),
        *[(p, "complete") for p in paths],
    ]
    assert [c.output.strip() for c in done.children[1:]] == ["got a", "got b", "got c"]
    items = trace(client, run)[2:]
    assert trace(client, run)[:2] == ["started chain[1]", "expanded chain[2]"]
    assert sorted(items) == [f"started {p}" for p in paths]  # the items start together
    budget = decode_descriptor(done.fanout_descriptor)
    assert client.fanout.snapshot(budget).used == 4
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")


def test_r_fan_12_an_attached_chains_refused_expand_template_is_named_by_its_own_path(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """Admission checks an expand step's template under the step's path: chain[2] here (the
    source is chain[0]), not one further, and the refusal changes no ledger."""
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    argv = AgentPlan(name="argv", command=["/bin/echo", "--prompt={task}"], task_delivery="argv")
    template = TaskItem(agent=argv, task="got {item}\x00")
    chain = [echo(ctx, "a"), ChainStep(kind="expand", items=[template])]
    before = ledgers(client, ctx.session_id, LIMIT)

    with pytest.raises(TaskUndeliverable) as refused:
        attach(client, source.run_id, ctx, chain)

    assert refused.value.message.startswith("Task chain[2] cannot be passed to agent 'argv'")
    assert ledgers(client, ctx.session_id, LIMIT) == before
    held.release(0)
    assert client.runs.wait(source.run_id, timeout=20).state == "complete"
