"""Workflows end to end: a real host process per workflow, real children, a real node (SPEC §12).

Each test writes a small workflow script, launches it as `subagents-node workflow` would
(subagents_node.workflow_launch) on an embedded node whose ipc socket the host and its
children reach through $SUBAGENTS_NODE, and reads what the node and the host's files say:
child runs (their parent is the workflow), the fan-out budget, the capacity pool and
result.json. Gate children (tests.runs_support) hold a workflow open until the test releases
them; every wait is on an event or re-reads a snapshot with a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from subagents_node.client.client import Client
from subagents_node.messages.errors import (
    BadRequest,
    InjectedFault,
    IntercomOff,
    InvalidTimeout,
    WorkflowChildRefused,
)
from subagents_node.messages.fanout import decode_descriptor, encode_descriptor, extend
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import Intercom, IntercomMessage, IntercomMode, RunView
from subagents_node.node.node import Node
from subagents_node.workflow.api import (
    WorkflowEnv,
    WorkflowOutputCollision,
    WorkflowRuns,
    WorkflowSettled,
)
from subagents_node.workflow.launch import workflow_launch, workflow_result
from subagents_node.workflow.outputs import (
    aggregate_path,
    check_collisions,
    default_output,
    resolve_output,
)
from tests.support.manage import embedded
from tests.support.nodes import new_state_dir, run_cli
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.runs import (
    Gate,
    launch_context,
    new_session,
    process_gone,
    wait_until,
    wait_view,
    write_agent,
)

WAIT_S = 30.0


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


class Workflow:
    """One launched workflow: its run, its session, and what it left behind."""

    def __init__(self, client: Client, run: RunView, session: str, capacity_limit: int) -> None:
        self.client = client
        self.run = run
        self.session = session
        self.capacity_limit = capacity_limit

    def wait(self) -> RunView:
        self.run = self.client.runs.wait(self.run.run_id, timeout=WAIT_S)
        return self.run

    def result(self) -> dict[str, Any]:
        found = workflow_result(self.run)
        assert found is not None, f"no result.json in {self.run.run_dir}"
        return found

    def value(self) -> Any:
        return self.result()["value"]

    def children(self) -> dict[str, RunView]:
        """The workflow's child runs by key (the node's view, not the host's)."""
        runs = self.client.runs.list(limit=1000)
        return {r.workflow_key or r.run_id: r for r in runs if r.parent_run_id == self.run.run_id}

    def fanout_used(self) -> int:
        return self.client.fanout.snapshot(decode_descriptor(self.run.fanout_descriptor)).used

    def capacity_used(self) -> int:
        return self.client.capacity.snapshot(self.session, self.capacity_limit).used


def start_workflow(
    client: Client,
    agents: Path,
    work: Path,
    script: str,
    *,
    background: bool = False,
    output: str | None = None,
    timeout_ms: int | None = None,
    env: dict[str, str] | None = None,
    intercom: IntercomMode = "on",
    **config: Any,
) -> Workflow:
    path = work / "workflow.py"
    path.write_text(textwrap.dedent(script))
    session = new_session()
    ctx = launch_context(agents, session=session, cwd=work, env=env, **config)
    launch = workflow_launch(
        ctx,
        path,
        background=background,
        output=output,
        timeout_ms=timeout_ms,
        agents_dirs=(str(agents),),
        intercom=intercom,
    )
    run = client.runs.launch(launch)
    limit = int(config.get("max_active_async_runs_per_session", 0))
    return Workflow(client, run, session, limit)


# -- admission groups (R-WF-5, R-WF-6, R-WF-8) ---------------------------------------------------

_THREE_BATCHES = """
from subagents_node.errors import WorkflowOutputCollision

def main(runs):
    first = runs.all([
        {"key": "a1", "agent": "echo", "task": "one"},
        {"key": "a2", "agent": "echo", "task": "two"},
    ])
    before = runs.budget().used
    try:
        runs.all(SECOND)
        collided = None
    except WorkflowOutputCollision as err:
        collided = err.message
    after = runs.budget().used
    third = runs.all([
        {"key": "c1", "agent": "echo", "task": "five"},
        {"key": "c2", "agent": "echo", "task": "six"},
    ])
    return {
        "before": before,
        "after": after,
        "collided": collided,
        "outputs": [r.output for r in first + third],
    }
"""

_SECOND_BATCHES = {
    "two children on one path": (
        '[{"key": "b1", "agent": "echo", "task": "three", "output": "same.md"},'
        ' {"key": "b2", "agent": "echo", "task": "four", "output": "same.md"}]',
        "Workflow children 'b1' and 'b2' resolve output to the same path: {work}/same.md. "
        "Use distinct child output paths.",
    ),
    "a child on the aggregate path": (
        '[{"key": "b1", "agent": "echo", "task": "three"},'
        ' {"key": "b2", "agent": "echo", "task": "four", "output": "report.md"}]',
        "Workflow child 'b2' output resolves to the workflow aggregate output path: "
        "{work}/report.md. Use a distinct child output path.",
    ),
    "a path an earlier group claimed": (
        '[{"key": "b1", "agent": "echo", "task": "three", "output": "report.a1.md"}]',
        "Workflow children 'a1' and 'b1' resolve output to the same path: {work}/report.a1.md. "
        "Use distinct child output paths.",
    ),
}


@pytest.mark.parametrize("case", list(_SECOND_BATCHES))
def test_r_wf_8_a_colliding_batch_consumes_no_fanout_and_the_batches_around_it_run(
    client: Client, agents: Path, work: Path, case: str
) -> None:
    second, message = _SECOND_BATCHES[case]
    flow = start_workflow(
        client, agents, work, _THREE_BATCHES.replace("SECOND", second), output="report.md"
    )

    assert flow.wait().state == "complete", flow.run.error
    value = flow.value()
    assert value["collided"] == message.format(work=work)
    # R-WF-6: the collision was refused before the claim, so the budget did not move.
    assert (value["before"], value["after"]) == (2, 2)
    assert value["outputs"] == ["one", "two", "five", "six"]
    assert sorted(flow.children()) == ["a1", "a2", "c1", "c2"]
    assert flow.fanout_used() == 4
    # R-WF-7: children without an output write beside the aggregate as NAME.KEY.EXT.
    steps = {s["workflowKey"]: s for s in flow.result()["steps"]}
    assert steps["a1"]["outputPath"] == str(work / "report.a1.md")


def test_r_fan_16_a_group_over_the_fanout_limit_starts_nothing_and_claims_nothing(
    client: Client, agents: Path, work: Path
) -> None:
    """R-FAN-22: a workflow's children are claimed per admission batch, `workflow[key]` each,
    all or nothing (R-WF-6)."""
    script = """
    from subagents_node.errors import FanoutLimitExceeded

    def main(runs):
        try:
            runs.all([{"key": f"k{i}", "agent": "echo", "task": str(i)} for i in range(3)])
        except FanoutLimitExceeded as err:
            refused = {"message": err.message, **err.rejection.model_dump()}
        used_after_refusal = runs.budget().used
        fits = runs.all([{"key": f"k{i}", "agent": "echo", "task": str(i)} for i in range(2)])
        return {"refused": refused, "used": used_after_refusal, "ran": [r.key for r in fits]}
    """
    flow = start_workflow(client, agents, work, script, max_subagent_spawns_per_run=2)

    assert flow.wait().state == "complete", flow.run.error
    value = flow.value()
    refused = value["refused"]
    assert (refused["requested"], refused["used"], refused["limit"]) == (3, 0, 2)
    assert (refused["remaining"], refused["path"]) == (2, "workflow[k2]")
    assert "No children from this admission group were started." in refused["message"]
    assert value["used"] == 0
    assert value["ran"] == ["k0", "k1"]
    assert sorted(flow.children()) == ["k0", "k1"]
    assert flow.fanout_used() == 2
    # The refused members are in the trace as failed, and never became steps.
    trace = flow.result()["trace"]
    assert [e["event"] for e in trace[:3]] == ["failed"] * 3
    assert [s["workflowKey"] for s in flow.result()["steps"]] == ["k0", "k1"]


def test_a_runs_all_entry_missing_its_task_or_with_an_unknown_field_is_named_as_such(
    client: Client, agents: Path, work: Path
) -> None:
    """A `runs.all` entry without a task was refused with "runs.run needs 'task'", and one
    with a misspelt field with "unknown runs.run argument(s)": a script that called only
    runs.all was sent looking for a runs.run call. The messages name the entry by its key."""
    script = """
    from subagents_node.errors import WorkflowCallInvalid

    def main(runs):
        said = []
        for entry in ({"key": "a", "agent": "echo"}, {"agent": "echo", "task": "x"},
                      {"key": "b", "agent": "echo", "task": "x", "taks": "y"},
                      {"key": "c", "agent": "echo", "task": 3}):
            try:
                runs.all([entry])
            except WorkflowCallInvalid as err:
                said.append(err.message)
        return {"said": said, "used": runs.budget().used}
    """
    flow = start_workflow(client, agents, work, script)

    assert flow.wait().state == "complete", flow.run.error
    said = flow.value()["said"]
    assert said[0] == "runs.all entry 'a' needs 'task'"
    assert said[1] == "runs.all entry needs 'key'"
    assert said[2].startswith("runs.all entry 'b': unknown field 'taks' (an entry's fields")
    assert said[3] == "runs.all entry 'c': invalid task: 3"
    assert not any("runs.run" in message for message in said)
    assert flow.value()["used"] == 0


def test_r_wf_5_a_member_the_node_would_refuse_refuses_its_group_before_any_claim(
    client: Client, agents: Path, work: Path
) -> None:
    """A task over the size cap or one exec(2) would refuse in argv is found when the group is
    built: the whole group raises its typed error, nothing is claimed or launched."""
    script = """
    from subagents_node.errors import TaskUndeliverable, WorkflowCallInvalid

    def main(runs):
        codes = []
        for task in ("x" * 600_000, "nul\\x00byte"):
            try:
                runs.all([{"key": "fits", "agent": "echo", "task": "1"},
                          {"key": "bad", "agent": "echo", "task": task}])
            except (TaskUndeliverable, WorkflowCallInvalid) as err:
                codes.append([err.code, err.message])
        try:
            runs.run("alone", "echo", "x" * 600_000)
        except WorkflowCallInvalid as err:
            codes.append([err.code, err.message])
        return {"codes": codes, "used": runs.budget().used}
    """
    flow = start_workflow(client, agents, work, script)

    assert flow.wait().state == "complete", flow.run.error
    value = flow.value()
    codes = [code for code, _ in value["codes"]]
    assert codes == ["workflow_call_invalid", "task_undeliverable", "workflow_call_invalid"]
    # A runs.all entry: the message names its key, not runs.run (which the script did not call).
    assert value["codes"][0][1].startswith("workflow key 'bad': invalid task: ")
    assert value["codes"][2][1].startswith("workflow key 'alone': invalid task: ")
    assert "NUL" in value["codes"][1][1] and "workflow key 'bad'" in value["codes"][1][1]
    assert value["used"] == 0
    assert not flow.children()
    assert flow.result()["steps"] == []


def test_r_wf_5_a_member_whose_working_directory_is_not_there_refuses_its_group_unclaimed(
    client: Client, agents: Path, work: Path
) -> None:
    """The host built such a member and claimed its key; the node then refused the launch
    (`cwd_missing`), so the child never ran and its claim, never refunded, was spent."""
    script = """
    from subagents_node.errors import RunCwdMissing

    def main(runs):
        messages = []
        for call in (lambda: runs.run("alone", "echo", "1", cwd="/nonexistent/dir"),
                     lambda: runs.all([{"key": "fits", "agent": "echo", "task": "1"},
                                       {"key": "bad", "agent": "echo", "task": "1",
                                        "cwd": "/etc/hostname/x"}])):
            try:
                call()
            except RunCwdMissing as err:
                messages.append(err.message)
        return {"messages": messages, "used": runs.budget().used}
    """
    flow = start_workflow(client, agents, work, script)

    assert flow.wait().state == "complete", flow.run.error
    value = flow.value()
    assert value["messages"] == [
        "workflow key 'alone': working directory does not exist: /nonexistent/dir",
        "workflow key 'bad': working directory does not exist: /etc/hostname/x",
    ]
    assert value["used"] == 0
    assert not flow.children()


def test_r_wf_4_same_key_same_parameters_reuses_and_different_parameters_are_refused(
    client: Client, agents: Path, work: Path
) -> None:
    script = """
    from subagents_node.errors import WorkflowKeyConflict, WorkflowKeyInvalid

    def main(runs):
        first = runs.run("scan", "echo", "same task")
        again = runs.run("scan", "echo", "same task")
        both = runs.all([
            {"key": "twin", "agent": "echo", "task": "t"},
            {"key": "twin", "agent": "echo", "task": "t"},
        ])
        refused = []
        for bad in (lambda: runs.run("scan", "echo", "other task"),
                    lambda: runs.run("-bad key", "echo", "x")):
            try:
                bad()
            except (WorkflowKeyConflict, WorkflowKeyInvalid) as err:
                refused.append(err.code)
        return {"same": first == again, "twins": [r.run_id for r in both],
                "refused": refused, "used": runs.budget().used}
    """
    flow = start_workflow(client, agents, work, script)

    assert flow.wait().state == "complete", flow.run.error
    value = flow.value()
    assert value["same"] is True
    assert value["twins"][0] == value["twins"][1]
    assert value["refused"] == ["workflow_key_conflict", "workflow_key_invalid"]
    assert value["used"] == 2  # scan and twin: reuses and refusals claim nothing
    assert sorted(flow.children()) == ["scan", "twin"]
    assert [e["event"] for e in flow.result()["trace"]].count("reused") == 2


def test_a_6_a_child_refused_after_admission_never_launched_and_is_classified_not_async(
    client: Client, agents: Path, work: Path
) -> None:
    script = """
    def main(runs):
        ok, refused = runs.all([
            {"key": "first", "agent": "echo", "task": "fits"},
            {"key": "second", "agent": "echo", "task": "over the session cap", "async": True},
        ])
        return {"ok": ok.success, "refused": [refused.success, refused.run_id, refused.error]}
    """
    env = {"SUBAGENTS_MAX_SPAWNS_PER_SESSION": "1"}
    flow = start_workflow(client, agents, work, script, env=env)

    assert flow.wait().state == "complete", flow.run.error
    ok, (success, run_id, error) = flow.value()["ok"], flow.value()["refused"]
    assert ok is True
    assert (success, run_id) == (False, None)
    assert error.startswith("Subagent spawn limit reached for this session")
    steps = {s["workflowKey"]: s for s in flow.result()["steps"]}
    assert (steps["second"]["status"], steps["second"]["async"]) == ("failed", False)
    assert steps["second"]["runId"] is None
    assert flow.fanout_used() == 2  # R-FAN-15: its claim stays
    assert sorted(flow.children()) == ["first"]


# -- which budget a workflow uses, and who claims for its children (R-FAN-9, R-FAN-20) ----------


def test_r_fan_9_a_workflow_a_fanout_child_starts_uses_the_inherited_budget_unchanged(
    client: Client, agents: Path, work: Path
) -> None:
    """No run-id segment is added (A-13): the children's paths are the inherited parent path
    and `workflow[key]`, and the inherited root's limit holds, whatever the child's config."""
    tree = client.fanout.create("tree", 3)
    client.fanout.claim(tree, ["single"])  # the launch of the child that starts the workflow
    inherited = extend(tree, "single")  # what that child (an agent with `fanout: true`) holds
    script = """
    from subagents_node.errors import FanoutLimitExceeded

    def main(runs):
        runs.all([{"key": "a", "agent": "echo", "task": "a"}])
        try:
            runs.all([{"key": "b", "agent": "echo", "task": "b"},
                      {"key": "c", "agent": "echo", "task": "c"}])
        except FanoutLimitExceeded as err:
            return {"path": err.rejection.path, "used": err.rejection.used}
    """
    env = {
        "SUBAGENTS_RUN_FANOUT": encode_descriptor(inherited),
        "SUBAGENTS_DEPTH": "1",
        "SUBAGENTS_MAX_DEPTH": "4",
    }
    flow = start_workflow(client, agents, work, script, env=env, max_subagent_spawns_per_run=50)

    assert flow.wait().state == "complete", flow.run.error
    assert decode_descriptor(flow.run.fanout_descriptor) == inherited
    assert flow.value() == {"path": "single/workflow[c]", "used": 2}
    assert decode_descriptor(flow.children()["a"].fanout_descriptor).parent_path == (
        "single/workflow[a]"
    )
    assert client.fanout.snapshot(tree).used == 2
    assert sorted(flow.children()) == ["a"]


def test_r_fan_9_a_top_level_workflow_gets_a_new_budget_of_its_own_each_time(
    client: Client, agents: Path, work: Path
) -> None:
    """The root run id is the workflow's short run id (our tool-call id, A-20)."""
    script = """
    def main(runs):
        return runs.run("a", "echo", "a").state
    """
    flows = [start_workflow(client, agents, work, script, max_subagent_spawns_per_run=7)]
    flows.append(start_workflow(client, agents, work, script, max_subagent_spawns_per_run=7))

    budgets = []
    for flow in flows:
        assert flow.wait().state == "complete", flow.run.error
        budget = decode_descriptor(flow.run.fanout_descriptor)
        assert (budget.root_run_id, budget.limit, budget.parent_path) == (
            flow.run.run_id[:8],
            7,
            "",
        )
        assert client.fanout.snapshot(budget).used == 1
        budgets.append(budget.budget_id)
    assert budgets[0] != budgets[1]


def test_r_fan_20_a_workflow_child_claims_nothing_itself_its_host_claimed_its_key(
    client: Client, agents: Path, work: Path
) -> None:
    """A budget of exactly one unit per child: a child claiming its own `single` on top of the
    host's `workflow[key]` would be refused, so every child running proves the skip."""
    script = """
    def main(runs):
        done = runs.all([{"key": f"k{i}", "agent": "echo", "task": str(i)} for i in range(3)])
        return [r.state for r in done]
    """
    flow = start_workflow(client, agents, work, script, max_subagent_spawns_per_run=3)

    assert flow.wait().state == "complete", flow.run.error
    assert flow.value() == ["complete"] * 3
    assert flow.fanout_used() == 3
    for key, child in flow.children().items():
        assert decode_descriptor(child.fanout_descriptor).parent_path == f"workflow[{key}]"
        assert child.snapshots.fanout_limit == 3


# -- R-FAN-24: only the workflow's own host may launch its children ---------------------------


def test_r_fan_24_a_forged_workflow_child_launch_is_refused_and_changes_nothing(
    client: Client, agents: Path, work: Path, gate: Gate
) -> None:
    script = f"""
    def main(runs):
        return runs.run("hold", "gate", {str(gate.path)!r}).output
    """
    flow = start_workflow(client, agents, work, script)
    [held] = gate.accept(1)
    running = wait_view(client, flow.run.run_id, lambda v: v.children[0].pid is not None)
    host_pid = running.children[0].pid
    ctx = launch_context(agents, session=flow.session, cwd=work)
    plain = ctx.single("echo", "forged", False, None)
    workflow_fields = {
        "parent_run_id": flow.run.run_id,
        "workflow_key": "forged",
        "fanout_admitted": True,
        "inherited_fanout": flow.run.fanout_descriptor,
    }
    before = (flow.fanout_used(), sorted(r.run_id for r in client.runs.list(limit=1000)))

    for token in (None, "0" * 32):
        forged = plain.model_copy(update={**workflow_fields, "workflow_token": token})
        with pytest.raises(WorkflowChildRefused) as refused:
            client.runs.launch(forged)
        assert refused.value.message == (
            "Public execution does not accept internal run fan-out fields."
        )

    after = (flow.fanout_used(), sorted(r.run_id for r in client.runs.list(limit=1000)))
    assert after == before
    # The same launch with the workflow's real token (its host's environment) is accepted.
    environ = Path(f"/proc/{host_pid}/environ").read_bytes().split(b"\0")
    token = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"SUBAGENTS_WORKFLOW_TOKEN="))
    genuine = plain.model_copy(update={**workflow_fields, "workflow_token": token.decode()})
    accepted = client.runs.launch(genuine)
    assert client.runs.wait(accepted.run_id, timeout=WAIT_S).state == "complete"
    held.release(0)
    assert flow.wait().state == "complete", flow.run.error


def test_r_wf_10_a_child_admitted_while_its_workflow_is_being_stopped_is_stopped_too(
    client: Client, agents: Path, work: Path, gate: Gate
) -> None:
    """The stop stops the children the workflow has; one its host launches in the stop's grace
    (or one whose admission was in flight) used to run on, an orphan of a stopped workflow."""
    script = f"""
    import signal

    def main(runs):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the host outlives its stop's TERM
        return runs.run("hold", "gate", {str(gate.path)!r}).output
    """
    flow = start_workflow(client, agents, work, script)
    [held] = gate.accept(1)
    running = wait_view(client, flow.run.run_id, lambda v: v.children[0].pid is not None)
    environ = Path(f"/proc/{running.children[0].pid}/environ").read_bytes().split(b"\0")
    token = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"SUBAGENTS_WORKFLOW_TOKEN="))
    ctx = launch_context(agents, session=flow.session, cwd=work)
    late = ctx.single("gate", str(gate.path), False, None).model_copy(
        update={
            "parent_run_id": flow.run.run_id,
            "workflow_key": "late",
            "fanout_admitted": True,
            "inherited_fanout": flow.run.fanout_descriptor,
            "workflow_token": token.decode(),
        }
    )

    client.runs.stop(flow.run.run_id)  # answered at once; the host lives out its grace
    child = client.runs.launch(late)

    done = client.runs.wait(child.run_id, timeout=WAIT_S)
    assert done.state == "stopped" and done.error == ""
    assert [c.pid for c in done.children] == [None]  # it never started
    assert flow.wait().state == "stopped"
    held.wait_exit()


# -- capacity (R-TOP-4, R-TOP-7, R-CAP-22) -----------------------------------------------------


def test_r_cap_22_a_background_workflow_holds_its_slot_until_its_async_children_have_proof(
    client: Client, agents: Path, work: Path, gate: Gate
) -> None:
    script = f"""
    def main(runs):
        child = runs.run("slow", "gate", {str(gate.path)!r}, async_=True)
        return child.run_id
    """
    flow = start_workflow(
        client, agents, work, script, background=True, max_active_async_runs_per_session=2
    )
    [slow] = gate.accept(1)

    assert flow.wait().state == "complete", flow.run.error
    child = flow.children()["slow"]
    assert child.run_id == flow.value() and child.state == "running"
    # R-TOP-4: one `workflow` slot; R-TOP-7: its async child took none. A snapshot reconciles,
    # and the verdict retains the slot while the child has no proof.
    assert flow.capacity_used() == 1
    inspection = client.capacity.inspect(flow.run.run_id, flow.session)
    assert inspection.owner is not None and inspection.owner.kind == "workflow"
    assert inspection.verdict.verdict == "retained"
    assert "slow" in inspection.verdict.reason

    slow.release(0)
    assert client.runs.wait(child.run_id, timeout=WAIT_S).state == "complete"
    wait_until(lambda: flow.capacity_used() == 0, what="the workflow's slot to be released")


@pytest.mark.parametrize("left", ["async", "by_its_killed_host"])
def test_r_cap_27_capacity_names_a_finished_workflow_that_holds_its_slot_for_its_children(
    client: Client, agents: Path, work: Path, gate: Gate, state_dir: Path, left: str
) -> None:
    """`capacity` says who holds each slot: it listed the session's active background runs
    only, so a workflow that ended while its child ran (an async child, or the one its host
    awaited when it died) and so still held its slot (R-CAP-22) was missing from the list,
    while `used` counted it."""
    script = f"""
    def main(runs):
        return runs.run("slow", "gate", {str(gate.path)!r}, async_={left == "async"}).run_id
    """
    flow = start_workflow(
        client, agents, work, script, background=True, max_active_async_runs_per_session=2
    )
    [slow] = gate.accept(1)
    if left != "async":
        host = wait_view(client, flow.run.run_id, lambda v: v.children[0].pid is not None)
        host_pid = host.children[0].pid
        assert host_pid is not None
        os.kill(host_pid, signal.SIGKILL)
    ended = flow.wait()
    assert ended.state == ("complete" if left == "async" else "failed"), ended.error
    asked = ("capacity", "--session", flow.session, "--limit", "2")

    listed = run_cli(*asked, "--json", state_dir=state_dir)
    text = run_cli(*asked, state_dir=state_dir)

    assert listed.returncode == 0, listed.stderr
    listing = json.loads(listed.stdout)
    holders = {h["run_id"]: h for h in listing["holders"] if h["owner"] is not None}
    assert listing["used"] == len(holders) == 1
    assert holders[flow.run.run_id]["verdict"]["verdict"] == "retained"
    assert f"{flow.run.run_id} {ended.state}" in text.stdout
    assert "slow is still running" in text.stdout
    slow.release(0)
    assert client.runs.wait(flow.children()["slow"].run_id, timeout=WAIT_S).state == "complete"
    wait_until(lambda: flow.capacity_used() == 0, what="the workflow's slot to be released")


def test_r_cap_22_a_restart_between_the_scripts_end_and_its_async_childs_end_frees_the_slot(
    agents: Path, work: Path, gate: Gate
) -> None:
    """Which settled workflows wait for their children lived in memory only: after a restart
    the child's end never re-judged its workflow's slot, held for good."""
    state_dir = new_state_dir()
    script = f"""
    def main(runs):
        return runs.run("slow", "gate", {str(gate.path)!r}, async_=True).run_id
    """
    try:
        with Node.embedded(state_dir=state_dir) as node:
            flow = start_workflow(
                node.client(),
                agents,
                work,
                script,
                background=True,
                max_active_async_runs_per_session=2,
            )
            [slow] = gate.accept(1)
            assert flow.wait().state == "complete", flow.run.error
            assert flow.capacity_used() == 1
        # The node is gone; the child's shim is not. A new node adopts the child.
        with Node.embedded(state_dir=state_dir) as node:
            client = node.client()
            flow.client = client
            slow.release(0)
            assert client.runs.wait(flow.value(), timeout=WAIT_S).state == "complete"
            wait_until(lambda: flow.capacity_used() == 0, what="the workflow's slot to be released")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def test_r_top_4_a_foreground_workflow_takes_no_capacity(
    client: Client, agents: Path, work: Path
) -> None:
    script = """
    def main(runs):
        return runs.run("one", "echo", "x").output
    """
    flow = start_workflow(client, agents, work, script, max_active_async_runs_per_session=1)
    assert flow.run.snapshots.capacity_used is None
    assert flow.capacity_used() == 0
    assert flow.wait().state == "complete"


# -- stop and deadline (R-WF-10, R-TMO-7) ------------------------------------------------------


def test_r_wf_10_stopping_a_workflow_marks_its_running_children_stopped_not_failed(
    client: Client, agents: Path, work: Path, gate: Gate
) -> None:
    script = f"""
    def main(runs):
        runs.all([
            {{"key": "waits", "agent": "gate", "task": {str(gate.path)!r}}},
            {{"key": "detached", "agent": "gate", "task": {str(gate.path)!r}, "async": True}},
        ])
    """
    flow = start_workflow(
        client, agents, work, script, background=True, max_active_async_runs_per_session=2
    )
    held = gate.accept(2)

    client.runs.stop(flow.run.run_id)

    assert flow.wait().state == "stopped"
    children = flow.children()
    for key in ("waits", "detached"):
        done = client.runs.wait(children[key].run_id, timeout=WAIT_S)
        assert done.state == "stopped", (key, done.error)
    for child in held:
        wait_until(lambda c=child: process_gone(c.pid), what=f"gate {child.pid} to end")
    result = flow.result()
    assert (result["state"], result["stopped"], result["success"]) == ("stopped", True, False)
    steps = {s["workflowKey"]: s for s in result["steps"]}
    assert (steps["waits"]["status"], steps["waits"].get("stopped")) == ("stopped", True)
    assert steps["detached"]["async"] is True
    assert "stopped" in [e["event"] for e in result["trace"]]
    wait_until(lambda: flow.capacity_used() == 0, what="the stopped workflow's slot")


def test_r_tmo_7_the_script_deadline_fails_the_workflow_and_stops_the_child_it_awaits(
    client: Client, agents: Path, work: Path, gate: Gate
) -> None:
    script = f"""
    def main(runs):
        runs.run("forever", "gate", {str(gate.path)!r})
    """
    # Long enough for the child to reach its gate on a loaded 2-core machine (at 1.5 s the
    # deadline could fire before the child started, and there was nothing to stop yet).
    flow = start_workflow(client, agents, work, script, timeout_ms=4000)
    [held] = gate.accept(1)

    done = flow.wait()

    assert done.state == "failed"
    assert "timed out" in done.error.lower() or "timeout" in done.error.lower(), done.error
    child = flow.children()["forever"]
    assert client.runs.wait(child.run_id, timeout=WAIT_S).state == "stopped"
    wait_until(lambda: process_gone(held.pid), what="the awaited child to end")
    result = flow.result()
    assert result["state"] == "failed"
    assert result["steps"][0]["status"] == "stopped"


# -- results (R-RUN-7, R-WF-9, R-WF-11) --------------------------------------------------------

_GREETER = """
def main(runs):
    greeting = runs.run("greet", "echo", "hello")
    emit({"seen": greeting.output})
    print("printed line")
    console("console line")
    return {"greeting": greeting.output, "success": greeting.success}
"""


def test_r_wf_9_a_foreground_workflow_returns_its_value_emits_and_console_and_writes_the_aggregate(
    client: Client, agents: Path, work: Path
) -> None:
    flow = start_workflow(client, agents, work, _GREETER, output="out/report.md")

    done = flow.wait()

    assert done.state == "complete", done.error
    result = flow.result()
    assert (result["agent"], result["mode"], result["success"]) == ("workflow", "workflow", True)
    assert result["value"] == {"greeting": "hello", "success": True}
    assert result["emits"] == [{"seen": "hello"}]
    assert result["console"] == ["printed line", "console line"]
    [child] = result["results"]
    assert (child["workflowKey"], child["agent"], child["output"]) == ("greet", "echo", "hello")
    assert child["runId"] == flow.children()["greet"].run_id
    assert child["artifactPaths"] == {"outputPath": str(work / "out" / "report.greet.md")}
    [step] = result["steps"]
    assert (step["status"], step["async"], step["runId"]) == ("completed", False, child["runId"])
    # The full display text is the run's output and the aggregate file (R-WF-9, foreground).
    aggregate = (work / "out" / "report.md").read_text()
    assert aggregate.strip() == done.output.strip() == result["summary"].strip()
    # The user's own file: made as any file they make (0666 less the umask), not 0600.
    umask = os.umask(0o022)
    os.umask(umask)
    assert (work / "out" / "report.md").stat().st_mode & 0o777 == 0o666 & ~umask
    assert done.output.startswith("Workflow completed with 1 child run(s).")
    for line in ('Return: {"greeting": "hello", "success": true}', "  console line"):
        assert line in done.output.splitlines()
    status = json.loads((Path(done.run_dir) / "status.json").read_text())
    assert (status["mode"], status["state"], status["runId"]) == (
        "workflow",
        "complete",
        done.run_id,
    )


def test_r_wf_9_a_background_workflow_summarises_in_one_line_and_defaults_child_outputs(
    client: Client, agents: Path, work: Path
) -> None:
    flow = start_workflow(client, agents, work, _GREETER, background=True)

    done = flow.wait()

    assert done.state == "complete", done.error
    assert done.background
    assert done.output == (
        'Workflow completed with 1 child run(s). Return: {"greeting": "hello", "success": true} '
        'Emitted: [{"seen": "hello"}] Trace: 2 event(s).'
    )
    # R-WF-7: without an aggregate, a child writes into the workflow's run dir.
    [step] = flow.result()["steps"]
    assert step["outputPath"] == str(Path(done.run_dir) / "outputs" / "greet.md")


def test_a_workflow_script_that_raises_fails_the_run_with_its_error(
    client: Client, agents: Path, work: Path
) -> None:
    script = """
    def main(runs):
        runs.run("before", "echo", "x")
        raise ValueError("the script broke")
    """
    flow = start_workflow(client, agents, work, script)

    done = flow.wait()

    assert done.state == "failed"
    assert done.error == "ValueError: the script broke"
    result = flow.result()
    assert (result["state"], result["success"]) == ("failed", False)
    assert result["error"] == "ValueError: the script broke"
    assert 'raise ValueError("the script broke")' in result["traceback"]
    assert [s["status"] for s in result["steps"]] == ["completed"]


@pytest.mark.parametrize(
    ("script", "error"),
    [
        (
            "import os\ndef main(runs):\n    os._exit(0)\n",
            "The workflow host exited without writing its result: the script ended the process "
            "before main(runs) returned.",
        ),
        ("def main(runs):\n    raise KeyboardInterrupt\n", "KeyboardInterrupt"),
        (
            "def main(runs):\n    a = []\n    a.append(a)\n    return a\n",
            "ValueError: a list that contains itself cannot be a workflow value",
        ),
    ],
    ids=["os._exit(0)", "KeyboardInterrupt", "a cyclic value"],
)
def test_r_run_7_a_script_that_ends_oddly_fails_with_a_one_line_error(
    client: Client, agents: Path, work: Path, script: str, error: str
) -> None:
    """Not `complete` with no result file, nor a traceback fragment as the run's error."""
    done = start_workflow(client, agents, work, script).wait()
    assert (done.state, done.error) == ("failed", error)


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        ("/", "names no file"),
        (".", "is a directory; name a file"),
        ("f/x.md", "is not a directory"),
    ],
)
def test_r_wf_9_an_aggregate_path_that_cannot_be_written_is_refused_before_the_launch(
    work: Path, output: str, problem: str
) -> None:
    """R-MISC-6 (its first half, in our terms): a workflow's artifact path, its aggregate output
    beside which its children's outputs go (R-WF-7), is computed up front, before the launch."""
    (work / "f").write_text("a file, not a directory")
    (work / "w.py").write_text("def main(runs):\n    return 1\n")
    ctx = launch_context(cwd=work)
    with pytest.raises(BadRequest) as caught:
        workflow_launch(ctx, work / "w.py", background=False, output=output)
    assert problem in caught.value.message and caught.value.details["field"] == "output"


@pytest.mark.parametrize("kind", ["fifo", "missing", "directory"])
def test_a_workflow_script_that_is_no_regular_file_is_refused_before_the_launch(
    work: Path, kind: str
) -> None:
    """A FIFO given as the script hung the host (and left the run running for good)."""
    script = work / "w.py"
    if kind == "fifo":
        os.mkfifo(script)
    elif kind == "directory":
        script.mkdir()
    with pytest.raises(BadRequest) as caught:
        workflow_launch(launch_context(cwd=work), script, background=False)
    assert caught.value.details["field"] == "script"
    assert ("does not exist" if kind == "missing" else "is not a regular file") in (
        caught.value.message
    )


def test_a_workflow_script_without_main_fails_with_a_clear_error(
    client: Client, agents: Path, work: Path
) -> None:
    flow = start_workflow(client, agents, work, "VALUE = 1\n")
    done = flow.wait()
    assert done.state == "failed"
    assert done.error.startswith("TypeError: the workflow script") and "main(runs)" in done.error


def test_r_wf_5_the_runs_handle_admits_nothing_once_the_workflow_has_settled(
    client: Client, agents: Path, work: Path
) -> None:
    ctx = launch_context(agents, cwd=work)
    descriptor = client.fanout.create(root_run_id="settled", limit=4)
    env = WorkflowEnv(
        run_id="not-a-run",
        session_id=ctx.session_id,
        token="t",
        descriptor=descriptor,
        run_dir=work,
        cwd=work,
    )
    runs = WorkflowRuns(client, ctx, env)
    runs.settle()

    with pytest.raises(WorkflowSettled):
        runs.run("late", "echo", "x")

    assert client.fanout.snapshot(descriptor).used == 0
    assert client.runs.list(limit=10) == []


def intercom_on(client: Client, run_id: str) -> bool:
    """Whether a finished run's intercom setting is `on`: a message to it is refused either
    way (it has ended), but one that is off says so first."""
    with pytest.raises(IntercomOff) as refused:
        client.ask(Intercom(run_id=run_id, text="hello parent"), IntercomMessage)
    return refused.value.details.get("reason") == "run_ended"


def test_r_icb_3_a_workflow_child_takes_its_own_intercom_setting_else_the_workflows(
    client: Client, agents: Path, work: Path
) -> None:
    script = """
    def main(runs):
        runs.all([
            {"key": "inherits", "agent": "echo", "task": "x"},
            {"key": "own", "agent": "echo", "task": "y", "intercom": "on"},
        ])
    """
    flow = start_workflow(client, agents, work, script, intercom="off")
    assert flow.wait().state == "complete", flow.run.error
    children = flow.children()

    assert not intercom_on(client, flow.run.run_id)
    assert not intercom_on(client, children["inherits"].run_id)
    assert intercom_on(client, children["own"].run_id)


def test_r_icb_3_a_workflows_resume_item_takes_its_own_intercom_setting_else_the_workflows(
    client: Client, agents: Path, work: Path
) -> None:
    """R-ICB-3 holds for resumes too: a resume item's setting is its own, else the workflow's,
    not the one its source happened to run with."""
    script = """
    def main(runs):
        runs.run("heard", "echo", "x", intercom="on")
        runs.all([{"key": "inherits", "resume": "heard"}])
        runs.resume("own", "heard", intercom="on")
    """
    flow = start_workflow(client, agents, work, script, intercom="off")
    assert flow.wait().state == "complete", flow.run.error
    children = flow.children()
    assert children["inherits"].source_run_id == children["heard"].run_id

    assert intercom_on(client, children["heard"].run_id)
    assert not intercom_on(client, children["inherits"].run_id)
    assert intercom_on(client, children["own"].run_id)


# -- the command line ----------------------------------------------------------------------------


def test_r_cfg_6_cli_workflow_runs_in_the_foreground_unless_async_and_json_prints_its_result(
    agents: Path, work: Path, state_dir: Path
) -> None:
    """R-CFG-6 as adapted (docs/workflows.md): the `workflow` command, like `run`, is
    foreground unless `--async` is given (the original's tool call defaults workflows to async);
    the background form is the next test."""
    script = work / "hello.py"
    script.write_text("def main(runs):\n    return runs.run('hi', 'echo', 'from the cli').output\n")

    done = run_cli(
        "workflow", str(script), "--agents-dir", str(agents), "--json", state_dir=state_dir
    )

    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["run"]["mode"], data["run"]["state"]) == ("workflow", "complete")
    assert data["run"]["background"] is False
    assert data["result"]["value"] == "from the cli"
    assert data["result"]["results"][0]["workflowKey"] == "hi"


def test_cli_workflow_async_prints_the_run_id_and_the_run_completes(
    agents: Path, work: Path, start_node: Any
) -> None:
    node = start_node()
    script = work / "hello.py"
    script.write_text("def main(runs):\n    return runs.run('hi', 'echo', 'later').output\n")

    done = run_cli(
        "workflow",
        str(script),
        "--async",
        "--agents-dir",
        str(agents),
        "--json",
        state_dir=node.state_dir,
    )

    assert done.returncode == 0, done.stderr
    started = json.loads(done.stdout)
    assert (started["mode"], started["background"]) == ("workflow", True)
    client = node.client()
    final = client.runs.wait(started["run_id"], timeout=WAIT_S)
    assert final.state in TERMINAL_RUN_STATES
    assert final.state == "complete", final.error
    assert workflow_result(final) is not None


def test_r_tmo_7_cli_refuses_a_non_positive_script_timeout(work: Path, state_dir: Path) -> None:
    script = work / "noop.py"
    script.write_text("def main(runs):\n    return None\n")

    done = run_cli("workflow", str(script), "--timeout-ms", "0", state_dir=state_dir)

    # The command line refuses it as a usage error (exit 2) before the launch is built; the
    # launch's own check (R-TMO-7's message) is for API callers.
    assert done.returncode == 2
    assert "'--timeout-ms': 0 is not in the range 1<=x<=2147483647" in done.stderr
    with pytest.raises(InvalidTimeout) as caught:
        workflow_launch(launch_context(cwd=work), script, background=False, timeout_ms=0)
    assert caught.value.message == "workflow script timeout must be a positive integer."


# -- output paths, without a node (R-WF-7, A-9) ------------------------------------------------


def test_r_wf_7_child_outputs_resolve_default_agent_explicit_and_none() -> None:
    run_dir, cwd = Path("/runs/w1"), Path("/work")
    aggregate = aggregate_path("out/report.txt", cwd)
    assert aggregate == Path("/work/out/report.txt")

    def resolve(output: str | bool | None, agent_output: str | None = None) -> Path | None:
        return resolve_output(
            output,
            key="scan",
            agent_output=agent_output,
            child_cwd=cwd / "sub",
            aggregate=aggregate,
            run_dir=run_dir,
        )

    assert resolve(None) == Path("/work/out/report.scan.txt")
    assert resolve(True, "notes.md") == resolve("true", "notes.md") == Path("/work/sub/notes.md")
    assert resolve(True) == Path("/work/out/report.scan.txt")  # an agent without `output`
    assert resolve(False) is None and resolve("false") is None
    assert resolve("../x.md") == Path("/work/x.md")
    assert resolve("/abs/y.md") == Path("/abs/y.md")
    assert default_output("scan", None, run_dir) == Path("/runs/w1/outputs/scan.md")
    assert default_output("k", Path("/w/report"), run_dir) == Path("/w/report.k.md")
    for no_aggregate in (None, "", "true", "false", " TRUE "):
        assert aggregate_path(no_aggregate, cwd) is None


def test_r_wf_8_children_without_an_output_file_never_collide() -> None:
    check_collisions([("a", None), ("b", None)], None, {})
    with pytest.raises(WorkflowOutputCollision) as clash:
        check_collisions([("a", Path("/p")), ("b", None), ("c", Path("/p"))], None, {})
    assert (clash.value.first, clash.value.key, clash.value.path) == ("a", "c", "/p")


# -- setup, completion and children (R-WF-1..3, R-RUN-4) ---------------------------------------


def _held_script(gate: Gate, then: str) -> str:
    """A script that first reports its host's pid at the gate and waits there, then runs
    `then` (one statement) and returns its value."""
    return f"""
    import os, socket

    def main(runs):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect({str(gate.path)!r})
        sock.sendall(f"{{os.getpid()}}\\n".encode())
        sock.recv(64)
        return {then}
    """


def test_r_wf_1_r_run_4_a_background_workflow_starts_with_its_slot_budget_and_initial_status(
    client: Client, agents: Path, work: Path, gate: Gate
) -> None:
    """R-WF-1: the launch answers with the run id, its dir and both snapshots; its slot is a
    started `workflow` slot owned by that id (R-TOP-6); and before the script has done
    anything the host has written the initial status (R-RUN-4): running, mode workflow, the
    host's own pid and the fan-out snapshot."""
    script = _held_script(gate, 'runs.run("after", "echo", "x").output')
    flow = start_workflow(
        client, agents, work, script, background=True, max_active_async_runs_per_session=1
    )
    [host] = gate.accept(1)

    started = flow.run
    assert (started.mode, started.background, started.state) == ("workflow", True, "running")
    assert Path(started.run_dir).name == started.run_id
    assert (started.snapshots.capacity_used, started.snapshots.capacity_limit) == (1, 1)
    assert (started.snapshots.fanout_used, started.snapshots.fanout_limit) == (0, 64)
    slot = client.capacity.inspect(started.run_id, flow.session)
    assert slot.relation == "current" and slot.owner is not None
    assert (slot.owner.kind, slot.owner.run_id) == ("workflow", started.run_id)
    assert slot.owner.async_dir == started.run_dir
    assert slot.owner.expires_at is None  # mark_workflow_started: no reservation TTL left
    assert [c.pid for c in client.runs.show(started.run_id).children] == [host.pid]
    status = json.loads((Path(started.run_dir) / "status.json").read_text())
    assert (status["state"], status["mode"], status["pid"]) == ("running", "workflow", host.pid)
    assert (status["runId"], status["sessionId"]) == (started.run_id, flow.session)
    budget = client.fanout.snapshot(decode_descriptor(started.fanout_descriptor))
    assert status["runFanoutBudget"] == budget.model_dump()

    host.release(0)
    assert flow.wait().state == "complete", flow.run.error
    assert flow.value() == "x"


@pytest.mark.parametrize("point", ["resolve_budget", "claim_paths", "create_run_dir"])
def test_r_wf_1_a_background_workflow_whose_setup_fails_rolls_its_slot_back_and_leaves_nothing(
    agents: Path, work: Path, point: str
) -> None:
    """R-WF-1 steps 2 and 4 (R-ADM-2's workflow path): the `workflow` slot is acquired first,
    so a budget or storage failure after it must give it back; no run, no run directory."""
    state_dir = new_state_dir()
    path = work / "workflow.py"
    path.write_text("def main(runs):\n    return 1\n")
    session = new_session()
    ctx = launch_context(agents, session=session, cwd=work, max_active_async_runs_per_session=1)
    try:
        with embedded(state_dir, faults=True, settings={"fault_points": [point]}) as node:
            client = node.client()
            launch = workflow_launch(ctx, path, background=True, agents_dirs=(str(agents),))
            with pytest.raises(InjectedFault) as failed:
                client.runs.launch(launch)
            assert failed.value.point == point
            assert client.runs.list(limit=10) == []
            assert client.capacity.snapshot(session, 1).used == 0
            runs_dir = state_dir / "runs"
            assert not runs_dir.exists() or not any(runs_dir.iterdir())
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.mark.parametrize(
    ("then", "state"),
    [("'done'", "complete"), ("1 / 0", "failed")],
)
def test_r_wf_2_the_host_writes_aggregate_result_and_final_status_before_its_slot_is_freed(
    client: Client, agents: Path, work: Path, gate: Gate, then: str, state: str
) -> None:
    """R-WF-2: whether the script succeeded or failed, its aggregate output, result file and
    final status are on disk by the time its slot is released (the host writes them and only
    then ends, and the slot waits for the host's tree to end)."""
    flow = start_workflow(
        client,
        agents,
        work,
        _held_script(gate, then),
        background=True,
        output="report.md",
        max_active_async_runs_per_session=1,
    )
    [host] = gate.accept(1)
    assert flow.capacity_used() == 1

    host.release(0)
    wait_until(lambda: flow.capacity_used() == 0, what="the workflow's slot to be released")

    run_dir = Path(flow.run.run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    result = json.loads((run_dir / "result.json").read_text())
    assert (status["state"], result["state"], result["runId"]) == (state, state, flow.run.run_id)
    aggregate = (work / "report.md").read_text()
    if state == "complete":
        assert aggregate.startswith("Workflow completed with 0 child run(s).")
    else:
        assert "ZeroDivisionError" in aggregate
    assert flow.wait().state == state
    assert client.capacity.inspect(flow.run.run_id, flow.session).relation == "none"


def test_r_wf_3_children_inherit_the_workflows_defaults_run_foreground_and_take_no_capacity(
    client: Client, agents: Path, work: Path
) -> None:
    """R-WF-3: a child runs in the workflow's cwd and session, in the foreground unless it asks
    otherwise, as the workflow's child under its key; it takes no capacity, not even from a
    pool the workflow itself filled; its budget is the workflow's extended by `workflow[key]`,
    and it claims nothing beyond the host's claim of that key."""
    write_agent(
        agents,
        "pwd",
        "Prints its working directory.",
        '["{python}", "-c", "import os; print(os.getcwd())"]',
    )
    script = """
    def main(runs):
        here = runs.run("here", "pwd", "x")
        away = runs.run("away", "pwd", "y", async_=True)
        return [here.output, away.run_id]
    """
    flow = start_workflow(
        client, agents, work, script, background=True, max_active_async_runs_per_session=1
    )

    assert flow.wait().state == "complete", flow.run.error
    here_output, away_id = flow.value()
    children = flow.children()
    here, away = children["here"], client.runs.wait(away_id, timeout=WAIT_S)
    assert here_output == str(work)
    assert (away.state, away.output) == ("complete", str(work))
    assert (here.background, away.background) == (False, True)
    workflow_budget = decode_descriptor(flow.run.fanout_descriptor)
    for key, child in (("here", here), ("away", away)):
        assert (child.parent_run_id, child.workflow_key) == (flow.run.run_id, key)
        assert (child.session_id, child.depth) == (flow.session, flow.run.depth)
        assert child.snapshots.capacity_used is None
        assert client.capacity.inspect(child.run_id, flow.session).relation == "none"
        budget = decode_descriptor(child.fanout_descriptor)
        assert budget.budget_id == workflow_budget.budget_id
        assert budget.parent_path.endswith(f"workflow[{key}]"), budget.parent_path
    assert flow.fanout_used() == 2  # workflow[here] and workflow[away], nothing more


def test_cli_workflow_whose_host_died_leaving_a_fifo_as_result_json_ends_and_says_so(
    agents: Path, work: Path, state_dir: Path
) -> None:
    """The foreground `workflow` command reads the host's result.json once the run ended. A
    host killed before writing it leaves whatever a child put there: a FIFO made the command
    wait for a writer for good, its run long over. It is read as a regular file only."""
    script = work / "dies.py"
    script.write_text(
        "import os\n\n"
        "def main(runs):\n"
        "    run_dir = os.path.dirname(os.environ['SUBAGENTS_CHILD_DIR'])\n"
        "    os.mkfifo(os.path.join(run_dir, 'result.json'))\n"
        "    os._exit(9)\n"
    )

    done = run_cli("workflow", str(script), "--agents-dir", str(agents), state_dir=state_dir)

    assert done.returncode == 1, done.stderr
    assert "result: none (the host wrote none)" in done.stdout
