"""kill -9 of the node during a pause, at a checkpoint and during an expansion (R-RUN-2, R-FAN-21).

No step of the new paths leaves a stuck run or a leaked slot (SPEC §0.4):
- killed while a pause settles (`pause_settle`: the children were stopped, the run not yet
  `paused`), a restarted node settles the run `paused`, keeping its slot, and `resume` goes on;
- killed while a run waits at a checkpoint, the paused run is not adopted (it holds no
  process): `approve` continues it in a new run that takes its slot over, `reject` frees it;
- a paused run (a checkpoint wait, or `pause`) whose deadline passes across a restart fails
  timed out and frees its slot, as it would have without the restart;
- killed while an expansion's claim is out (`expand_claim`, `expand_record`), the run fails
  after the restart (its items never start) and its slot is freed.

Real detached node processes (fault injection through SUBAGENTS_TEST_KILL_AT), real children.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from pathlib import Path

import pytest

from subagents_node.actors.capacity.rules import NO_SLOT
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import PauseRefused, SubagentsError
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView, TaskItem
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, wait_until, wait_view

LIMIT = 1


def step(ctx: LaunchContext, agent: str, task: str) -> ChainStep:
    return ChainStep(items=[TaskItem(agent=ctx.plan(agent), task=task)])


def used(client: Client, ctx: LaunchContext) -> int:
    return client.capacity.snapshot(ctx.session_id, LIMIT).used


def freed(client: Client, ctx: LaunchContext) -> bool:
    return used(client, ctx) == 0


@pytest.mark.slow
def test_r_run_2_kill_9_while_a_pause_settles_leaves_a_paused_run_that_resumes(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
) -> None:
    first = start_node("--faults", state_dir=state_dir, kill_at="pause_settle")
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "{previous} then more")]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    [child] = gate.accept(1)

    client.runs.pause(run.run_id)
    child.wait_exit()
    assert first.wait_exited(10), "the node did not die at pause_settle"

    client = start_node(state_dir=state_dir).client()
    source = wait_view(client, run.run_id, lambda v: v.state == "paused")
    assert source.paused == "interrupt"
    assert client.capacity.inspect(run.run_id, ctx.session_id).verdict.reason == (
        "run is still paused"
    )
    assert used(client, ctx) == 1

    resumed = client.ask(Resume(run_id=run.run_id, capacity_limit=LIMIT), LaunchResult).run
    [again] = gate.accept(1)
    again.release(0)
    done = client.runs.wait(resumed.run_id, timeout=20)

    assert done.state == "complete" and done.output == "released 0 then more"
    assert done.deadline_at == run.deadline_at  # R-TMO-8 across the restart too
    wait_until(lambda: used(client, ctx) == 0, what="release")


@pytest.mark.slow
def test_r_res_5_kill_9_before_a_continuation_took_the_paused_runs_slot_leaks_nothing(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    agents: Path,
    gate: Gate,
) -> None:
    """The node dies once a paused run's continuation is recorded, before its mark_started
    (`fork_shim`). Its transferred slot is unstarted: the TTL gives it back to the paused run
    (R-CAP-16), unless the restarted node marks it started first. The restarted node used to
    end the paused run ("continued") at once, so in the first case the slot it held again was
    "still paused" for good. Now the slot's owner decides: either the paused run keeps it and
    resumes, or the continuation took it and frees it when it ends."""
    monkeypatch.setenv("SUBAGENTS_RESERVATION_TTL_S", "1")
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "{previous} then more")]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    [child] = gate.accept(1)
    client.runs.pause(run.run_id)
    wait_view(client, run.run_id, lambda v: v.state == "paused")
    child.wait_exit()
    first.cleanup()
    dying = start_node("--faults", state_dir=state_dir, kill_at="fork_shim")
    with pytest.raises(SubagentsError):
        dying.client(timeout=5).ask(Resume(run_id=run.run_id, capacity_limit=LIMIT), LaunchResult)
    assert dying.wait_exited(10), "the node did not die at fork_shim"

    client = start_node(state_dir=state_dir).client()
    [going] = wait_until(
        lambda: [r for r in client.runs.list() if r.source_run_id == run.run_id],
        what="the recorded continuation",
    )
    assert client.runs.wait(going.run_id, timeout=20).state == "failed"  # started nothing
    source = client.runs.show(run.run_id)
    if source.state == "paused":  # the slot went back to it, or to the failed continuation
        inspection = client.capacity.inspect(run.run_id, ctx.session_id)
        # Back to it: it keeps the slot. The continuation's (marked started after the restart,
        # which gives the slot a full TTL): its failure freed the slot, the resume acquires.
        assert inspection.verdict.reason in ("run is still paused", NO_SLOT)
        resumed = client.ask(Resume(run_id=run.run_id, capacity_limit=LIMIT), LaunchResult).run
        [again] = gate.accept(1)
        again.release(0)
        assert client.runs.wait(resumed.run_id, timeout=20).state == "complete"
    else:
        assert source.state == "stopped"
    wait_until(lambda: used(client, ctx) == 0, what="no slot held without a live run")


@pytest.mark.slow
@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_r_run_2_kill_9_while_waiting_at_a_checkpoint_then_a_decision_after_restart(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, decision: str
) -> None:
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    chain = [
        step(ctx, "echo", "one"),
        ChainStep(kind="checkpoint"),
        step(ctx, "echo", "after {previous}"),
    ]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain))
    wait_view(client, run.run_id, lambda v: v.state == "paused")

    first.kill()
    client = start_node(state_dir=state_dir).client()

    waiting = client.runs.show(run.run_id)
    assert (waiting.state, waiting.paused) == ("paused", "checkpoint")  # not adopted, not ended
    assert used(client, ctx) == 1
    if decision == "approve":
        goes_on = client.runs.approve(run.run_id, capacity_limit=LIMIT)
        assert goes_on.run_id != run.run_id and goes_on.source_run_id == run.run_id
        done = client.runs.wait(goes_on.run_id, timeout=20)
        assert done.state == "complete" and done.output == "after one"
        assert [c.label for c in done.children] == ["chain[2]"]
        assert client.runs.show(run.run_id).resumed_by == goes_on.run_id
    else:
        client.runs.reject(run.run_id, reason="no")
        assert client.runs.show(run.run_id).state == "rejected"
    wait_until(lambda: used(client, ctx) == 0, what="release")


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["stop", "kill"])
def test_r_run_2_a_checkpoint_wait_still_ends_at_its_deadline_after_a_node_restart(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, restart: str
) -> None:
    """While a run waits at a checkpoint its deadline keeps counting. The paused run is not
    adopted by the next node (it holds no process), and its deadline was not re-armed: it
    stayed `paused` with its slot for good, and `approve` was refused (deadline expired).
    `stop` restarts before the deadline (the timer is re-armed), `kill` after it passed while
    no node ran (it fires at once)."""
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    chain = [step(ctx, "echo", "one"), ChainStep(kind="checkpoint"), step(ctx, "echo", "two")]
    budget_ms = 3000 if restart == "stop" else 1000
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=budget_ms))
    wait_view(client, run.run_id, lambda v: v.state == "paused")
    client = _restarted(first, restart, run, start_node, state_dir)
    _timed_out_and_freed(client, run.run_id, budget_ms, ctx)


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["stop", "kill"])
def test_r_run_2_a_paused_run_still_ends_at_its_deadline_after_a_node_restart(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
    restart: str,
) -> None:
    """A run `pause` stopped keeps its deadline counting, as a checkpoint wait does. The next
    node does not adopt it (it holds no process) and timed only checkpoint waits again: it
    stayed `paused` with its slot for good, and `resume` was refused (deadline expired).
    `stop` restarts before the deadline (timed again), `kill` after it passed while no node
    ran (it fires at once)."""
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "never")]
    budget_ms = 4000 if restart == "stop" else 1500
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=budget_ms))
    [child] = gate.accept(1)
    client.runs.pause(run.run_id)
    wait_view(client, run.run_id, lambda v: v.state == "paused")
    child.wait_exit()
    client = _restarted(first, restart, run, start_node, state_dir)
    _timed_out_and_freed(client, run.run_id, budget_ms, ctx)
    assert client.capacity.inspect(run.run_id, ctx.session_id).relation == "none"


def _restarted(
    first: NodeProcess,
    restart: str,
    run: RunView,
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
) -> Client:
    """The node stopped (before `run`'s deadline) or killed (and the deadline let pass while
    no node runs), then the next node started: a client of it."""
    deadline = run.deadline_at
    assert deadline is not None
    if restart == "stop":
        first.stop()
    else:
        first.kill()
        wait_until(lambda: time.time() > deadline, what="the deadline to pass")
    return start_node(state_dir=state_dir).client()


def _timed_out_and_freed(client: Client, run_id: str, budget_ms: int, ctx: LaunchContext) -> None:
    ended = client.runs.wait(run_id, timeout=20)
    assert (ended.state, ended.error) == ("failed", f"Run timed out after {budget_ms} ms.")
    wait_until(lambda: freed(client, ctx), what="release")


def _approve_and_reject_at_once(node: NodeProcess, run_id: str) -> dict[str, object]:
    """`approve` and `reject` of `run_id` from two threads at once: what each won."""
    start = threading.Barrier(2)
    won: dict[str, object] = {}

    def decide(what: str) -> None:
        own = node.client()
        start.wait(timeout=10)
        with suppress(PauseRefused):
            if what == "approve":
                won[what] = own.runs.approve(run_id, capacity_limit=LIMIT).run_id
            else:
                won[what] = own.runs.reject(run_id, reason="no").state

    threads = [threading.Thread(target=decide, args=(w,)) for w in ("approve", "reject")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return won


@pytest.mark.slow
def test_r_run_2_after_a_restart_an_approve_and_a_reject_sent_at_once_never_both_win(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """After a restart an approval goes on in a new run, admitted while the checkpoint still
    waits; a reject arriving meanwhile used to end the run `rejected` while that new run went
    on past the checkpoint anyway."""
    first = start_node(state_dir=state_dir)
    client = first.client()
    waiting = []
    for _ in range(4):
        ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
        chain = [step(ctx, "echo", "one"), ChainStep(kind="checkpoint"), step(ctx, "echo", "two")]
        run = client.runs.launch(ctx.launch("chain", True, chain=chain))
        waiting.append((wait_view(client, run.run_id, lambda v: v.state == "paused"), ctx))
    first.kill()
    node = start_node(state_dir=state_dir)

    for run, ctx in waiting:
        won = _approve_and_reject_at_once(node, run.run_id)

        client = node.client()
        assert len(won) == 1, won
        if "approve" in won:
            done = client.runs.wait(str(won["approve"]), timeout=20)
            assert done.state == "complete"
            assert client.runs.show(run.run_id).state == "stopped"  # continued
        else:
            assert client.runs.show(run.run_id).state == "rejected"
            assert not [r for r in client.runs.list() if r.source_run_id == run.run_id]
        wait_until(partial(freed, client, ctx), what="release")


@pytest.mark.slow
@pytest.mark.parametrize("point", ["expand_claim", "expand_record"])
def test_r_fan_21_kill_9_during_an_expansion_fails_the_run_after_restart_and_frees_its_slot(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    point: str,
) -> None:
    first = start_node("--faults", state_dir=state_dir, kill_at=point)
    client = first.client(timeout=5)
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    template = TaskItem(agent=ctx.plan("echo"), task="got {item}")
    chain = [step(ctx, "echo", "a\nb\nc"), ChainStep(kind="expand", items=[template])]
    try:
        run_id = client.runs.launch(ctx.launch("chain", True, chain=chain)).run_id
    except SubagentsError:
        run_id = ""  # the node died before it answered the launch
    assert first.wait_exited(20), f"the node did not die at {point}"

    client = start_node(state_dir=state_dir).client()
    [run] = client.runs.list(session_id=ctx.session_id)
    assert not run_id or run.run_id == run_id
    done = client.runs.wait(run.run_id, timeout=30)

    assert done.state == "failed", done
    assert not any(c.label.startswith("chain[1].expand") and c.pid for c in done.children)
    wait_until(lambda: used(client, ctx) == 0, what="release")
