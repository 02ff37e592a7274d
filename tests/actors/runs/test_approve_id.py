"""An approve sent again under its client's approve id is answered with the run that went on
past the checkpoint (R-RUN-2; docs/api.md, "Launching again").

Before, `runs.approve` carried no id: one whose answer was lost (its client's wait ended, or
its node died between recording the decision and answering) could only be sent again, and the
second send was refused ("is running, not waiting at a checkpoint", or "was already continued
as run …"): the caller never learnt the outcome. Now the decision is recorded with the
approve id and the request's digest (in place), or the run that goes on is launched under a
key made of them (after a restart): the same approve again is answered as made, another under
the id is refused in one line. The node is killed once the decision is durable
(SUBAGENTS_TEST_KILL_AT on a node started with faults). Real detached nodes and children.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from subprocess import PIPE

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import BadRequest, SubagentsError
from subagents_node.messages.pauses import Approve
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView, TaskItem
from tests.support.manage import store_rows
from tests.support.nodes import CLI, NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.runs import launch_context, new_session, wait_until, wait_view

WAIT_S = 30.0
LIMIT = 1


def waiting_chain(client: Client, ctx: LaunchContext) -> RunView:
    """A background chain `echo one`, checkpoint, `echo after {previous}`, at its checkpoint."""
    chain = [
        ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="one")]),
        ChainStep(kind="checkpoint"),
        ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="after {previous}")]),
    ]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    wait_view(client, run.run_id, lambda v: v.state == "paused", timeout=WAIT_S)
    return run


def approve_of(run: RunView, approve_id: str | None = None) -> Approve:
    return Approve(run_id=run.run_id, capacity_limit=LIMIT, approve_id=approve_id or new_id())


def new_id() -> str:
    return uuid.uuid4().hex


def context(agents: Path) -> LaunchContext:
    return launch_context(agents, session=new_session(), max_active_async_runs_per_session=LIMIT)


def runs_of(client: Client, session_id: str) -> set[str]:
    return {r.run_id for r in client.runs.list(session_id=session_id)}


def ends_after_one(client: Client, run_id: str, ctx: LaunchContext) -> None:
    done = client.runs.wait(run_id, timeout=WAIT_S)
    assert (done.state, done.output) == ("complete", "after one"), done.error
    wait_until(
        lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0,
        timeout=WAIT_S,
        what="the session's slot to be freed",
    )


def test_r_run_2_an_approve_sent_twice_under_one_approve_id_is_answered_twice_with_the_run(
    client: Client, agents: Path
) -> None:
    """The second send was refused: "Run '…' is running, not waiting at a checkpoint."."""
    ctx = context(agents)
    run = waiting_chain(client, ctx)
    request = approve_of(run)

    first = client.ask(request, LaunchResult).run
    second = client.ask(request, LaunchResult).run

    assert first.run_id == second.run_id == run.run_id
    assert runs_of(client, ctx.session_id) == {run.run_id}
    ends_after_one(client, run.run_id, ctx)
    assert client.ask(request, LaunchResult).run.state == "complete"  # once it ended, too


def test_another_approve_under_a_used_approve_id_is_refused_in_one_line_and_changes_nothing(
    client: Client, agents: Path
) -> None:
    ctx = context(agents)
    run = waiting_chain(client, ctx)
    used = new_id()
    client.ask(approve_of(run, used), LaunchResult)
    other = approve_of(run, used).model_copy(update={"env": {"OTHER": "1"}})

    with pytest.raises(BadRequest) as refused:
        client.ask(other, LaunchResult)

    assert refused.value.details["reason"] == "approve_id"
    assert refused.value.message == (
        f"approve id '{used}' was already used for another approve of run {run.run_id}; "
        "use a new approve id"
    )
    ends_after_one(client, run.run_id, ctx)


def test_the_clients_approve_sends_an_approve_id_of_its_own(
    node: NodeProcess, agents: Path
) -> None:
    client = node.client(timeout=20)
    ctx = context(agents)
    run = waiting_chain(client, ctx)

    assert client.runs.approve(run.run_id, capacity_limit=LIMIT).run_id == run.run_id

    sql = "SELECT approve_id FROM run_approvals WHERE run_id=?"
    [(approve_id,)] = store_rows(node.state_dir, sql, run.run_id)
    assert len(str(approve_id)) == 32
    ends_after_one(client, run.run_id, ctx)


@pytest.mark.slow
def test_r_run_2_an_approve_sent_again_after_its_node_died_once_it_was_recorded_is_that_run(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """Killed once the decision was durable (`approve_recorded`), before its answer: the
    approve sent again to the next node was refused, the run no longer at its checkpoint."""
    dying = start_node("--faults", state_dir=state_dir, kill_at="approve_recorded")
    ctx = context(agents)
    run = waiting_chain(dying.client(timeout=20), ctx)
    request = approve_of(run)
    with pytest.raises(SubagentsError):  # the node dies before it answers
        dying.client(timeout=5).ask(request, LaunchResult)
    assert dying.wait_exited(WAIT_S), "the node did not die at approve_recorded"
    client = start_node(state_dir=state_dir).client(timeout=20)

    again = client.ask(request, LaunchResult).run

    assert again.run_id == run.run_id
    assert client.ask(request, LaunchResult).run.run_id == run.run_id
    assert runs_of(client, ctx.session_id) == {run.run_id}


@pytest.mark.slow
@pytest.mark.parametrize("point", ["record_run", "mark_started", "answer_launch"])
def test_r_run_2_an_approve_after_a_restart_sent_again_after_its_node_died_is_one_continuation(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, point: str
) -> None:
    """A checkpoint whose execution a restart ended goes on in a new run. Its node killed once
    that run was recorded, the approve sent again was refused ("was already continued as run
    …"). Now it is answered with that run, which holds the one slot."""
    first = start_node(state_dir=state_dir)
    ctx = context(agents)
    run = waiting_chain(first.client(timeout=20), ctx)
    assert first.stop().returncode == 0
    request = approve_of(run)
    dying = start_node("--faults", state_dir=state_dir, kill_at=point)
    with pytest.raises(SubagentsError):  # the node went: the outcome is unknown
        dying.client(timeout=10).ask(request, LaunchResult)
    assert dying.wait_exited(WAIT_S), f"the node did not die at {point}"
    client = start_node(state_dir=state_dir).client(timeout=20)

    again = client.ask(request, LaunchResult).run

    assert again.run_id != run.run_id and again.source_run_id == run.run_id
    assert runs_of(client, ctx.session_id) == {run.run_id, again.run_id}
    ends_after_one(client, again.run_id, ctx)
    assert client.ask(request, LaunchResult).run.run_id == again.run_id
    other = request.model_copy(update={"env": {"OTHER": "1"}})
    with pytest.raises(BadRequest, match=r"approve id .* was already used"):
        client.ask(other, LaunchResult)


@pytest.mark.slow
def test_r_run_2_approve_at_the_command_line_rides_out_a_node_lost_mid_approve(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """`approve` whose node died once the decision was recorded exited "outcome unknown"; the
    user's second `approve` was refused. Now it waits for the next node, sends the approve
    again under its approve id, and prints the run."""
    dying = start_node("--faults", state_dir=state_dir, kill_at="approve_recorded")
    ctx = context(agents)
    run = waiting_chain(dying.client(timeout=20), ctx)
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": str(LIMIT)}
    command = [*CLI, "--state-dir", str(state_dir), "approve", run.run_id]
    with subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True, env=env) as cli:
        assert dying.wait_exited(WAIT_S), "the node did not die at approve_recorded"
        client = start_node(state_dir=state_dir).client(timeout=20)
        out, err = cli.communicate(timeout=WAIT_S)

    assert cli.returncode == 0, err
    assert out.strip() == run.run_id
    assert runs_of(client, ctx.session_id) == {run.run_id}
