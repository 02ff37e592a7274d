"""An append sent again under its client's append id is the append it made: its steps queued
once, its paths claimed once (R-APP-1..4, R-FAN-11; docs/api.md, "Launching again").

Before, `runs.append` carried no id: one whose answer was lost (its client's wait ended, or its
node died once the append was recorded) could only be sent again as a new append, which queued
the steps a second time and claimed their paths twice on the chain's budget (paths are labels,
not keys). Real detached nodes and real children; the chain is held running by a gate child.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import BadRequest, SubagentsError
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.lineage import Append, AppendResult
from subagents_node.messages.supervisor import ChainStep, RunView, TaskItem
from tests.support.manage import store_rows
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, GateChild, launch_context

WAIT_S = 30.0


def echo(ctx: LaunchContext, task: str) -> ChainStep:
    return ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task=task)])


def gated_chain(client: Client, ctx: LaunchContext, gate: Gate) -> tuple[RunView, GateChild]:
    """A background chain whose one step waits at the gate (it stays running), and that step."""
    first = ChainStep(items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))])
    run = client.runs.launch(ctx.launch("chain", True, chain=[first]))
    [held] = gate.accept(1, timeout=WAIT_S)
    return run, held


def later(ctx: LaunchContext, run: RunView, append_id: str | None = None) -> Append:
    """The append of one step (`echo later`) under `append_id` (a fresh one by default)."""
    steps = [echo(ctx, "later")]
    return Append(run_id=run.run_id, steps=steps, append_id=append_id or uuid.uuid4().hex)


def appended(state_dir: Path, run_id: str) -> list[tuple[int, str]]:
    """The run's append records: (step count, state)."""
    rows = store_rows(state_dir, "SELECT steps, state FROM run_appends WHERE run_id=?", run_id)
    return [(int(r[0]), str(r[1])) for r in rows]


def claimed(client: Client, run: RunView) -> int:
    return client.fanout.snapshot(decode_descriptor(run.fanout_descriptor)).used


def ends_with_steps_once(client: Client, run: RunView, held: GateChild) -> None:
    held.release(0)
    done = client.runs.wait(run.run_id, timeout=WAIT_S)
    assert done.state == "complete", done.error
    assert [c.output for c in done.children][1:] == ["later"]


@pytest.fixture
def node(start_node: Callable[..., NodeProcess], state_dir: Path) -> NodeProcess:
    return start_node(state_dir=state_dir)


def test_r_app_4_an_append_sent_twice_under_one_id_queues_its_steps_and_claims_once(
    node: NodeProcess, state_dir: Path, agents: Path, gate: Gate
) -> None:
    client = node.client(timeout=20)
    ctx = launch_context(agents)
    run, held = gated_chain(client, ctx, gate)
    request = later(ctx, run)

    first = client.ask(request, AppendResult)
    second = client.ask(request, AppendResult)

    assert (first.steps, second.steps) == (1, 1)
    assert "queued nothing more" in second.text and "\n" not in second.text
    assert appended(state_dir, run.run_id) == [(1, "committed")]
    assert claimed(client, run) == 2  # the gate's step and the appended one, once
    ends_with_steps_once(client, run, held)


def test_r_app_4_one_append_sent_twice_at_once_is_queued_once_and_both_callers_answered(
    node: NodeProcess, state_dir: Path, agents: Path, gate: Gate
) -> None:
    ctx = launch_context(agents)
    run, held = gated_chain(node.client(timeout=20), ctx, gate)
    request = later(ctx, run)
    answers: list[AppendResult | SubagentsError] = []

    def send() -> None:
        try:
            answers.append(node.client(timeout=20).ask(request, AppendResult))
        except SubagentsError as err:
            answers.append(err)

    senders = [threading.Thread(target=send) for _ in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(WAIT_S)

    assert len(answers) == 4 and all(isinstance(a, AppendResult) for a in answers), answers
    assert appended(state_dir, run.run_id) == [(1, "committed")]
    client = node.client(timeout=20)
    assert claimed(client, run) == 2
    ends_with_steps_once(client, run, held)


def test_another_append_under_a_used_append_id_is_refused_in_one_line_and_changes_nothing(
    node: NodeProcess, state_dir: Path, agents: Path, gate: Gate
) -> None:
    client = node.client(timeout=20)
    ctx = launch_context(agents)
    run, held = gated_chain(client, ctx, gate)
    used = uuid.uuid4().hex
    client.ask(later(ctx, run, used), AppendResult)
    other = Append(run_id=run.run_id, steps=[echo(ctx, "other")], append_id=used)

    with pytest.raises(BadRequest) as refused:
        client.ask(other, AppendResult)

    assert refused.value.details["reason"] == "append_id"
    assert refused.value.message == (
        f"append id '{used}' was already used for another append to chain run {run.run_id}; "
        "use a new append id"
    )
    assert appended(state_dir, run.run_id) == [(1, "committed")]
    assert claimed(client, run) == 2
    ends_with_steps_once(client, run, held)


@pytest.mark.slow
def test_r_app_4_an_append_sent_again_after_its_node_died_once_it_was_recorded_is_that_append(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    """Its node killed once the record was durable: the next node commits it (recovery) and
    the append sent again is answered as made, with nothing queued or claimed again."""
    dying = start_node("--faults", state_dir=state_dir, kill_at="append_recorded")
    ctx = launch_context(agents)
    run, held = gated_chain(dying.client(timeout=20), ctx, gate)
    request = later(ctx, run)
    with pytest.raises(SubagentsError):  # the node dies before it answers
        dying.client(timeout=5).ask(request, AppendResult)
    assert dying.wait_exited(WAIT_S), "the node did not die at append_recorded"
    client = start_node(state_dir=state_dir).client(timeout=20)

    again = client.ask(request, AppendResult)

    assert again.steps == 1 and "queued nothing more" in again.text
    assert [count for count, _ in appended(state_dir, run.run_id)] == [1]
    assert claimed(client, run) == 2
    held.release(0)
