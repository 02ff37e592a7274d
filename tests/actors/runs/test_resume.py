"""Resume and rerun: relaunching a finished run (SPEC §10 R-RES, R-CAP-16..20, R-MISC-2).

A resume moves the source's capacity slot when the source still holds one (R-CAP-18: `used`
stays constant, INV-CAP-4) and acquires a fresh one when it does not (R-CAP-20); it reuses the
source's fan-out descriptor and claims nothing (R-RES-4, R-FAN-23). A relaunch that fails at any
admission step gives a transferred slot back to its source exactly (R-RES-5, A-15 resolved,
INV-CAP-9). Refused resumes (unknown, running, stopped, no recovery descriptor) change no
ledger. A rerun relaunches one child with the same parameters and a new task, in the foreground.

Embedded nodes, real children. Fault points (actors.admission.FAULT_POINTS) are honoured only
by a node started with faults, and they fail every launch, so the fault tests prepare the source
on one node and resume it on a second node over the same state dir.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from subagents_node.actors.runs.admission import FAULT_POINTS
from subagents_node.actors.runs.recovery import RECOVERY, read_recovery, write_recovery
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.domains import MAX_TASK_CHARS
from subagents_node.messages.errors import (
    BadRequest,
    CapacityExhausted,
    InjectedFault,
    RunNotFound,
    RunNotResumable,
    SubagentsError,
)
from subagents_node.messages.fanout import decode_descriptor, encode_descriptor
from subagents_node.messages.lineage import Rerun, Resume
from subagents_node.messages.supervisor import (
    AgentPlan,
    ChainStep,
    Launch,
    LaunchResult,
    RunView,
    TaskItem,
)
from subagents_node.node.node import Node
from tests.support.manage import embedded, hold_with_unknown_proof
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, Ledgers, events_of, launch_context, ledgers, wait_until

LIMIT = 2


@pytest.fixture
def ctx(agents: Path) -> LaunchContext:
    return launch_context(agents, max_active_async_runs_per_session=LIMIT)


def resume(client: Client, run_id: str, message: str = "", limit: int = LIMIT) -> RunView:
    return client.ask(
        Resume(run_id=run_id, message=message, capacity_limit=limit), LaunchResult
    ).run


def finished(client: Client, ctx: LaunchContext, task: str = "source task") -> RunView:
    """A background `echo` run that completed and whose slot the ledger released."""
    run = client.runs.launch(ctx.single("echo", task, True, None))
    done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "complete", done.error
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")
    return done


def finished_at_gate(client: Client, ctx: LaunchContext, gate: Gate) -> RunView:
    """A background `gate` run that completed and released its slot; its resume waits at the
    gate again, so the resumed run holds its slot until the test releases it."""
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)
    child.release(0)
    done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "complete", done.error
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")
    return done


def everything(client: Client, run: RunView) -> tuple[Ledgers, object]:
    """Every ledger a refused resume must leave as it was, and the source's slot as recorded."""
    budget = decode_descriptor(run.fanout_descriptor)
    return (
        ledgers(client, run.session_id, LIMIT, budget),
        client.capacity.inspect(run.run_id, run.session_id),
    )


# -- capacity: transfer or acquire (R-CAP-18..20, R-RES-3/4) ---------------------------------------


def test_r_cap_18_resume_of_a_source_that_still_holds_its_slot_transfers_it_and_used_stays_constant(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """R-TOP-5 (transfer half): a top-level resume of a source that holds its slot moves it."""
    source = finished_at_gate(client, ctx, gate)
    held = hold_with_unknown_proof(client, source, LIMIT)
    assert held.owner is not None
    budget = decode_descriptor(source.fanout_descriptor)
    fanout_before = client.fanout.snapshot(budget)
    assert client.capacity.snapshot(ctx.session_id, LIMIT).used == 1

    resumed = resume(client, source.run_id)
    [child] = gate.accept(1)

    # R-CAP-19 / INV-CAP-4: the same slot and token change hands; nothing is charged twice.
    assert resumed.snapshots.capacity_used == 1
    assert client.capacity.snapshot(ctx.session_id, LIMIT).used == 1
    moved = client.capacity.inspect(source.run_id, ctx.session_id)
    assert moved.relation == "source" and moved.owner is not None
    assert moved.verdict.reason == f"slot was transferred to {resumed.run_id}"
    assert (moved.owner.slot, moved.owner.token) == (held.owner.slot, held.owner.token)
    assert moved.owner.generation == held.owner.generation + 1
    assert (moved.owner.run_id, moved.owner.source_run_id) == (resumed.run_id, source.run_id)
    # R-RES-4: the source's budget, and no claim (R-FAN-23).
    assert resumed.source_run_id == source.run_id
    assert resumed.fanout_descriptor == source.fanout_descriptor
    assert resumed.root_run_id == source.root_run_id
    assert client.fanout.snapshot(budget) == fanout_before

    child.release(0)
    assert client.runs.wait(resumed.run_id, timeout=20).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")
    assert client.fanout.snapshot(budget) == fanout_before


def test_r_cap_20_resume_of_a_source_whose_slot_was_released_acquires_a_fresh_one(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """R-TOP-5 (acquire half): a top-level resume of a source with no slot acquires one."""
    source = finished_at_gate(client, ctx, gate)
    budget = decode_descriptor(source.fanout_descriptor)
    fanout_before = client.fanout.snapshot(budget)

    resumed = resume(client, source.run_id)
    [second] = gate.accept(1)

    assert client.capacity.snapshot(ctx.session_id, LIMIT).used == 1
    slot = client.capacity.inspect(resumed.run_id, ctx.session_id)
    assert slot.relation == "current" and slot.owner is not None
    assert (slot.owner.generation, slot.owner.source_run_id) == (0, None)
    assert slot.owner.runner_id == resumed.runner_id  # started: R-ADM-4
    assert client.capacity.inspect(source.run_id, ctx.session_id).relation == "none"
    assert resumed.source_run_id == source.run_id
    assert client.fanout.snapshot(budget) == fanout_before

    second.release(0)
    assert client.runs.wait(resumed.run_id, timeout=20).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")


def test_r_cap_20_a_resume_that_must_acquire_is_refused_when_the_pool_is_full_and_changes_nothing(
    client: Client, agents: Path, gate: Gate
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    source = client.runs.launch(ctx.single("echo", "done", True, None))
    client.runs.wait(source.run_id, timeout=20)
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    holder = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    before = ledgers(client, ctx.session_id, 1, decode_descriptor(source.fanout_descriptor))

    with pytest.raises(CapacityExhausted) as refused:
        resume(client, source.run_id, limit=1)

    assert refused.value.message == "Active async run capacity exhausted: 1/1 used."
    assert ledgers(client, ctx.session_id, 1, decode_descriptor(source.fanout_descriptor)) == before
    held.release(0)
    assert client.runs.wait(holder.run_id, timeout=20).state == "complete"


def test_r_res_4_chained_resumes_keep_one_budget_and_the_message_follows_the_task(
    client: Client, ctx: LaunchContext
) -> None:
    """R-FAN-10: a revival that is no workflow child's runs under the descriptor in its
    source's recovery descriptor, so a chain of resumes stays on one budget."""
    source = finished(client, ctx, task="first")
    budget = decode_descriptor(source.fanout_descriptor)
    used = client.fanout.snapshot(budget).used

    second = client.runs.wait(resume(client, source.run_id, "second").run_id, timeout=20)
    third = client.runs.wait(resume(client, second.run_id, "third").run_id, timeout=20)

    assert second.output.split() == ["first", "second"]
    assert third.output.split() == ["first", "second", "third"]
    assert third.source_run_id == second.run_id and second.source_run_id == source.run_id
    assert {second.fanout_descriptor, third.fanout_descriptor} == {source.fanout_descriptor}
    assert client.fanout.snapshot(budget).used == used


def test_r_res_1_a_message_that_takes_the_task_past_its_limit_is_refused_and_changes_nothing(
    client: Client, ctx: LaunchContext
) -> None:
    """The follow-up is appended to the first task. Past the task limit the relaunch used to
    run anyway and write a recovery.json no later resume or rerun could read."""
    source = finished(client, ctx, task="x" * (MAX_TASK_CHARS - 10))
    before = everything(client, source)

    with pytest.raises(RunNotResumable) as caught:
        resume(client, source.run_id, "y" * 9)

    assert caught.value.details["reason"] == "task_too_long"
    assert "\n" not in caught.value.message and "xxx" not in caught.value.message
    assert everything(client, source) == before
    fits = client.runs.wait(resume(client, source.run_id, "y" * 8).run_id, timeout=20)
    assert fits.state == "complete"
    launch, _ = read_recovery(Path(fits.run_dir), fits.run_id)  # resumable again
    assert len(launch.items[0].task) == MAX_TASK_CHARS


@pytest.mark.parametrize("mode", ["single", "parallel", "chain"])
def test_r_fan_6_a_background_run_persists_its_validated_descriptor_before_its_children_start(
    client: Client, ctx: LaunchContext, gate: Gate, mode: str
) -> None:
    """While its first children run, the run directory already holds the run's descriptor,
    the one its owner validates, under the budget the run's claims went to."""
    item = TaskItem(agent=ctx.plan("gate"), task=str(gate.path))
    if mode == "single":
        launch = ctx.launch("single", True, items=[item])
    elif mode == "parallel":
        launch = ctx.launch("parallel", True, items=[item, item])
    else:
        launch = ctx.launch(
            "chain",
            True,
            chain=[ChainStep(items=[item, item], parallel=True), ChainStep(items=[item])],
        )
    run = client.runs.launch(launch)
    started = gate.accept(1 if mode == "single" else 2)

    _, persisted = read_recovery(Path(run.run_dir), run.run_id)

    assert persisted == decode_descriptor(run.fanout_descriptor)
    assert client.fanout.validate(persisted) == persisted
    assert client.fanout.snapshot(persisted).used == {"single": 1, "parallel": 2, "chain": 3}[mode]
    for child in started:
        child.release(0)
    if mode == "chain":
        gate.accept(1)[0].release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"


@pytest.mark.parametrize("tamper", ["not a descriptor", "raised limit", "other budget"])
def test_r_fan_6_the_persisted_descriptor_is_validated_when_a_resume_reads_it(
    client: Client, ctx: LaunchContext, tamper: str
) -> None:
    """A recovery descriptor whose budget was edited is refused, and no ledger moves: not the
    source's budget, not the budget it names, not the capacity pool."""
    source = finished(client, ctx)
    budget = decode_descriptor(source.fanout_descriptor)
    other = client.fanout.create("other", 5)
    path = Path(source.run_dir) / RECOVERY
    data = json.loads(path.read_text())
    if tamper == "not a descriptor":
        data["fanout"] = "%%%"
    elif tamper == "raised limit":
        data["fanout"] = encode_descriptor(budget.model_copy(update={"limit": budget.limit + 1}))
    else:  # a real budget, but its owner's manifest names another root and limit
        data["fanout"] = encode_descriptor(other.model_copy(update={"budget_id": budget.budget_id}))
    path.write_text(json.dumps(data))
    before = client.fanout.snapshot(other)

    err = refused(client, source, SubagentsError)

    assert "\n" not in err.message
    if tamper == "not a descriptor":
        assert err.message.startswith(f"Invalid persisted run fan-out budget '{path}': ")
    else:
        assert err.message == "Run fan-out budget descriptor does not match its manifest."
    assert client.fanout.snapshot(other) == before


def test_r_fan_7_an_unreadable_recovery_descriptor_is_refused_in_one_line_without_its_task(
    client: Client, ctx: LaunchContext
) -> None:
    """R-FAN-7's error names the file and the problem; it used to be pydantic's text: several
    lines, quoting the offending value (here the task text, R-MISC-1)."""
    source = finished(client, ctx, task="secret task text")
    path = Path(source.run_dir) / RECOVERY
    data = json.loads(path.read_text())
    data["launch"]["items"][0]["task"] = "secret task text" * 40_000
    path.write_text(json.dumps(data))

    err = refused(client, source, RunNotResumable)

    assert err.message == (
        f"Invalid persisted run fan-out budget '{path}': items.0.task: String should have at "
        f"most {MAX_TASK_CHARS} characters"
    )


# -- a relaunch that fails gives the slot back (R-RES-5, INV-CAP-9) --------------------------------


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_r_res_5_a_relaunch_failing_at_each_admission_step_restores_the_sources_slot_exactly(
    state_dir: Path, ctx: LaunchContext, point: str
) -> None:
    with embedded(state_dir) as node:
        client = node.client()
        source = finished(client, ctx)
        held = hold_with_unknown_proof(client, source, LIMIT)
        before = everything(client, source)

    with embedded(state_dir, faults=True, settings={"fault_points": [point]}) as node:
        client = node.client()
        with pytest.raises(InjectedFault) as failed:
            resume(client, source.run_id)
        assert failed.value.point == point

        after = everything(client, source)
        if point == "mark_started":
            # The relaunch was recorded and its child started before the step failed: it is
            # stopped (R-ADM-5) and, once settled, owns nothing; the source keeps its slot.
            [stray] = [r for r in client.runs.list() if r.source_run_id == source.run_id]
            assert client.runs.wait(stray.run_id, timeout=20).state == "failed"
            stray_slot = client.capacity.inspect(stray.run_id, ctx.session_id)
            assert stray_slot.relation == "none"
            assert after[0].runs == (stray.run_id, *before[0].runs)
            after = (replace(after[0], runs=before[0].runs), after[1])
        assert after == before
        assert after[1] == held  # the complete record, generation, token and facts included


def test_r_res_5_a_failed_relaunch_of_a_released_source_frees_the_fresh_slot(
    state_dir: Path, ctx: LaunchContext
) -> None:
    with embedded(state_dir) as node:
        source = finished(node.client(), ctx)
    with embedded(state_dir, faults=True, settings={"fault_points": ["create_run_dir"]}) as node:
        client = node.client()
        before = everything(client, source)
        with pytest.raises(InjectedFault):
            resume(client, source.run_id)
        assert everything(client, source) == before
        assert client.capacity.snapshot(ctx.session_id, LIMIT).used == 0


# -- refused resumes change nothing (R-RES-1, R-RES-2) ---------------------------------------------


def refused(client: Client, run: RunView, error: type[SubagentsError]) -> SubagentsError:
    before = everything(client, run)
    with pytest.raises(error) as caught:
        resume(client, run.run_id)
    assert everything(client, run) == before
    return caught.value


def test_r_res_1_resume_of_an_unknown_run_is_refused(client: Client, ctx: LaunchContext) -> None:
    before = ledgers(client, ctx.session_id, LIMIT)
    with pytest.raises(RunNotFound) as caught:
        resume(client, "0123456789ab")
    assert caught.value.message == "Run not found: 0123456789ab"
    assert ledgers(client, ctx.session_id, LIMIT) == before


def test_r_res_1_resume_of_a_running_run_is_refused_and_changes_nothing(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)

    err = refused(client, run, RunNotResumable)

    assert err.details["reason"] == "running"
    assert (
        err.message == f"Run '{run.run_id}' is still running; it cannot be resumed while it runs."
    )
    child.release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"


def test_r_res_1_resume_of_a_stopped_run_is_refused_and_changes_nothing(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    gate.accept(1)
    client.runs.stop(run.run_id)
    stopped = client.runs.wait(run.run_id, timeout=20)
    assert stopped.state == "stopped"

    err = refused(client, stopped, RunNotResumable)

    assert err.message == (
        f"Run '{run.run_id}' was stopped and cannot be resumed. Start a new run instead."
    )


def test_r_res_2_resume_without_the_recovery_descriptor_fails_before_any_capacity_action(
    client: Client, ctx: LaunchContext
) -> None:
    source = finished(client, ctx)
    held = hold_with_unknown_proof(client, source, LIMIT)
    (Path(source.run_dir) / RECOVERY).unlink()

    err = refused(client, source, RunNotResumable)

    assert err.message == (
        f"Async child '{source.run_id}' is missing its required run fan-out recovery identity. "
        "Start a new run instead."
    )
    assert client.capacity.inspect(source.run_id, ctx.session_id) == held


# -- rerun (R-MISC-2's rerun contract) -------------------------------------------------------------


def launch_of(run: RunView) -> dict[str, Any]:
    """The launch parameters a run recorded for its own relaunch (its recovery descriptor)."""
    data = json.loads((Path(run.run_dir) / RECOVERY).read_text())
    launch: dict[str, Any] = data["launch"]
    return launch


def test_r_misc_2_rerun_relaunches_a_child_with_the_same_parameters_and_a_new_task_foreground(
    client: Client, ctx: LaunchContext
) -> None:
    items = [
        TaskItem(agent=ctx.plan("echo"), task="old a"),
        TaskItem(agent=ctx.plan("fail"), task="old b"),
    ]
    source = client.runs.launch(ctx.launch("parallel", True, items=items, timeout_ms=120_000))
    source = client.runs.wait(source.run_id, timeout=20)
    fanout_before = client.fanout.snapshot(decode_descriptor(source.fanout_descriptor))

    rerun = client.ask(Rerun(run_id=source.run_id, task="new b", child=1), LaunchResult).run
    done = client.runs.wait(rerun.run_id, timeout=20)

    assert (done.mode, done.background) == ("single", False)
    assert [(c.agent, c.state) for c in done.children] == [("fail", "failed")]
    assert done.error == "broken: new b"
    assert done.snapshots.capacity_used is None  # foreground: never charged (R-TOP-7)
    old, new = launch_of(source), launch_of(done)
    for same in ("cwd", "timeout_ms", "env", "session_id", "depth", "max_depth", "intercom"):
        assert new[same] == old[same], same
    assert new["items"] == [{**old["items"][1], "task": "new b"}]
    # The source is untouched: its state, its children and its budget.
    assert client.runs.show(source.run_id) == source
    assert client.fanout.snapshot(decode_descriptor(source.fanout_descriptor)) == fanout_before

    again = client.ask(Rerun(run_id=source.run_id, task="new a"), LaunchResult).run
    assert client.runs.wait(again.run_id, timeout=20).output == "new a"


def test_r_misc_2_rerun_of_a_child_index_the_run_does_not_have_is_refused_and_changes_nothing(
    client: Client, ctx: LaunchContext
) -> None:
    source = finished(client, ctx)
    before = everything(client, source)

    with pytest.raises(BadRequest) as caught:
        client.ask(Rerun(run_id=source.run_id, task="x", child=1), LaunchResult)

    assert caught.value.message == f"run '{source.run_id}' has 1 child; there is no child 1"
    assert everything(client, source) == before


def test_r_misc_2_rerun_of_a_running_run_is_refused_and_changes_nothing(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)
    before = everything(client, run)

    with pytest.raises(RunNotResumable):
        client.ask(Rerun(run_id=run.run_id, task="x"), LaunchResult)

    assert everything(client, run) == before
    child.release(0)
    client.runs.wait(run.run_id, timeout=20)


def test_r_misc_2_rerun_of_a_live_foreground_child_links_the_superseded_one(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """The original also reruns a live foreground child: the old run is stopped and linked to
    its rerun (`supersededByRunId` / `sourceRunId`); no ledger is charged for either."""
    old = client.runs.launch(ctx.single("gate", str(gate.path), False, None))
    [first] = gate.accept(1)
    before = ledgers(client, ctx.session_id, LIMIT, decode_descriptor(old.fanout_descriptor))

    new = client.ask(Rerun(run_id=old.run_id, task=str(gate.path)), LaunchResult).run
    [second] = gate.accept(1)

    superseded = client.runs.wait(old.run_id, timeout=20)
    assert superseded.state == "stopped"
    assert superseded.superseded_by == new.run_id
    first.wait_exit()
    assert (new.source_run_id, new.source_kind, new.background) == (old.run_id, "rerun", False)
    assert new.state == "running" and new.superseded_by is None
    kinds = {e.kind: e.data for e in events_of(client, old.run_id)}
    assert kinds["run.superseded"] == {"by": new.run_id}
    assert kinds["run.stopping"] == {
        "reason": f"Superseded by rerun {new.run_id}.",
        "state": "stopped",
    }
    second.release(0)
    assert client.runs.wait(new.run_id, timeout=20).state == "complete"
    assert client.capacity.snapshot(ctx.session_id, LIMIT).used == 0  # foreground: never charged
    after = ledgers(client, ctx.session_id, LIMIT, decode_descriptor(old.fanout_descriptor))
    assert after.capacity == before.capacity


def test_r_misc_2_reruns_of_a_live_foreground_run_sent_at_once_supersede_it_only_once(
    node: Node, client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """The link to the superseding rerun is written with the rerun's record, once admitted; a
    second rerun arriving meanwhile used to pass the stored check too, so every one of them
    ran and "superseded" the same run (its link naming whichever committed last)."""
    old = client.runs.launch(ctx.single("gate", str(gate.path), False, None))
    gate.accept(1)
    start = threading.Barrier(8)
    won: list[RunView] = []
    refused: list[str] = []

    def rerun_at_once() -> None:
        own = node.client()
        start.wait(timeout=10)
        try:
            won.append(own.ask(Rerun(run_id=old.run_id, task=str(gate.path)), LaunchResult).run)
        except RunNotResumable as err:
            refused.append(err.details["reason"])

    threads = [threading.Thread(target=rerun_at_once) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(won) == 1 and refused == ["superseded"] * 7, (won, refused)
    [new] = gate.accept(1)
    superseded = client.runs.wait(old.run_id, timeout=20)
    assert (superseded.state, superseded.superseded_by) == ("stopped", won[0].run_id)
    assert [r.run_id for r in client.runs.list() if r.source_run_id == old.run_id] == [
        won[0].run_id
    ]
    new.release(0)
    assert client.runs.wait(won[0].run_id, timeout=20).state == "complete"


def test_r_misc_2_a_live_foreground_run_with_several_children_is_not_rerun(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    items = [TaskItem(agent=ctx.plan("gate"), task=str(gate.path)) for _ in range(2)]
    run = client.runs.launch(ctx.launch("parallel", False, items=items, timeout_ms=120_000))
    children = gate.accept(2)
    before = everything(client, run)

    with pytest.raises(RunNotResumable) as caught:
        client.ask(Rerun(run_id=run.run_id, task="x"), LaunchResult)

    assert "only a live foreground run with one child can be rerun" in caught.value.message
    assert everything(client, run) == before
    for child in children:
        child.release(0)
    assert client.runs.wait(run.run_id, timeout=20).superseded_by is None


def test_recovery_descriptor_never_holds_the_launcher_environment(tmp_path: Path) -> None:
    """recovery.json keeps what resume needs (the task), never the launcher's variables,
    which may hold credentials; a resume runs with the resumer's environment instead."""
    launch = Launch(
        session_id="s",
        mode="single",
        background=True,
        items=[TaskItem(agent=AgentPlan(name="a", command=["true"]), task="the task")],
        cwd=str(tmp_path),
        env={"API_KEY": "sk-secret-value"},
    )
    write_recovery(tmp_path, launch, "descriptor-is-checked-on-read")
    text = (tmp_path / "recovery.json").read_text()
    assert "sk-secret-value" not in text and "API_KEY" not in text
    assert json.loads(text)["launch"]["items"][0]["task"] == "the task"
    assert (tmp_path / "recovery.json").stat().st_mode & 0o777 == 0o600
    with pytest.raises(RunNotResumable):  # the planted descriptor does not decode
        read_recovery(tmp_path, "r1")
