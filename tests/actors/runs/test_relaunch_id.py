"""A resume, an attach or a rerun sent again under its client's launch id is the run it made:
never a second run, never a second slot (docs/api.md, "Launching again"; R-RES-1..3, R-RES-6,
R-MISC-2, R-CAP-18).

Before, these requests carried no id: one whose answer was lost (its client's wait ended, or its
node died between recording the run and answering) could only be sent again as a new request,
which made a second run of a finished source (and took a second slot), or was refused for a
paused one. The node is killed at the steps of the relaunch's admission after which it may have
recorded the run (SUBAGENTS_TEST_KILL_AT on a node started with faults); the same request goes
to the next node on the state dir. `resume` at the command line, its node killed mid-resume,
waits for the next node and prints the one run. Real detached nodes and real children.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from subprocess import PIPE

import pytest

from subagents_node.actors.runs.workflowkeys import run_id_of
from subagents_node.client.client import Client
from subagents_node.client.lineage import attach_request
from subagents_node.messages.errors import LaunchIdConflict, RunNotResumable, SubagentsError
from subagents_node.messages.fanout import encode_descriptor
from subagents_node.messages.lineage import Rerun, Resume
from subagents_node.messages.supervisor import ChainStep, Launch, LaunchResult, RunView, TaskItem
from tests.support.nodes import CLI, NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, new_session, wait_until

WAIT_S = 30.0
#: The steps of a relaunch's admission after which its node may have recorded it (the earlier
#: ones record nothing a second send could find).
KILL_POINTS = ("record_run", "mark_started", "answer_launch")


def finished_run(client: Client, agents: Path) -> tuple[Launch, RunView]:
    """A complete background run in a new session with room for one active run."""
    ctx = launch_context(agents, session=new_session(), max_active_async_runs_per_session=1)
    launch = ctx.single("echo", "hello", True, None)
    run = client.runs.launch(launch)
    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    return launch, run


def resume_of(run: RunView) -> Resume:
    return Resume(run_id=run.run_id, message="again", capacity_limit=1, launch_id=uuid.uuid4().hex)


def runs_of(client: Client, session_id: str) -> set[str]:
    return {r.run_id for r in client.runs.list(session_id=session_id)}


def no_slot_held(client: Client, session_id: str) -> None:
    """Once every run ended: a first attempt's slot would be held until its TTL."""
    wait_until(
        lambda: client.capacity.snapshot(session_id, 1).used == 0,
        timeout=WAIT_S,
        what="every slot of the session to be freed",
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_r_res_1_a_resume_sent_again_after_its_node_died_is_one_run_with_one_slot(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, point: str
) -> None:
    first = start_node(state_dir=state_dir)
    launch, source = finished_run(first.client(timeout=20), agents)
    assert first.stop().returncode == 0
    resume = resume_of(source)
    dying = start_node("--faults", state_dir=state_dir, kill_at=point)
    with pytest.raises(SubagentsError):  # the node went: the outcome is unknown
        dying.client(timeout=10).ask(resume, LaunchResult)
    assert dying.wait_exited(WAIT_S), f"the node did not die at {point}"
    client = start_node(state_dir=state_dir).client(timeout=20)

    again = client.ask(resume, LaunchResult).run

    assert again.run_id == run_id_of(str(resume.launch_id))
    assert runs_of(client, launch.session_id) == {source.run_id, again.run_id}
    assert client.runs.wait(again.run_id, timeout=WAIT_S).state == "complete"
    no_slot_held(client, launch.session_id)
    assert client.ask(resume, LaunchResult).run.run_id == again.run_id  # once it ended, too
    assert runs_of(client, launch.session_id) == {source.run_id, again.run_id}


@pytest.mark.slow
def test_r_fan_15_a_nested_resume_sent_again_claims_its_callers_budget_once(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """A run's child resumes a run: one path (`resume[ID]`) on its caller's budget. Its node
    killed once that claim was recorded, the resume sent again claimed the path a second time
    (paths are labels, not keys: R-FAN-11); under its launch id, the claim is found."""
    first = start_node(state_dir=state_dir)
    launch, source = finished_run(first.client(timeout=20), agents)
    budget = first.client().fanout.create(f"caller-{uuid.uuid4().hex[:8]}", 5)
    assert first.stop().returncode == 0
    route = {"depth": 1, "inherited_fanout": encode_descriptor(budget)}
    resume = resume_of(source).model_copy(update=route)
    dying = start_node("--faults", state_dir=state_dir, kill_at="claim_recorded")
    with pytest.raises(SubagentsError):  # the node went: the outcome is unknown
        dying.client(timeout=10).ask(resume, LaunchResult)
    assert dying.wait_exited(WAIT_S), "the node did not die at claim_recorded"
    client = start_node(state_dir=state_dir).client(timeout=20)

    again = client.ask(resume, LaunchResult).run

    assert client.runs.wait(again.run_id, timeout=WAIT_S).state == "complete"
    assert runs_of(client, launch.session_id) == {source.run_id, again.run_id}
    assert client.fanout.snapshot(budget).used == 1


def test_a_rerun_sent_twice_under_one_launch_id_is_one_run(client: Client, agents: Path) -> None:
    launch, source = finished_run(client, agents)
    rerun = Rerun(run_id=source.run_id, task="once more", launch_id=uuid.uuid4().hex)

    first = client.ask(rerun, LaunchResult).run
    second = client.ask(rerun, LaunchResult).run

    assert first.run_id == second.run_id
    assert runs_of(client, launch.session_id) == {source.run_id, first.run_id}
    assert client.runs.wait(first.run_id, timeout=WAIT_S).state == "complete"


def test_r_res_6_an_attach_sent_twice_under_one_launch_id_is_one_chain_with_one_slot(
    client: Client, agents: Path, gate: Gate
) -> None:
    """A chain attached to a live run takes a slot of its own: sent twice, it took two (with a
    limit of two, the third attach would still have been refused)."""
    ctx = launch_context(agents, session=new_session(), max_active_async_runs_per_session=2)
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1, timeout=WAIT_S)
    steps = [ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="after {previous}")])]
    attach = attach_request(source.run_id, steps, capacity_limit=2)
    attach = attach.model_copy(update={"launch_id": uuid.uuid4().hex})

    first = client.ask(attach, LaunchResult).run
    second = client.ask(attach, LaunchResult).run

    assert first.run_id == second.run_id
    assert runs_of(client, source.session_id) == {source.run_id, first.run_id}
    assert client.capacity.snapshot(source.session_id, 2).used == 2
    held.release(0)
    assert client.runs.wait(first.run_id, timeout=WAIT_S).state == "complete"
    no_slot_held(client, source.session_id)


def test_r_run_2_a_paused_runs_resume_sent_twice_under_one_launch_id_is_its_one_continuation(
    client: Client, agents: Path
) -> None:
    """The second send was refused ("is being continued as run …" / "was paused and resumed
    already"): safe, but its caller, whose first answer was lost, never learnt the run."""
    ctx = launch_context(agents, session=new_session(), max_active_async_runs_per_session=1)
    chain = [
        ChainStep(items=[TaskItem(agent=ctx.plan("sleeper"), task="seconds=600")]),
        ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="{previous} then done")]),
    ]
    source = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    wait_until(
        lambda: client.runs.show(source.run_id).children[0].state == "running",
        timeout=WAIT_S,
        what="the chain's first child to run",
    )
    client.runs.pause(source.run_id)
    wait_until(
        lambda: client.runs.show(source.run_id).state == "paused",
        timeout=WAIT_S,
        what="the chain to pause",
    )
    resume = resume_of(source).model_copy(update={"message": "seconds=0"})

    first = client.ask(resume, LaunchResult).run
    second = client.ask(resume, LaunchResult).run

    assert first.run_id == second.run_id
    assert runs_of(client, ctx.session_id) == {source.run_id, first.run_id}
    done = client.runs.wait(first.run_id, timeout=WAIT_S)
    assert (done.state, done.output) == ("complete", "slept 0 then done")
    no_slot_held(client, ctx.session_id)


def test_r_res_6_an_attach_sent_as_a_workflows_resume_item_is_refused_as_before_any_key(
    client: Client, agents: Path, gate: Gate
) -> None:
    """A workflow key on an attach is no key to look a run up by: the attach is refused for
    what it is, not answered with a workflow child or refused as one."""
    ctx = launch_context(agents, session=new_session(), max_active_async_runs_per_session=2)
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1, timeout=WAIT_S)
    steps = [ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="after {previous}")])]
    item = attach_request(source.run_id, steps, capacity_limit=2).model_copy(
        update={"parent_run_id": source.run_id, "workflow_key": "k"}
    )

    with pytest.raises(RunNotResumable, match="cannot be attached"):
        client.ask(item, LaunchResult)

    assert runs_of(client, source.session_id) == {source.run_id}
    held.release(0)


def test_a_launch_id_a_launch_used_is_refused_on_a_resume_and_changes_nothing(
    client: Client, agents: Path
) -> None:
    launch, source = finished_run(client, agents)
    taken = uuid.uuid4().hex
    client.runs.launch(launch.model_copy(update={"launch_id": taken}))
    before = runs_of(client, launch.session_id)
    resume = resume_of(source).model_copy(update={"launch_id": taken})

    with pytest.raises(LaunchIdConflict) as refused:
        client.ask(resume, LaunchResult)

    assert refused.value.details["launch_id"] == taken
    assert "\n" not in refused.value.message
    assert runs_of(client, launch.session_id) == before


def test_a_workflow_resume_item_is_sent_again_under_its_key_not_a_launch_id() -> None:
    with pytest.raises(ValueError, match="not a launch_id"):
        Resume(run_id="abc", parent_run_id="p", workflow_key="k", launch_id="x")


@pytest.mark.slow
def test_r_res_1_resume_at_the_command_line_rides_out_a_node_lost_mid_resume_with_one_run(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """`resume` whose node died after recording the run: it exited 4 ("outcome unknown"), and
    the user's second `resume` made a second run. Now it waits for the next node, sends the
    resume again under its launch id, and prints the one run."""
    first = start_node(state_dir=state_dir)
    launch, source = finished_run(first.client(timeout=20), agents)
    assert first.stop().returncode == 0
    dying = start_node("--faults", state_dir=state_dir, kill_at="answer_launch")
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": "1"}
    command = [*CLI, "--state-dir", str(state_dir), "resume", source.run_id]
    with subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True, env=env) as cli:
        assert dying.wait_exited(WAIT_S), "the node did not die at answer_launch"
        client = start_node(state_dir=state_dir).client(timeout=20)
        out, err = cli.communicate(timeout=WAIT_S)

    assert cli.returncode == 0, err
    [again] = runs_of(client, launch.session_id) - {source.run_id}
    assert again in out
    assert client.runs.wait(again, timeout=WAIT_S).state == "complete"
    no_slot_held(client, launch.session_id)
