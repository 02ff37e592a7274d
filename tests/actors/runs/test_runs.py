"""Runs end to end: every mode, foreground and background, on an embedded node (SPEC §7, §9).

Real child processes only: the example agents and the tiny `echo`, `fail` and `gate` agents
written by tests.runs_support. Waits follow the run's own events (`runs.watch` long-polls), a
gate socket or a FIFO; the capacity snapshot, which announces nothing, is re-read until it
holds. Concurrency is judged from the run's events and from the children's recorded lifetimes.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from subagents_node.client.client import Client
from subagents_node.client.paths import default_state_dir
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import CapacityExhausted
from subagents_node.messages.runs import timeout_error
from subagents_node.messages.supervisor import AgentPlan, ChainStep, Launch, RunView, TaskItem
from subagents_node.node.node import Node
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import (
    Gate,
    events_of,
    launch_context,
    peak_alive,
    peak_overlap,
    process_gone,
    read_fifo,
    wait_until,
    wait_view,
    write_agent,
)


def item(ctx: LaunchContext, agent: str, task: str) -> TaskItem:
    return TaskItem(agent=ctx.plan(agent), task=task)


# -- single ---------------------------------------------------------------------------------------


def test_r_run_2_foreground_single_completes_with_its_output_observed_proof_and_run_files(
    client: Client, agents: Path
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    started = client.runs.launch(ctx.single("echo", "hello from a child", False, None))
    assert started.state == "running" and not started.background

    done = client.runs.wait(started.run_id, timeout=20)

    assert done.state == "complete" and done.error == ""
    assert done.output == "hello from a child"
    [child] = done.children
    assert (child.label, child.state, child.exit_code) == ("single", "complete", 0)
    assert child.proof_state == "observed"
    assert Path(child.stdout_path).read_text().strip() == "hello from a child"
    # R-TOP-7: a foreground run takes no capacity; R-FAN-19: it claims `single`.
    assert done.snapshots.capacity_used is None
    assert (done.snapshots.fanout_used, done.snapshots.fanout_limit) == (1, 64)
    assert client.capacity.snapshot(ctx.session_id, 1).used == 0
    # R-RUN-6: the run directory holds an events log and the run summary, for people.
    run_dir = Path(done.run_dir)
    logged = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert {e["runId"] for e in logged} == {done.run_id}
    kinds = [e["type"] for e in logged]
    assert (kinds[0], kinds[-1]) == ("run.started", "run.complete")
    assert json.loads((run_dir / "summary.json").read_text())["state"] == "complete"


def test_r_run_1_the_state_dir_is_per_user_and_each_run_has_its_own_private_dir_of_files(
    client: Client, agents: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-RUN-1 as DESIGN §5 lays it out: the storage root is the user's own state dir (its
    ledgers are owner databases, not lock-file directories, §0.4), and each run's files sit in
    `runs/<run id>/`, private to the user."""
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("echo", "laid out", True, None))
    done = client.runs.wait(run.run_id, timeout=20)

    run_dir = Path(done.run_dir)
    assert run_dir == state_dir / "runs" / done.run_id
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    files = {p.name for p in run_dir.iterdir()}
    expected = {"events.jsonl", "summary.json", "recovery.json", "child-0"}
    assert expected | {"external-0.stdout.log", "external-0.stderr.log"} <= files, files
    assert stat.S_IMODE((run_dir / "recovery.json").stat().st_mode) == 0o600
    owners = {"capacity.db", "fanout.db", "session.db", "runs.db"}
    assert owners <= {p.name for p in state_dir.iterdir()}
    assert [p for p in state_dir.rglob("*") if "lock" in p.name.lower()] == []
    # The default root is per user: $SUBAGENTS_STATE_DIR, else the user's XDG state dir.
    monkeypatch.delenv("SUBAGENTS_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/someone/state")
    assert default_state_dir() == Path("/srv/someone/state/subagents-node")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir() == Path.home() / ".local" / "state" / "subagents-node"


def test_r_top_2_background_single_holds_one_slot_until_its_child_is_proven_ended(
    client: Client, agents: Path, gate: Gate
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    started = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)

    assert started.background
    assert (started.snapshots.capacity_used, started.snapshots.capacity_limit) == (1, 1)
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1
    assert client.capacity.inspect(started.run_id).relation == "current"

    child.release(0)
    done = client.runs.wait(started.run_id, timeout=20)

    assert done.state == "complete" and done.output == "released 0"
    assert done.children[0].pid == child.pid
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    assert client.capacity.inspect(started.run_id).relation == "none"


def test_r_top_6_one_run_id_names_the_slot_owner_the_run_dir_and_the_summary(
    client: Client, agents: Path, gate: Gate
) -> None:
    """R-TOP-6: the node fixes a fresh run id before admission (a launch cannot name one), and
    the slot's owner record, the run directory and the run's summary all carry that id. Two
    launches at once get two ids; a launch refused at admission leaves no directory."""
    ctx = launch_context(agents, max_active_async_runs_per_session=2)
    launch = ctx.single("gate", str(gate.path), True, None)
    with pytest.raises(ValidationError):
        Launch.model_validate({**launch.model_dump(), "run_id": "../elsewhere"})
    runs = [client.runs.launch(launch), client.runs.launch(launch)]
    held = gate.accept(2)

    assert runs[0].run_id != runs[1].run_id
    for run in runs:
        slot = client.capacity.inspect(run.run_id, ctx.session_id)
        assert slot.relation == "current" and slot.owner is not None
        assert (slot.owner.run_id, slot.owner.runner_id) == (run.run_id, run.runner_id)
        assert slot.owner.async_dir == run.run_dir
        assert Path(run.run_dir).name == run.run_id
    runs_dir = Path(runs[0].run_dir).parent
    before = sorted(runs_dir.iterdir())
    with pytest.raises(CapacityExhausted):
        client.runs.launch(ctx.single("echo", "no room", True, None))
    assert sorted(runs_dir.iterdir()) == before

    for child in held:
        child.release(0)
    for run in runs:
        done = client.runs.wait(run.run_id, timeout=20)
        assert done.state == "complete", done.error
        summary = json.loads((Path(run.run_dir) / "summary.json").read_text())
        assert (summary["run_id"], summary["runner_id"]) == (run.run_id, run.runner_id)


def test_r_run_5_a_child_that_cannot_start_fails_the_run_with_not_started_proof_and_frees_its_slot(
    client: Client, agents: Path
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    program = agents / "not-a-program"  # executable, but the kernel cannot run it (ENOEXEC)
    program.write_bytes(b"\x00\x01\x02 not an executable format\n")
    program.chmod(0o755)
    broken = AgentPlan(name="broken", command=[str(program)])
    launch = ctx.launch("single", True, items=[TaskItem(agent=broken, task="x")])

    done = client.runs.wait(client.runs.launch(launch).run_id, timeout=20)

    assert done.state == "failed"
    assert "not-a-program" in done.error
    assert done.children[0].proof_state == "not-started"
    assert done.children[0].pid is None
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


# -- parallel -------------------------------------------------------------------------------------


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_parallel_run_never_has_more_than_concurrency_children_alive(
    client: Client, agents: Path, background: bool
) -> None:
    ctx = launch_context(agents)
    tasks = [item(ctx, "sleeper", f"task {i}: seconds=0.25") for i in range(6)]
    launch = ctx.launch("parallel", background, items=tasks, concurrency=2)

    done = client.runs.wait(client.runs.launch(launch).run_id, timeout=30)

    assert done.state == "complete" and done.background is background
    assert [c.state for c in done.children] == ["complete"] * 6
    assert peak_alive(events_of(client, done.run_id)) == 2  # the cap, and it was used
    assert peak_overlap(done) <= 2
    assert done.snapshots.fanout_used == 6  # R-FAN-19: tasks[0..5]
    for i in range(6):
        assert f"[tasks[{i}]]\nslept 0.25" in done.output


def test_r_run_6_the_events_log_holds_every_stored_event_of_the_run_in_order(
    client: Client, agents: Path
) -> None:
    # The log is written once per commit group: many children's events at once must still
    # come out whole, once each and in the store's order.
    ctx = launch_context(agents)
    tasks = [item(ctx, "echo", f"child {i}") for i in range(12)]
    launch = ctx.launch("parallel", False, items=tasks, concurrency=12)

    done = client.runs.wait(client.runs.launch(launch).run_id, timeout=30)

    assert done.state == "complete"
    stored = [(e.kind, e.data) for e in events_of(client, done.run_id)]
    lines = (Path(done.run_dir) / "events.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    assert [(e.pop("type"), e.pop("runId"), e.pop("ts"))[0] for e in logged] == [
        kind for kind, _ in stored
    ]
    assert logged == [data for _, data in stored]
    # R-RUN-5's files beside each child: its shim made the child's directory (no task file).
    for child in done.children:
        assert (Path(done.run_dir) / f"child-{child.index}" / "shim.json").is_file()


def test_a_failed_parallel_task_fails_the_run_while_its_siblings_still_run(
    client: Client, agents: Path
) -> None:
    ctx = launch_context(agents)
    tasks = [item(ctx, "fail", "first"), item(ctx, "echo", "second"), item(ctx, "echo", "third")]
    launch = ctx.launch("parallel", False, items=tasks, concurrency=1)

    done = client.runs.wait(client.runs.launch(launch).run_id, timeout=30)

    assert done.state == "failed"
    assert done.error == "broken: first"  # R-EXT-3: the stderr tail
    assert [(c.state, c.exit_code) for c in done.children] == [
        ("failed", 3),
        ("complete", 0),
        ("complete", 0),
    ]


# -- chain ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_chain_runs_steps_in_order_and_previous_carries_the_previous_steps_output(
    client: Client, agents: Path, background: bool
) -> None:
    ctx = launch_context(agents)
    chain = [
        ChainStep(parallel=True, items=[item(ctx, "echo", "alpha"), item(ctx, "echo", "beta")]),
        ChainStep(items=[item(ctx, "echo", "got: {previous}")]),
        ChainStep(items=[item(ctx, "echo", "final <{previous}>")]),
    ]

    done = client.runs.wait(
        client.runs.launch(ctx.launch("chain", background, chain=chain)).run_id, timeout=30
    )

    assert done.state == "complete"
    assert [(c.label, c.output) for c in done.children] == [
        ("chain[0].parallel[0]", "alpha"),
        ("chain[0].parallel[1]", "beta"),
        ("chain[1]", "got: alpha\n\nbeta"),
        ("chain[2]", "final <got: alpha\n\nbeta>"),
    ]
    assert done.output == "final <got: alpha\n\nbeta>"
    # A step starts only after every child of the step before it has exited.
    order = [(e.kind, e.data["child"]) for e in events_of(client, done.run_id) if "child" in e.data]
    step_of = {0: 0, 1: 0, 2: 1, 3: 2}
    for position, (kind, child) in enumerate(order):
        if kind == "child.started":
            earlier = {c for k, c in order[:position] if k == "child.exited"}
            needed = {c for c, step in step_of.items() if step < step_of[int(str(child))]}
            assert needed <= earlier, f"child {child} started before its previous step ended"


def test_a_failed_chain_step_ends_the_chain_and_later_steps_never_start(
    client: Client, agents: Path
) -> None:
    ctx = launch_context(agents)
    chain = [ChainStep(items=[item(ctx, "fail", "step zero")])]
    chain.append(ChainStep(items=[item(ctx, "echo", "{previous}")]))

    done = client.runs.wait(
        client.runs.launch(ctx.launch("chain", False, chain=chain)).run_id, timeout=30
    )

    assert done.state == "failed" and done.error == "broken: step zero"
    assert done.children[0].state == "failed"
    assert done.children[1].state != "complete" and done.children[1].pid is None
    assert "child.started" not in [
        e.kind for e in events_of(client, done.run_id) if e.data.get("child") == 1
    ]


# -- deadlines and stop ---------------------------------------------------------------------------


def sleeper_with_grandchild(directory: Path, ignore_term: bool) -> tuple[str, Path]:
    fifo = directory / f"ready-{uuid.uuid4().hex[:6]}.fifo"
    os.mkfifo(fifo)
    return f"seconds=60 grandchild=1 ignore_term={int(ignore_term)} ready={fifo}", fifo


def test_r_tmo_deadline_kills_the_whole_process_tree_and_fails_the_run_with_the_timeout_message(
    client: Client, agents: Path, state_dir: Path
) -> None:
    ctx = launch_context(agents)
    task, fifo = sleeper_with_grandchild(state_dir, ignore_term=True)  # only SIGKILL ends them

    started = client.runs.launch(ctx.single("sleeper", task, False, 1000))
    leader, grandchild = map(int, read_fifo(fifo).split())
    done = client.runs.wait(started.run_id, timeout=20)

    assert done.state == "failed"
    assert done.error == timeout_error(1.0) == "Subagent timed out after 1000 ms."
    [child] = done.children
    assert (child.state, child.exit_code, child.pid) == ("failed", 1, leader)
    assert child.proof_state == "observed"
    assert process_gone(leader) and process_gone(grandchild)


def test_r_tmo_5_a_composite_run_deadline_ends_every_childs_tree_and_fails_the_run(
    client: Client, agents: Path, state_dir: Path
) -> None:
    ctx = launch_context(agents)
    task, fifo = sleeper_with_grandchild(state_dir, ignore_term=False)
    tasks = [item(ctx, "sleeper", task), item(ctx, "sleeper", "seconds=60")]

    started = client.runs.launch(ctx.launch("parallel", False, items=tasks, timeout_ms=1000))
    leader, grandchild = map(int, read_fifo(fifo).split())
    done = client.runs.wait(started.run_id, timeout=20)

    assert started.deadline_at is not None
    assert done.state == "failed" and done.error == "Run timed out after 1000 ms."
    assert [c.state for c in done.children] == ["stopped", "stopped"]
    pids = [leader, grandchild, *(c.pid for c in done.children if c.pid)]
    assert all(process_gone(pid) for pid in pids)


def test_stop_run_marks_the_run_and_its_children_stopped_not_failed_and_frees_the_slot(
    client: Client, agents: Path, state_dir: Path
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    task, fifo = sleeper_with_grandchild(state_dir, ignore_term=False)
    started = client.runs.launch(ctx.single("sleeper", task, True, None))
    leader, grandchild = map(int, read_fifo(fifo).split())

    client.runs.stop(started.run_id[:6])  # a unique prefix names the run
    done = client.runs.wait(started.run_id, timeout=20)

    assert done.state == "stopped" and done.error == ""
    [child] = done.children
    assert (child.state, child.exit_code, child.error) == ("stopped", 1, "Stopped by request.")
    assert child.proof_state == "observed"
    assert process_gone(leader) and process_gone(grandchild)
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    # Stopping a settled run changes nothing.
    assert client.runs.stop(started.run_id).state == "stopped"


def test_stop_of_a_chain_ends_the_running_step_and_never_starts_the_next(
    client: Client, agents: Path, gate: Gate
) -> None:
    ctx = launch_context(agents)
    chain = [ChainStep(items=[item(ctx, "gate", str(gate.path))])]
    chain.append(ChainStep(items=[item(ctx, "echo", "{previous}")]))
    started = client.runs.launch(ctx.launch("chain", True, chain=chain))
    [first] = gate.accept(1)

    client.runs.stop(started.run_id)
    first.wait_exit()
    done = client.runs.wait(started.run_id, timeout=20)

    assert done.state == "stopped"
    assert [c.state for c in done.children] == ["stopped", "stopped"]
    assert done.children[1].pid is None


def test_r_misc_1_task_text_is_never_written_to_the_state_db(
    client: Client, agents: Path, node: Node
) -> None:
    ctx = launch_context(agents)
    secret = f"secret-{uuid.uuid4().hex}"

    done = client.runs.wait(
        client.runs.launch(ctx.single("sleeper", f"{secret} seconds=0", True, None)).run_id,
        timeout=20,
    )

    assert done.state == "complete" and done.output == "slept 0"
    stored = b"".join(p.read_bytes() for p in node.state_dir.glob("*.db*"))
    assert stored, "the store files exist"
    assert secret.encode() not in stored


def view_states(run: RunView) -> list[str]:
    return [child.state for child in run.children]


def test_watch_answers_as_soon_as_a_run_has_new_events(
    client: Client, agents: Path, gate: Gate
) -> None:
    ctx = launch_context(agents)
    started = client.runs.launch(ctx.single("gate", str(gate.path), False, None))
    [child] = gate.accept(1)
    running = wait_view(client, started.run_id, lambda v: v.children[0].pid is not None)
    assert view_states(running) == ["running"]

    child.release(0)
    done = wait_view(client, started.run_id, lambda v: v.state == "complete")

    assert view_states(done) == ["complete"]


def test_a_launch_without_an_environment_gives_its_child_the_nodes_without_owner_internals(
    client: Client, agents: Path
) -> None:
    """`Launch.env` None means the node's own environment: the variables the node was started
    with, not what an owner process of the node sets for itself."""
    write_agent(agents, "env", "prints its environment", '["/usr/bin/env"]', task_delivery="stdin")
    launch = launch_context(agents).single("env", "-", False, None).model_copy(update={"env": None})

    done = client.runs.wait(client.runs.launch(launch).run_id, timeout=20)

    assert done.state == "complete", done.error
    names = {line.split("=", 1)[0] for line in done.output.splitlines() if "=" in line}
    assert "PATH" in names  # the node's own environment
    assert not {name for name in names if name.startswith("SUBAGENTS_OWNER")}
