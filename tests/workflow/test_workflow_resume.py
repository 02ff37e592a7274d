"""Workflow resume and `resume` items (SPEC R-WF-5, R-FAN-23, A-19).

- A workflow run whose node was killed with -9 (its host with it) is resumed with
  `runs.resume`: the new workflow run reruns the script under the same budget, reuses the
  steps its source finished (not run again, the same child run) and relaunches the one that
  failed on its original claim: nothing is claimed twice, and no run or slot is left behind.
- A workflow resume that fails at any admission step rolls its fresh `workflow` slot back and
  claims nothing (R-ADM-2/3).
- A `resume` item relaunches a finished child under a new key on the child's own claim.
- A `runs.all` batch is one admission group: when its admission is refused, its `resume` items
  fail with it and none of the batch starts (A-19).

Real host processes, real children, real nodes (a detached one for the kill -9); every wait is
on an event or re-reads a snapshot with a deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from subagents_node.actors.runs.admission import FAULT_POINTS
from subagents_node.client import listing
from subagents_node.client.client import Client
from subagents_node.messages.errors import InjectedFault
from subagents_node.messages.fanout import decode_descriptor, extend
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import LaunchResult, RunView
from subagents_node.workflow import resumed
from subagents_node.workflow.launch import workflow_launch, workflow_result
from tests.support.manage import embedded
from tests.support.nodes import NodeProcess, new_state_dir
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.runs import Gate, launch_context, new_session, wait_until

WAIT_S = 30.0
LIMIT = 2


@pytest.fixture
def work() -> Iterator[Path]:
    directory = new_state_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def gate(work: Path) -> Iterator[Gate]:
    opened = Gate(work)
    yield opened
    opened.close()


def launch_workflow(
    client: Client,
    agents: Path,
    work: Path,
    script: str,
    background: bool,
    env: dict[str, str] | None = None,
    **config: Any,
) -> tuple[RunView, str]:
    path = work / "workflow.py"
    path.write_text(textwrap.dedent(script))
    session = new_session()
    ctx = launch_context(
        agents,
        session=session,
        cwd=work,
        env=env,
        max_active_async_runs_per_session=LIMIT,
        **config,
    )
    launch = workflow_launch(ctx, path, background=background, agents_dirs=(str(agents),))
    return client.runs.launch(launch), session


def children_of(client: Client, run_id: str) -> dict[str, RunView]:
    return {
        r.workflow_key or r.run_id: r
        for r in client.runs.list(limit=1000)
        if r.parent_run_id == run_id
    }


def value_of(run: RunView) -> Any:
    found = workflow_result(run)
    assert found is not None, f"no result.json in {run.run_dir}"
    return found


@pytest.mark.slow
def test_r_wf_5_a_workflow_resumed_after_kill_9_of_the_node_does_not_run_its_finished_steps_again(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    work: Path,
    gate: Gate,
) -> None:
    script = f"""
    def main(runs):
        first = runs.run("a", "echo", "A")
        second = runs.run("b", "gate", {str(gate.path)!r})
        return {{"a": first.run_id, "b": second.run_id, "b_state": second.state}}
    """
    first_node = start_node(state_dir=state_dir)
    client = first_node.client(timeout=20)
    flow, session = launch_workflow(client, agents, work, script, background=True)
    [held] = gate.accept(1)
    before = children_of(client, flow.run_id)
    assert before["a"].state == "complete" and before["b"].state == "running"
    budget = decode_descriptor(flow.fanout_descriptor)
    assert client.fanout.snapshot(budget).used == 2
    host_pid = client.runs.show(flow.run_id).children[0].pid
    assert host_pid is not None

    # The crash: the node with -9, its workflow host with it; the gated step then fails.
    first_node.kill()
    os.kill(host_pid, signal.SIGKILL)
    held.release(1)
    held.wait_exit()

    client = start_node(state_dir=state_dir).client(timeout=20)
    assert client.runs.wait(flow.run_id, timeout=WAIT_S).state == "failed"
    assert client.runs.wait(before["b"].run_id, timeout=WAIT_S).state == "failed"

    resumed = client.ask(
        Resume(run_id=flow.run_id, capacity_limit=LIMIT, env=dict(os.environ)), LaunchResult
    ).run
    [again] = gate.accept(1)
    again.release(0)
    done = client.runs.wait(resumed.run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    assert (done.mode, done.source_run_id, done.source_kind) == ("workflow", flow.run_id, "resume")
    assert done.fanout_descriptor == flow.fanout_descriptor  # the same budget (R-RES-4)
    result = value_of(done)
    # `a` finished before the crash: the same run, not run again; `b` failed: launched again.
    assert result["value"]["a"] == before["a"].run_id
    assert result["value"]["b"] != before["b"].run_id and result["value"]["b_state"] == "complete"
    assert sorted(children_of(client, done.run_id)) == ["b"]
    steps = {s["workflowKey"]: s for s in result["steps"]}
    assert steps["a"]["sourceRunId"] == flow.run_id and steps["a"]["status"] == "completed"
    assert [e["event"] for e in result["trace"] if e["key"] == "a"] == ["reused"]
    # Nothing was claimed again (R-FAN-23): `workflow[a]` and `workflow[b]` once each.
    assert client.fanout.snapshot(budget).used == 2
    # No run is stuck and no slot leaked.
    assert client.runs.list(active_only=True) == []
    wait_until(lambda: client.capacity.snapshot(session, LIMIT).used == 0, what="release")


def test_r_fan_23_a_resumed_workflow_claims_no_key_its_source_admitted_even_one_never_launched(
    client: Client, agents: Path, work: Path
) -> None:
    """A-6: `second` was admitted (claimed) but refused by the node, so no run shows it; the
    source host's status.json does, and the resume does not claim it again."""
    script = """
    def main(runs):
        ok, second = runs.all([
            {"key": "first", "agent": "echo", "task": "fits"},
            {"key": "second", "agent": "echo", "task": "over the session cap"},
        ])
        return {"first": ok.run_id, "second": second.run_id}
    """
    env = {"SUBAGENTS_MAX_SPAWNS_PER_SESSION": "1"}
    flow, _ = launch_workflow(client, agents, work, script, background=False, env=env)
    source = client.runs.wait(flow.run_id, timeout=WAIT_S)
    assert value_of(source)["value"]["second"] is None  # admitted, never launched
    budget = decode_descriptor(flow.fanout_descriptor)
    assert client.fanout.snapshot(budget).used == 2

    request = Resume(run_id=flow.run_id, capacity_limit=LIMIT, env=dict(os.environ))
    resumed = client.ask(request, LaunchResult).run
    done = client.runs.wait(resumed.run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    assert value_of(done)["value"]["first"] == value_of(source)["value"]["first"]  # reused
    assert client.fanout.snapshot(budget).used == 2  # neither key claimed again


def test_r_fan_23_a_resume_item_claims_its_own_key_and_nothing_of_its_sources(
    client: Client, agents: Path, work: Path
) -> None:
    """R-FAN-23 as we adapt it: the relaunch claims nothing on its source's behalf (the child
    it revives keeps its claim), but the item is a launch of this workflow's, so it claims its
    own key, `workflow[a2]`, as a member would: uncharged, a script could relaunch children
    without bound (docs/workflows.md)."""
    script = """
    def main(runs):
        first = runs.run("a", "echo", "first")
        used = runs.budget().used
        again = runs.resume("a2", "a", "second")
        return {"first": first.run_id, "again": again.run_id, "state": again.state,
                "used_before": used, "used_after": runs.budget().used}
    """
    flow, _ = launch_workflow(client, agents, work, script, background=False)
    done = client.runs.wait(flow.run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    value = value_of(done)["value"]
    assert value["state"] == "complete"
    assert (value["used_before"], value["used_after"]) == (1, 2)
    kids = children_of(client, flow.run_id)
    first, again = kids["a"], kids["a2"]
    assert (first.run_id, again.run_id) == (value["first"], value["again"])
    assert (again.source_run_id, again.source_kind) == (first.run_id, "resume")
    # The workflow's route under the item's own key (R-FAN-10, R-FAN-12), on the same budget.
    assert decode_descriptor(again.fanout_descriptor) == extend(
        decode_descriptor(flow.fanout_descriptor), "workflow[a2]"
    )
    assert again.output.split() == ["first", "second"]
    assert again.snapshots.capacity_used is None  # a workflow child takes no capacity
    assert client.fanout.snapshot(decode_descriptor(flow.fanout_descriptor)).used == 2
    steps = {s["workflowKey"]: s for s in value_of(done)["steps"]}
    assert steps["a2"]["resume"] is True and steps["a2"]["sourceRunId"] == first.run_id


def test_r_fan_10_a_resume_item_of_a_run_from_another_tree_runs_under_its_workflows_budget(
    client: Client, agents: Path, work: Path
) -> None:
    """A workflow-child revival uses the workflow's descriptor extended by `workflow[key]`
    (R-FAN-12), not its source's: a fan-out child it relaunches claims its nested launches
    from this workflow's budget, not from the tree the source ran in. Nothing is claimed on
    the source's budget (R-FAN-23); the item claims its own key on the workflow's."""
    ctx = launch_context(agents)
    outside = client.runs.launch(ctx.single("echo", "outside", True, None))
    outside = client.runs.wait(outside.run_id, timeout=WAIT_S)
    outside_budget = decode_descriptor(outside.fanout_descriptor)
    outside_used = client.fanout.snapshot(outside_budget).used
    script = f"""
    def main(runs):
        return runs.resume("again", "{outside.run_id}", "more").state
    """
    flow, _ = launch_workflow(client, agents, work, script, background=False)
    done = client.runs.wait(flow.run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    assert value_of(done)["value"] == "complete"
    again = children_of(client, flow.run_id)["again"]
    assert again.source_run_id == outside.run_id
    assert decode_descriptor(again.fanout_descriptor) == extend(
        decode_descriptor(flow.fanout_descriptor), "workflow[again]"
    )
    assert client.fanout.snapshot(decode_descriptor(flow.fanout_descriptor)).used == 1
    assert client.fanout.snapshot(outside_budget).used == outside_used


def test_a_workflow_that_resumes_in_a_loop_is_stopped_by_its_budget(
    client: Client, agents: Path, work: Path
) -> None:
    """Each resume item claims its key, so a script relaunching one finished child under new
    keys is refused once the workflow's budget is spent, and the refused item starts nothing."""
    script = """
    from subagents_node.errors import FanoutLimitExceeded

    def main(runs):
        runs.run("a", "echo", "first")
        done = 0
        try:
            for i in range(10):
                runs.resume(f"again{i}", "a", "more")
                done += 1
        except FanoutLimitExceeded as err:
            return {"relaunched": done, "path": err.rejection.path}
        return {"relaunched": done, "path": None}
    """
    flow, _ = launch_workflow(
        client, agents, work, script, background=False, max_subagent_spawns_per_run=3
    )
    done = client.runs.wait(flow.run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    assert value_of(done)["value"] == {"relaunched": 2, "path": "workflow[again2]"}
    assert len([r for r in client.runs.list(limit=1000) if r.source_run_id]) == 2
    assert client.fanout.snapshot(decode_descriptor(flow.fanout_descriptor)).used == 3


def test_a_19_a_refused_admission_fails_the_batchs_resume_items_too_and_starts_nothing(
    client: Client, agents: Path, work: Path
) -> None:
    script = """
    from subagents_node.errors import FanoutLimitExceeded

    def main(runs):
        first = runs.run("a", "echo", "first")
        try:
            runs.all([
                {"key": "r", "resume": "a", "task": "more"},
                {"key": "x", "agent": "echo", "task": "x"},
                {"key": "y", "agent": "echo", "task": "y"},
            ])
        except FanoutLimitExceeded as err:
            return {"refused": err.message, "first": first.run_id}
        return {"refused": None}
    """
    flow, _ = launch_workflow(
        client, agents, work, script, background=False, max_subagent_spawns_per_run=2
    )
    done = client.runs.wait(flow.run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    result = value_of(done)
    assert result["value"]["refused"] is not None
    # The resume item waited on the group's admission and failed with it: nothing started.
    assert sorted(children_of(client, flow.run_id)) == ["a"]
    assert [r for r in client.runs.list(limit=1000) if r.source_run_id] == []
    failed = [e["key"] for e in result["trace"] if e["event"] == "failed"]
    assert sorted(failed) == ["r", "x", "y"]
    assert [s["workflowKey"] for s in result["steps"]] == ["a"]
    assert client.fanout.snapshot(decode_descriptor(flow.fanout_descriptor)).used == 1


@pytest.mark.slow
@pytest.mark.parametrize("point", FAULT_POINTS)
def test_r_wf_5_a_workflow_resume_failing_at_each_admission_step_rolls_its_slot_back(
    state_dir: Path, agents: Path, work: Path, point: str
) -> None:
    script = """
    def main(runs):
        return runs.run("a", "echo", "A").run_id
    """
    with embedded(state_dir) as first:
        client = first.client()
        flow, session = launch_workflow(client, agents, work, script, background=True)
        assert client.runs.wait(flow.run_id, timeout=WAIT_S).state == "complete"
        wait_until(lambda: client.capacity.snapshot(session, LIMIT).used == 0, what="release")

    with embedded(state_dir, faults=True, settings={"fault_points": [point]}) as node:
        client = node.client()
        budget = decode_descriptor(flow.fanout_descriptor)
        before = client.fanout.snapshot(budget)
        request = Resume(run_id=flow.run_id, capacity_limit=LIMIT, env=dict(os.environ))
        with pytest.raises(InjectedFault) as failed:
            client.ask(request, LaunchResult)
        assert failed.value.point == point

        strays = [r for r in client.runs.list(limit=1000) if r.source_run_id == flow.run_id]
        if point == "mark_started":  # recorded before the step failed: failed, owns nothing
            [stray] = strays
            assert client.runs.wait(stray.run_id, timeout=WAIT_S).state in ("failed", "stopped")
            assert client.capacity.inspect(stray.run_id, session).relation == "none"
        else:
            assert strays == []
        wait_until(lambda: client.capacity.snapshot(session, LIMIT).used == 0, what="rollback")
        assert client.fanout.snapshot(budget) == before  # a resume claims nothing (R-FAN-23)


def test_r_wf_5_a_resume_finds_every_finished_key_of_a_source_with_more_children_than_a_page(
    client: Client, agents: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of the source's children pages on past the node's listing cap (lowered to 2
    here, in place of 1,000 real runs): every key the source finished is found, so none is run
    again; a read capped at one listing missed the older ones."""
    keys = [f"k{n}" for n in range(5)]
    calls = "\n".join(f"        runs.run({k!r}, 'echo', {k!r})" for k in keys)
    script = f"""
    def main(runs):
{calls}
        return "done"
    """
    flow, _ = launch_workflow(client, agents, work, script, background=False)
    source = client.runs.wait(flow.run_id, timeout=WAIT_S)
    assert source.state == "complete", source.error
    monkeypatch.setattr(listing, "PAGE", 2)

    prior = resumed.prior_steps(client, source.run_id)

    assert sorted(prior.runs) == keys
    assert {k: r.output for k, r in prior.runs.items()} == {k: k for k in keys}
    assert {r.parent_run_id for r in prior.runs.values()} == {source.run_id}


def test_a_fifo_in_place_of_a_sources_status_json_never_wedges_the_resumed_host(
    client: Client, agents: Path, work: Path
) -> None:
    """The resumed host reads its source's status.json (the keys it admitted). A FIFO a child
    of the source put there made that read wait for a writer for good: the resumed workflow
    stayed `running`, holding its slot. It is now read as a regular file only, and a file it
    cannot read counts as none."""
    script = """
    def main(runs):
        return runs.run("first", "echo", "hi").run_id
    """
    flow, _ = launch_workflow(client, agents, work, script, background=False)
    source = client.runs.wait(flow.run_id, timeout=WAIT_S)
    assert source.state == "complete", source.error
    status = Path(source.run_dir) / "status.json"
    status.unlink()
    os.mkfifo(status)

    request = Resume(run_id=flow.run_id, capacity_limit=LIMIT, env=dict(os.environ))
    resumed = client.ask(request, LaunchResult).run
    done = client.runs.wait(resumed.run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    assert value_of(done)["value"] == value_of(source)["value"]  # its child reused


def test_a_fifo_or_symlink_at_a_hosts_temp_file_names_never_wedges_it_nor_is_written_through(
    client: Client, agents: Path, work: Path
) -> None:
    """The host wrote status.json, result.json and the aggregate through fixed temp names
    (`.status.json.tmp`) in dirs its children write to: a FIFO a child put at one made the
    host wait for a reader for good at its next status write, the workflow wedged with its
    budget claimed; a symlink there was written through. Temp files now get fresh names
    (O_EXCL, O_NOFOLLOW), and what was planted is left as it was."""
    victim = work / "victim.txt"
    victim.write_text("untouched\n")
    script = f"""
    import os

    def main(runs):
        runs.run("first", "echo", "hi")
        run_dir = os.path.dirname(os.environ["SUBAGENTS_CHILD_DIR"])
        os.mkfifo(os.path.join(run_dir, ".status.json.tmp"))
        os.symlink({str(victim)!r}, os.path.join(run_dir, ".result.json.tmp"))
        os.mkfifo({str(work / ".report.md.tmp")!r})
        return runs.run("second", "echo", "there").state
    """
    aggregate = work / "report.md"
    path = work / "workflow.py"
    path.write_text(textwrap.dedent(script))
    ctx = launch_context(agents, session=new_session(), cwd=work)
    launch = workflow_launch(
        ctx, path, background=False, output=str(aggregate), agents_dirs=(str(agents),)
    )
    done = client.runs.wait(client.runs.launch(launch).run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    assert value_of(done)["value"] == "complete"
    assert victim.read_text() == "untouched\n"
    assert "Workflow completed with 2 child run(s)." in aggregate.read_text()
    run_dir = Path(done.run_dir)
    assert sorted(p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")) == [
        ".result.json.tmp",
        ".status.json.tmp",
    ]


def test_a_resume_whose_script_became_a_fifo_fails_in_one_line_instead_of_hanging(
    client: Client, agents: Path, work: Path
) -> None:
    """A resume runs the script found at its path now. One replaced by a FIFO (the launch's
    own check is not made again) made runpy wait for a writer for good: the resumed workflow
    stayed `running`, holding its slot. The host now refuses anything but a regular file."""
    script = """
    def main(runs):
        return runs.run("first", "echo", "hi").run_id
    """
    flow, _ = launch_workflow(client, agents, work, script, background=False)
    assert client.runs.wait(flow.run_id, timeout=WAIT_S).state == "complete"
    (work / "workflow.py").unlink()
    os.mkfifo(work / "workflow.py")

    request = Resume(run_id=flow.run_id, capacity_limit=LIMIT, env=dict(os.environ))
    resumed = client.ask(request, LaunchResult).run
    done = client.runs.wait(resumed.run_id, timeout=WAIT_S)

    assert done.state == "failed"
    assert (
        done.error == f"TypeError: the workflow script {work / 'workflow.py'} is not a regular file"
    )
