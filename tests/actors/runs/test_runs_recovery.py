"""Crashes: a launcher killed between acquire and start, and a node killed with -9 (SPEC §0.4).

- A slot acquired by a launcher that dies before it starts anything is freed by the reservation
  TTL (`reservation_ttl_s`, 1 s here) and by nothing else.
- After `kill -9` of a node whose run has two children, one of which exits while no node is
  running, a restarted node settles the dead child from its shim's report (its true exit
  status: the shim was its parent), adopts the live one and settles it when it exits; the run
  then ends and its capacity slot is released (R-CAP-21/25, R-RUN-5, SPEC §0.4 "Proof from the
  parent"). Real node processes, real sockets, real children; every wait has a deadline.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.paths import owner_db
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.capacity import Inspection
from subagents_node.messages.errors import CapacityExhausted, RunNotResumable, SubagentsError
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import (
    LaunchResult,
    RunList,
    RunView,
    StopReleased,
    TaskItem,
)
from subagents_node.node.node import Node
from tests.support.nodes import REPO, NodeProcess, new_state_dir
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import (
    Gate,
    GateChild,
    launch_context,
    new_session,
    process_gone,
    wait_until,
    wait_view,
    write_agent,
)

ACQUIRE_THEN_HANG = """\
import sys
from subagents_node.client.client import connect

client = connect(sys.argv[1])
handle = client.capacity.acquire(sys.argv[2], 1, sys.argv[3])
print(handle.slot, flush=True)
sys.stdin.read()  # a launcher stuck before it starts its run, until it is killed
"""


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the launcher never reported its slot"
    return proc.stdout.readline().strip()


def test_a_slot_acquired_by_a_launcher_killed_before_it_started_is_freed_by_the_reservation_ttl(
    state_dir: Path,
) -> None:
    ttl_s = 1.0
    session, run_id = new_session(), "launcher-crashed-run"
    with Node.embedded(state_dir=state_dir, settings={"reservation_ttl_s": ttl_s}) as node:
        client = node.client()
        began = time.monotonic()
        with subprocess.Popen(
            [sys.executable, "-c", ACQUIRE_THEN_HANG, node.address, session, run_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        ) as launcher:
            try:
                assert read_line(launcher) == "0"
                assert client.capacity.snapshot(session, 1).used == 1
                owner = client.capacity.inspect(run_id, session).owner
                assert owner is not None and owner.runner_started_at is None
                assert owner.expires_at is not None
            finally:
                launcher.send_signal(signal.SIGKILL)

        wait_until(lambda: client.capacity.snapshot(session, 1).used == 0, 15, "TTL expiry")

        assert time.monotonic() - began >= ttl_s  # freed by the TTL, not by the crash itself
        assert client.capacity.inspect(run_id, session).relation == "none"
        handle = client.capacity.acquire(session, 1, "next-run")
        assert handle is not None and handle.slot == 0


def child_of(run: RunView, pid: int) -> int:
    return next(c.index for c in run.children if c.pid == pid)


def test_r_run_5_node_kill_9_and_restart_settles_exited_children_with_their_exit_status(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    first_node = start_node(state_dir=state_dir)
    client = first_node.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    tasks = [TaskItem(agent=ctx.plan("gate"), task=str(gate.path)) for _ in range(2)]
    run = client.runs.launch(ctx.launch("parallel", True, items=tasks, concurrency=2))
    short, long = gate.accept(2)
    running = wait_view(client, run.run_id, lambda v: all(c.pid for c in v.children))
    short_index, long_index = child_of(running, short.pid), child_of(running, long.pid)
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1

    first_node.kill()
    short.release(0)
    short.wait_exit()  # it ended while no node was running: only its shim saw its exit code
    assert process_gone(short.pid) and not process_gone(long.pid)

    second_node = start_node(state_dir=state_dir)
    client = second_node.client()
    recovered = wait_view(client, run.run_id, lambda v: v.children[short_index].state != "running")

    dead, live = recovered.children[short_index], recovered.children[long_index]
    assert (dead.state, dead.proof_state, dead.exit_code) == ("complete", "observed", 0)
    assert (live.state, live.proof_state) == ("running", None)
    assert recovered.state == "running"
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1  # a live child keeps the slot

    long.release(3)
    long.wait_exit()
    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "failed"  # the shim, its parent, saw the exit status across the restart
    assert [c.proof_state for c in done.children] == ["observed", "observed"]
    assert (done.children[long_index].state, done.children[long_index].exit_code) == ("failed", 3)
    kinds = [e.kind for e in client.runs.watch(run.run_id, 0, 0).events]
    assert kinds.count("run.recovered") == 1 and kinds[-1] == "run.failed"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    assert client.capacity.inspect(run.run_id).relation == "none"


def test_after_a_node_restart_stop_and_a_run_deadline_still_end_the_adopted_children(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    first_node = start_node(state_dir=state_dir)
    client = first_node.client()
    ctx = launch_context(agents)
    item = TaskItem(agent=ctx.plan("gate"), task=str(gate.path))
    to_stop = client.runs.launch(ctx.launch("parallel", True, items=[item]))
    [stopped_child] = gate.accept(1)
    # R-TMO-5: an async composite has a run deadline only when the call gives one.
    timed = client.runs.launch(ctx.launch("parallel", True, items=[item], timeout_ms=2500))
    [timed_child] = gate.accept(1)
    assert timed.deadline_at is not None
    for run, child in ((to_stop, stopped_child), (timed, timed_child)):
        wait_view(client, run.run_id, lambda v, pid=child.pid: v.children[0].pid == pid)

    first_node.kill()
    client = start_node(state_dir=state_dir).client()
    client.runs.stop(to_stop.run_id)

    stopped = client.runs.wait(to_stop.run_id, timeout=20)
    timed_out = client.runs.wait(timed.run_id, timeout=20)

    assert (stopped.state, stopped.children[0].state) == ("stopped", "stopped")
    assert (timed_out.state, timed_out.error) == ("failed", "Run timed out after 2500 ms.")
    assert timed_out.children[0].state == "stopped"
    for child in (stopped_child, timed_child):
        child.wait_exit()  # ended by the restarted node, not released by the test


def test_a_stop_in_its_grace_when_the_node_dies_ends_the_run_stopped_after_restart(
    start_node: Callable[..., NodeProcess], state_dir: Path, tmp_path: Path
) -> None:
    """The adopted run had forgotten it was being stopped: its TERM-deaf child was KILLed at
    the end of the grace and the run ended `failed` ("Stopped by request."), resumable."""
    stubborn = write_agent(
        tmp_path / "agents", "stubborn", "ignores TERM", '["sh", "-c", "trap \'\' TERM; sleep 60"]'
    )
    first_node = start_node(state_dir=state_dir)
    client = first_node.client()
    ctx = launch_context(stubborn.parent)
    run = client.runs.launch(ctx.single("stubborn", "x", True, None))
    wait_view(client, run.run_id, lambda v: v.children[0].pid is not None)
    client.runs.stop(run.run_id)
    first_node.kill()  # well inside the stop's 2 s grace: the child still runs

    client = start_node(state_dir=state_dir).client()
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "stopped", (done.state, done.error)
    with pytest.raises(RunNotResumable) as refused:
        client.ask(Resume(run_id=run.run_id, capacity_limit=0), LaunchResult)
    assert refused.value.details["reason"] == "stopped"


def test_a_forgotten_workers_stop_in_its_grace_when_the_node_dies_still_says_why_after_restart(
    start_node: Callable[..., NodeProcess], state_dir: Path, tmp_path: Path
) -> None:
    """`runs.stop_released` (a worker its home forgot stops the runs whose slots were
    released) ends them `stopped` with its reason as their error. A node killed in the stop's
    grace used to finish the stop after its restart without it: the run ended `stopped` with
    no error, and nothing said why."""
    stubborn = write_agent(
        tmp_path / "agents", "stubborn", "ignores TERM", '["sh", "-c", "trap \'\' TERM; sleep 60"]'
    )
    first_node = start_node(state_dir=state_dir)
    client = first_node.client()
    ctx = launch_context(stubborn.parent, max_active_async_runs_per_session=1)  # a slot
    run = client.runs.launch(ctx.single("stubborn", "x", True, None))
    wait_view(client, run.run_id, lambda v: v.children[0].pid is not None)
    why = "Stopped: this worker was forgotten by its home."
    stopping = client.ask(StopReleased(reason=why), RunList)
    assert [v.run_id for v in stopping.runs] == [run.run_id]
    first_node.kill()  # well inside the stop's 2 s grace: the child still runs

    client = start_node(state_dir=state_dir).client()
    done = client.runs.wait(run.run_id, timeout=30)
    assert (done.state, done.error) == ("stopped", why)


def test_an_exit_record_whose_report_never_reached_the_store_settles_its_run_after_restart(
    agents: Path,
) -> None:
    """The shim wrote its exit record, but the node died before the report was committed: on
    restart the record settles the child and the run, freeing its capacity slot, instead of
    leaving them running forever."""
    state = new_state_dir()
    try:
        ctx = launch_context(agents, max_active_async_runs_per_session=1)
        with Node.embedded(state_dir=state) as node:
            client = node.client()
            run = client.runs.launch(ctx.single("echo", "quick-output", True, None))
            done = client.runs.wait(run.run_id, timeout=30)
            assert done.state == "complete"
        # Rewind every row to "still running"; the shim's exit record beside the run stays.
        with sqlite3.connect(owner_db(state, "supervisor")) as db:
            db.execute(
                "UPDATE children SET state='running', proof=NULL WHERE run_id=?", (run.run_id,)
            )
            db.execute(
                "UPDATE runs SET state='running', ended_at=NULL WHERE run_id=?", (run.run_id,)
            )
            db.execute(
                "UPDATE run_children SET state='running', proof_state=NULL WHERE run_id=?",
                (run.run_id,),
            )
        with Node.embedded(state_dir=state) as node:
            client = node.client()
            settled = client.runs.wait(run.run_id, timeout=30)
            assert settled.state == "complete"
            assert settled.children[0].proof_state == "observed"
            assert "quick-output" in settled.output
            assert client.capacity.snapshot(ctx.session_id, limit=1).used == 0
    finally:
        shutil.rmtree(state, ignore_errors=True)


EMBED_AND_EXIT = """\
import sys
import subagents_node
from subagents_node.messages.supervisor import AgentPlan, Launch, TaskItem

sleeper = AgentPlan(name="sleep", command=["/bin/sleep", "{task}"], task_delivery="argv")
with subagents_node.Node.embedded(state_dir=sys.argv[1]) as node:
    run = node.client().runs.launch(
        Launch(session_id="s", mode="single", background=True, cwd="/tmp",
               items=[TaskItem(agent=sleeper, task="60")])
    )
    print(run.children[0].child_id, flush=True)
"""


def test_a_program_embedding_a_node_exits_while_a_background_child_runs_on() -> None:
    """Stopping a node leaves its children running for the next node to adopt, but must not
    keep the program that embedded it alive until they end."""
    state = new_state_dir()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", EMBED_AND_EXIT, str(state)],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr
        with sqlite3.connect(owner_db(state, "supervisor")) as db:
            (pid,) = db.execute("SELECT pid FROM children").fetchone()
        assert not process_gone(pid)  # still running, waiting to be adopted
        os.kill(pid, signal.SIGKILL)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def died_at_shim_launched(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
) -> tuple[LaunchContext, GateChild]:
    """A background gate run (max_active 1) launched on a node that kills itself once the
    run's child is forked (`shim_launched`): the launch gets an error, its slot is unstarted,
    and the child runs on at the gate (its shim outlives the node)."""
    dying = start_node("--faults", state_dir=state_dir, kill_at="shim_launched")
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    with pytest.raises(SubagentsError):
        dying.client(timeout=5).runs.launch(ctx.single("gate", str(gate.path), True, None))
    assert dying.wait_exited(10), "the node did not die at shim_launched"
    [held] = gate.accept(1)
    return ctx, held


@pytest.mark.slow
def test_r_cap_7_a_run_whose_child_started_before_a_kill_9_keeps_its_slot_past_the_ttl(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    agents: Path,
    gate: Gate,
) -> None:
    """The node dies once a background run's child has started, before the run's slot is
    marked started (`shim_launched`). The child runs on (its shim outlives the node); after
    the restart its slot is still unstarted, so its TTL used to free it while the run went on,
    and a second background run of the session was admitted past max_active (R-CAP-7, §0.4).
    Now the restarted node marks the adopted run's slot started, and the slot is released
    only when the run ends."""
    monkeypatch.setenv("SUBAGENTS_RESERVATION_TTL_S", "1")
    ctx, held = died_at_shim_launched(start_node, state_dir, agents, gate)

    client = start_node(state_dir=state_dir).client(timeout=20)
    [run] = wait_until(lambda: [r for r in client.runs.list() if r.state == "running"])

    def settled_slot() -> Inspection | None:
        inspection = client.capacity.inspect(run.run_id, ctx.session_id)
        owner = inspection.owner
        return inspection if owner is None or owner.runner_started_at is not None else None

    slot = wait_until(settled_slot, what="the slot started or freed by its 1 s TTL")
    with pytest.raises(CapacityExhausted):  # max_active is 1 and the first run still runs
        client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    assert slot.owner is not None and slot.owner.run_id == run.run_id
    assert client.runs.show(run.run_id).state == "running"

    held.release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


@pytest.mark.slow
def test_r_fan_6_a_run_whose_node_was_killed_as_its_child_started_resumes_on_its_own_budget(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
) -> None:
    """The descriptor is durable before the child starts: a kill -9 of the node right after
    the fork leaves a run that, once adopted and ended, resumes on the very budget it claimed
    from, and the resume claims nothing (R-FAN-23)."""
    ctx, held = died_at_shim_launched(start_node, state_dir, agents, gate)
    client = start_node(state_dir=state_dir).client(timeout=20)
    [run] = wait_until(lambda: client.runs.list(), what="the adopted run")
    budget = decode_descriptor(run.fanout_descriptor)
    assert client.fanout.snapshot(budget).used == 1
    held.release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")

    request = Resume(run_id=run.run_id, capacity_limit=1)  # the gate task names the socket
    resumed = client.ask(request, LaunchResult).run
    [again] = gate.accept(1)
    again.release(0)

    assert client.runs.wait(resumed.run_id, timeout=20).state == "complete"
    assert decode_descriptor(resumed.fanout_descriptor) == budget
    assert client.fanout.snapshot(budget).used == 1


@pytest.mark.slow
def test_r_cap_7_an_adopted_run_whose_unstarted_slot_was_lost_meanwhile_is_stopped(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
) -> None:
    """As above, but the unstarted slot is gone when the restarted node marks it started (here
    deleted behind the node's back while it is down, as a lost grant would be): the run holds
    no slot, so it does not go on uncounted; it is stopped, failed, and says why."""
    _, held = died_at_shim_launched(start_node, state_dir, agents, gate)
    with sqlite3.connect(owner_db(state_dir, "capacity")) as db:
        assert db.execute("DELETE FROM capacity_slots").rowcount == 1

    client = start_node(state_dir=state_dir).client(timeout=20)
    [run] = wait_until(lambda: client.runs.list(), what="the adopted run")
    done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "failed" and "capacity slot was lost" in done.error
    held.wait_exit()  # its child was stopped with it


def test_r_run_4_the_initial_status_is_recorded_before_the_launch_is_answered_and_survives_kill_9(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    """R-RUN-4: a run's status is its row in the supervisor's store, written in one
    transaction (the store's atomic replace). By the time the launch is answered it says
    running, with the run's session, id, mode and runner id, its child's pid with the proof
    still pending, and the fan-out snapshot; a kill -9 of the node right then loses none of
    it, and the run ends normally after a restart."""
    first_node = start_node(state_dir=state_dir)
    client = first_node.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)

    first_node.kill()
    client = start_node(state_dir=state_dir).client()
    seen = client.runs.show(run.run_id)

    for view in (run, seen):
        assert (view.state, view.mode, view.background) == ("running", "single", True)
        assert (view.run_id, view.session_id, view.runner_id) == (
            run.run_id,
            ctx.session_id,
            run.runner_id,
        )
        assert (view.snapshots.fanout_used, view.snapshots.fanout_limit) == (1, 64)
        [only] = view.children
        assert (only.label, only.pid, only.proof_state) == ("single", child.pid, None)
    child.release(0)
    done = client.runs.wait(run.run_id, timeout=20)
    assert (done.state, done.output) == ("complete", "released 0"), done.error
