"""Paused runs: checkpoints, interrupt-as-pause and resume's deadline (R-RUN-2, R-TMO-8, A-2).

A `checkpoint` chain step pauses the run for a decision: `approve` goes on past it (the same
run, its slot and deadline unchanged), `reject` ends it `rejected` (terminal, R-RUN-3: its slot
is freed). `pause` stops a background run's child tree and the run settles `paused`: it holds
no process and keeps its slot (the verdict is "run is still paused"), so the `resume` that goes
on from the interrupted step takes the slot over (R-CAP-18, SPEC §0.4 / A-2 resolved), claims
nothing (R-FAN-23) and inherits the source's absolute deadline (R-TMO-8). The deadline keeps
counting while the run is paused: once it passes the run fails timed out and frees its slot,
and a resume then fails with R-TMO-8's text and changes no ledger.

Embedded node, real children (the gate agent holds a step open until the test releases it).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from subagents_node.actors.runs.admission import FAULT_POINTS
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import (
    AppendRejected,
    DeadlineExpired,
    InjectedFault,
    PauseRefused,
    RunNotResumable,
)
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.lineage import Append, AppendResult, Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView, TaskItem
from subagents_node.node.node import Node
from tests.support.manage import embedded
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import (
    Gate,
    launch_context,
    ledgers,
    stop_process,
    wait_until,
    wait_view,
    write_agent,
)

LIMIT = 2


@pytest.fixture
def ctx(agents: Path) -> LaunchContext:
    return launch_context(agents, max_active_async_runs_per_session=LIMIT)


def step(ctx: LaunchContext, agent: str, task: str) -> ChainStep:
    return ChainStep(items=[TaskItem(agent=ctx.plan(agent), task=task)])


def paused(client: Client, run_id: str) -> RunView:
    return wait_view(client, run_id, lambda v: v.state == "paused")


def resume(client: Client, run_id: str) -> RunView:
    return client.ask(Resume(run_id=run_id, capacity_limit=LIMIT), LaunchResult).run


def used(client: Client, ctx: LaunchContext) -> int:
    return client.capacity.snapshot(ctx.session_id, LIMIT).used


def checkpoint_chain(client: Client, ctx: LaunchContext) -> RunView:
    chain = [
        step(ctx, "echo", "one"),
        ChainStep(kind="checkpoint", note="look at one"),
        step(ctx, "echo", "after {previous}"),
    ]
    return client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))


def test_r_run_2_checkpoint_approved_goes_on_past_it_in_the_same_run(
    client: Client, ctx: LaunchContext
) -> None:
    run = checkpoint_chain(client, ctx)
    waiting = paused(client, run.run_id)

    assert (waiting.paused, waiting.paused_step, waiting.checkpoint_note) == (
        "checkpoint",
        1,
        "look at one",
    )
    assert [c.state for c in waiting.children] == ["complete", "pending"]
    assert used(client, ctx) == 1  # the execution waits, so it keeps its slot

    approved = client.runs.approve(run.run_id)
    done = client.runs.wait(run.run_id, timeout=20)

    assert approved.run_id == run.run_id
    assert done.state == "complete" and done.output == "after one"
    assert done.deadline_at == run.deadline_at
    wait_until(lambda: used(client, ctx) == 0, what="release")


def test_r_run_2_checkpoint_rejected_ends_the_run_rejected_and_frees_its_slot(
    client: Client, ctx: LaunchContext
) -> None:
    run = checkpoint_chain(client, ctx)
    paused(client, run.run_id)

    client.runs.reject(run.run_id, reason="one is wrong")
    done = client.runs.wait(run.run_id, timeout=20)

    assert (done.state, done.error) == ("rejected", "Checkpoint rejected: one is wrong")
    assert [c.state for c in done.children] == ["complete", "stopped"]  # never started
    assert done.children[1].pid is None
    wait_until(lambda: used(client, ctx) == 0, what="release")
    with pytest.raises(PauseRefused):
        client.runs.approve(run.run_id)  # decided already


def test_r_run_2_a_reject_sent_again_is_answered_with_the_rejected_run(
    client: Client, ctx: LaunchContext
) -> None:
    """A reject whose answer was lost, sent again, was refused ("Run 'R' is rejected, not
    waiting at a checkpoint.", or "is paused, not waiting ..." while the rejection settled):
    the caller, and `reject` at the command line, reported a failure for what was done."""
    run = checkpoint_chain(client, ctx)
    paused(client, run.run_id)

    client.runs.reject(run.run_id, reason="one is wrong")
    again = client.runs.reject(run.run_id, reason="one is wrong")
    done = client.runs.wait(run.run_id, timeout=20)
    after = client.runs.reject(run.run_id)

    assert again.run_id == after.run_id == run.run_id
    assert (after.state, after.error) == ("rejected", "Checkpoint rejected: one is wrong")
    assert done.state == "rejected"


def test_r_run_2_approve_of_a_run_that_waits_at_no_checkpoint_is_refused(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    run = client.runs.launch(ctx.launch("chain", True, chain=[step(ctx, "gate", str(gate.path))]))
    [child] = gate.accept(1)

    with pytest.raises(PauseRefused) as caught:
        client.runs.approve(run.run_id)

    assert caught.value.details["reason"] == "no_checkpoint"
    child.release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"


def test_r_run_2_pause_then_resume_keeps_the_claim_the_slot_and_the_deadline(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "{previous} then more")]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    [child] = gate.accept(1)
    budget = decode_descriptor(run.fanout_descriptor)
    claims = client.fanout.snapshot(budget).used

    client.runs.pause(run.run_id)
    source = paused(client, run.run_id)
    child.wait_exit()  # the child tree was stopped: a paused run holds no process

    assert (source.paused, source.paused_step) == ("interrupt", 0)
    assert source.children[0].state == "stopped"
    held = client.capacity.inspect(run.run_id, ctx.session_id)
    assert held.relation == "current" and held.verdict.reason == "run is still paused"
    assert used(client, ctx) == 1

    resumed = resume(client, run.run_id)
    [again] = gate.accept(1)

    # R-CAP-18: the same slot moves; R-FAN-23: nothing claimed; R-TMO-8: the same deadline.
    assert resumed.source_run_id == run.run_id
    assert resumed.deadline_at == run.deadline_at
    assert used(client, ctx) == 1
    moved = client.capacity.inspect(run.run_id, ctx.session_id)
    assert moved.relation == "source" and held.owner is not None and moved.owner is not None
    assert moved.owner.slot == held.owner.slot
    assert client.fanout.snapshot(budget).used == claims
    assert [c.label for c in resumed.children] == ["chain[0]", "chain[1]"]

    again.release(0)
    done = client.runs.wait(resumed.run_id, timeout=20)
    assert done.state == "complete" and done.output == "released 0 then more"
    assert client.fanout.snapshot(budget).used == claims
    source_after = client.runs.show(run.run_id)
    assert (source_after.state, source_after.resumed_by) == ("stopped", resumed.run_id)
    wait_until(lambda: used(client, ctx) == 0, what="release")
    # Its state says stopped, but nobody stopped it: a second resume names the run that went on.
    with pytest.raises(RunNotResumable) as again_refused:
        resume(client, run.run_id)
    assert again_refused.value.details["reason"] == "continued"
    assert f"run {resumed.run_id} went on with it" in again_refused.value.message


def test_r_run_2_resume_of_a_paused_run_appends_its_message_to_the_interrupted_step(
    client: Client, ctx: LaunchContext
) -> None:
    # `resume -m` is the follow-up appended to the task (R-RES-1): a paused run's resume goes
    # on from the interrupted step, and that step's task carries the message (it was dropped).
    chain = [step(ctx, "sleeper", "seconds=600"), step(ctx, "echo", "{previous} then done")]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    wait_view(client, run.run_id, lambda v: v.children[0].state == "running")
    client.runs.pause(run.run_id)
    paused(client, run.run_id)

    follow_up = Resume(run_id=run.run_id, capacity_limit=LIMIT, message="seconds=0")
    resumed = client.ask(follow_up, LaunchResult).run

    done = client.runs.wait(resumed.run_id, timeout=20)
    assert (done.state, done.output) == ("complete", "slept 0 then done")


def test_r_run_2_resumes_of_a_paused_run_sent_at_once_continue_it_only_once(
    node: Node, ctx: LaunchContext, gate: Gate
) -> None:
    """The continuation's record names its source only once it is admitted; a second resume
    arriving meanwhile must not go on with the same run again (a second run on the one claim,
    R-FAN-23, and a second slot)."""
    client = node.client()
    chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "after")]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    gate.accept(1)
    budget = decode_descriptor(run.fanout_descriptor)
    claims = client.fanout.snapshot(budget).used
    client.runs.pause(run.run_id)
    paused(client, run.run_id)

    start = threading.Barrier(8)
    won: list[RunView] = []
    refused: list[str] = []

    def resume_at_once() -> None:
        start.wait(timeout=10)
        try:
            won.append(resume(node.client(), run.run_id))
        except (PauseRefused, RunNotResumable) as err:
            refused.append(err.details["reason"])

    threads = [threading.Thread(target=resume_at_once) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(won) == 1 and refused == ["continued"] * 7
    [again] = gate.accept(1)
    again.release(0)
    assert client.runs.wait(won[0].run_id, timeout=20).state == "complete"
    assert client.fanout.snapshot(budget).used == claims
    assert [r.run_id for r in client.runs.list() if r.source_run_id == run.run_id] == [
        won[0].run_id
    ]


def test_r_app_6_steps_appended_before_a_pause_run_in_the_run_that_goes_on_with_it(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """An append's claims are spent and it was answered "queued"; its steps used to live only
    in the paused execution's memory, so the resume (built from the recovery descriptor) went
    on without them."""
    chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "then {previous}")]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    gate.accept(1)
    client.ask(Append(run_id=run.run_id, steps=[step(ctx, "echo", "appended")]), AppendResult)
    budget = decode_descriptor(run.fanout_descriptor)
    claims = client.fanout.snapshot(budget).used
    client.runs.pause(run.run_id)
    paused(client, run.run_id)

    resumed = resume(client, run.run_id)
    [again] = gate.accept(1)
    again.release(0)
    done = client.runs.wait(resumed.run_id, timeout=20)

    assert done.state == "complete", done.error
    assert [(c.label, c.output) for c in done.children] == [
        ("chain[0]", "released 0"),
        ("chain[1]", "then released 0"),
        ("chain[2]", "appended"),
    ]
    assert client.fanout.snapshot(budget).used == claims  # nothing claimed again


def _stop_and_resume_at_once(node: Node, run_id: str) -> dict[str, object]:
    """`stop` and `resume` of `run_id` from two threads at once: what each got (a view, or
    the refusal's reason)."""
    start = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def act(what: str) -> None:
        client = node.client()
        start.wait(timeout=10)
        try:
            outcomes[what] = client.runs.stop(run_id) if what == "stop" else resume(client, run_id)
        except (PauseRefused, RunNotResumable) as err:
            outcomes[what] = err.details["reason"]

    threads = [threading.Thread(target=act, args=(what,)) for what in ("stop", "resume")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcomes


def test_r_run_2_a_stop_and_a_resume_of_a_paused_run_sent_at_once_never_both_win(
    node: Node, ctx: LaunchContext, gate: Gate
) -> None:
    """Either the stop ends the paused run (and the resume is refused), or the resume goes on
    with it (and a stop that arrives while that continuation is admitted is refused, naming
    it). A stop that arrived in that window used to end the source `stopped` while the
    continuation ran on regardless."""
    client = node.client()
    for _ in range(4):
        chain = [step(ctx, "gate", str(gate.path))]
        run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
        [child] = gate.accept(1)
        client.runs.pause(run.run_id)
        paused(client, run.run_id)
        child.wait_exit()
        outcomes = _stop_and_resume_at_once(node, run.run_id)
        resumed = outcomes["resume"]
        if isinstance(resumed, RunView):  # the resume won: the source went on, not stopped
            stopped = outcomes["stop"]
            assert stopped == "continued" or (
                isinstance(stopped, RunView)
                and stopped.output == f"Continued as run {resumed.run_id}."
            ), stopped  # refused, or it found the source over already: it changed nothing
            [again] = gate.accept(1)
            again.release(0)
            client.runs.wait(resumed.run_id, timeout=20)
        else:  # the stop won: nothing goes on with it
            assert client.runs.show(run.run_id).state == "stopped"
            assert not [r for r in client.runs.list() if r.source_run_id == run.run_id]


def test_r_run_2_a_paused_run_whose_deadline_passes_fails_timed_out_and_frees_its_slot(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    """A pause does not stop the run's deadline (R-TMO-7: its wall-clock limit, absolute for
    whatever goes on with it, R-TMO-8). Once it passes the run can never go on, so it ends as
    a checkpoint wait does: `failed`, timed out, and its slot freed (it holds no process).
    It stayed `paused` with its slot for good, `resume` refused (deadline expired)."""
    chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "never")]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=3000))
    [child] = gate.accept(1)
    client.runs.pause(run.run_id)
    assert paused(client, run.run_id).paused == "interrupt"
    child.wait_exit()
    assert used(client, ctx) == 1

    ended = client.runs.wait(run.run_id, timeout=20)

    assert (ended.state, ended.error) == ("failed", "Run timed out after 3000 ms.")
    assert ended.deadline_at is not None and (ended.ended_at or 0) >= ended.deadline_at
    wait_until(lambda: used(client, ctx) == 0, what="release")
    assert client.capacity.inspect(run.run_id, ctx.session_id).relation == "none"


def test_r_tmo_8_resume_after_the_sources_absolute_deadline_fails_and_changes_nothing(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "never")]
    # The launch answers once its first child runs; the pause comes well before the deadline.
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=4000))
    client.runs.pause(run.run_id)
    source = paused(client, run.run_id)
    assert source.deadline_at is not None
    # The deadline ends the paused run (R-RUN-2) and frees its slot; its resume then has none
    # left to inherit.
    assert client.runs.wait(run.run_id, timeout=20).state == "failed"
    wait_until(lambda: used(client, ctx) == 0, what="release")
    before = ledgers(client, ctx.session_id, LIMIT, decode_descriptor(run.fanout_descriptor))

    with pytest.raises(DeadlineExpired) as caught:
        resume(client, run.run_id)

    assert caught.value.message == (
        "The source run's absolute deadline expired before recovery could launch."
    )
    assert ledgers(client, ctx.session_id, LIMIT, decode_descriptor(run.fanout_descriptor)) == (
        before
    )
    assert client.runs.show(run.run_id).state == "failed"


def test_r_run_2_a_paused_run_that_is_stopped_frees_its_slot(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    run = client.runs.launch(ctx.launch("chain", True, chain=[step(ctx, "gate", str(gate.path))]))
    gate.accept(1)
    client.runs.pause(run.run_id)
    paused(client, run.run_id)

    client.runs.stop(run.run_id)

    assert client.runs.show(run.run_id).state == "stopped"
    wait_until(lambda: used(client, ctx) == 0, what="release")


_SLOW_TO_END = """\
import os, signal, socket, sys

def knock():  # one connection to the gate: our pid, then wait for its word
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])
    sock.sendall(f"{os.getpid()}\\n".encode())
    return sock

def ending(*_):  # asked to end: knock again, and end only once the gate says so
    knock().recv(64)
    sys.exit(0)

signal.signal(signal.SIGTERM, ending)
started = knock()
signal.pause()
"""


def test_r_run_2_a_stop_that_comes_while_a_run_pauses_ends_it_stopped_and_frees_its_slot(
    client: Client, agents: Path, gate: Gate
) -> None:
    """The stop used to be answered and ignored: the run settled `paused`, keeping its slot."""
    write_agent(
        agents, "slow", "Ends when the gate says.", '["{python}", "{agent_dir}/slow.py", "{task}"]'
    )
    (agents / "slow.py").write_text(_SLOW_TO_END)
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    run = client.runs.launch(ctx.launch("chain", True, chain=[step(ctx, "slow", str(gate.path))]))
    gate.accept(1)  # started, its TERM handler set
    client.runs.pause(run.run_id)
    [ending] = gate.accept(1)  # it got the TERM: the run is pausing

    with pytest.raises(AppendRejected) as refused:
        client.ask(Append(run_id=run.run_id, steps=[step(ctx, "echo", "x")]), AppendResult)
    assert refused.value.message.endswith(": the run is pausing")  # not "running": no retry
    client.runs.stop(run.run_id)
    with pytest.raises(AppendRejected) as refused:
        client.ask(Append(run_id=run.run_id, steps=[step(ctx, "echo", "x")]), AppendResult)
    assert refused.value.message.endswith(": the run is stopping")
    ending.release(0)

    done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "stopped"
    wait_until(lambda: used(client, ctx) == 0, what="release")
    with pytest.raises(RunNotResumable):
        resume(client, run.run_id)


def test_r_run_2_a_pause_sent_again_is_answered_and_a_run_on_its_way_out_is_said_to_be_ending(
    client: Client, agents: Path, gate: Gate
) -> None:
    """A pause sent again while the run paused was refused with "Run 'R' is running; only a
    running run can be paused." (it still reads `running` while its children stop), and so was
    one once it had settled `paused`. Now both are answered with the run; a pause of a run
    being stopped says it is ending."""
    write_agent(
        agents, "slow", "Ends when the gate says.", '["{python}", "{agent_dir}/slow.py", "{task}"]'
    )
    (agents / "slow.py").write_text(_SLOW_TO_END)
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    chain = [step(ctx, "slow", str(gate.path))]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    gate.accept(1)  # started, its TERM handler set
    client.runs.pause(run.run_id)
    [ending] = gate.accept(1)  # it got the TERM: the run is pausing

    assert client.runs.pause(run.run_id).state == "running"  # pausing: answered, not refused
    ending.release(0)
    settled = paused(client, run.run_id)
    assert client.runs.pause(run.run_id).state == settled.state == "paused"

    other = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    gate.accept(1)
    client.runs.stop(other.run_id)
    [stopping] = gate.accept(1)
    with pytest.raises(PauseRefused) as refused:
        client.runs.pause(other.run_id)
    assert refused.value.message == (
        f"Run '{other.run_id}' is ending; only a running run can be paused."
    )
    stopping.release(0)
    assert client.runs.wait(other.run_id, timeout=20).state == "stopped"
    client.runs.stop(run.run_id)
    wait_until(lambda: used(client, ctx) == 0, what="release")


@pytest.mark.parametrize("then", ["stop", "resume"])
def test_r_run_2_a_chain_attached_to_a_paused_run_does_not_take_its_place(
    client: Client, ctx: LaunchContext, gate: Gate, then: str
) -> None:
    """R-RES-6: an attached chain names the paused run as its source but continues nothing.
    The paused run can still be stopped, or resumed (it then ends `stopped`, continued by the
    resumed run); either way the chain whose step 0 it is fails and every slot is freed."""
    run = client.runs.launch(ctx.launch("chain", True, chain=[step(ctx, "gate", str(gate.path))]))
    gate.accept(1)
    client.runs.pause(run.run_id)
    paused(client, run.run_id)
    chain = client.ask(
        Resume(run_id=run.run_id, capacity_limit=LIMIT, attach=[step(ctx, "echo", "{previous}")]),
        LaunchResult,
    ).run
    assert used(client, ctx) == 2

    if then == "stop":
        client.runs.stop(run.run_id)
        assert client.runs.show(run.run_id).state == "stopped"
    else:
        resumed = resume(client, run.run_id)
        assert resumed.source_run_id == run.run_id
        assert client.runs.show(run.run_id).resumed_by == resumed.run_id
        [again] = gate.accept(1)
        again.release(0)
        assert client.runs.wait(resumed.run_id, timeout=20).state == "complete"
    done = client.runs.wait(chain.run_id, timeout=20)
    assert done.state == "failed"
    assert done.error == f"Attached run {run.run_id} (chain step 0) ended stopped."
    wait_until(lambda: used(client, ctx) == 0, what="release")


def test_r_run_2_pause_of_a_foreground_run_is_refused(
    client: Client, ctx: LaunchContext, gate: Gate
) -> None:
    run = client.runs.launch(ctx.launch("chain", False, chain=[step(ctx, "gate", str(gate.path))]))
    [child] = gate.accept(1)

    with pytest.raises(PauseRefused) as caught:
        client.runs.pause(run.run_id)

    assert caught.value.details["reason"] == "foreground"
    child.release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"


def test_r_tmo_8_resume_of_a_finished_run_inherits_its_absolute_deadline(
    client: Client, ctx: LaunchContext
) -> None:
    chain = [step(ctx, "echo", "one"), step(ctx, "echo", "{previous} two")]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=600_000))
    source = client.runs.wait(run.run_id, timeout=20)
    assert source.state == "complete" and source.deadline_at is not None

    resumed = client.runs.wait(resume(client, run.run_id).run_id, timeout=20)

    # Not recomputed from now: remaining = deadline - now, the same absolute instant.
    assert resumed.deadline_at == source.deadline_at
    assert resumed.state == "complete"


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_r_adm_2_a_resume_of_a_paused_run_failing_at_each_admission_step_leaves_it_paused(
    state_dir: Path, ctx: LaunchContext, gate: Gate, point: str
) -> None:
    """R-RES-5 for a paused source: its slot is restored exactly and it stays resumable."""
    with Node.embedded(state_dir=state_dir) as node:  # leaves the paused run as it is
        client = node.client()
        chain = [step(ctx, "gate", str(gate.path)), step(ctx, "echo", "after")]
        run = client.runs.launch(ctx.launch("chain", True, chain=chain))
        client.runs.pause(run.run_id)
        paused(client, run.run_id)
        held = client.capacity.inspect(run.run_id, ctx.session_id)

    with embedded(state_dir, faults=True, settings={"fault_points": [point]}) as node:
        client = node.client()
        with pytest.raises(InjectedFault):
            resume(client, run.run_id)
        if point == "mark_started":  # the relaunch started, then failed (R-ADM-5)
            [stray] = [r for r in client.runs.list() if r.source_run_id == run.run_id]
            client.runs.wait(stray.run_id, timeout=20)
            wait_until(
                lambda: client.capacity.inspect(stray.run_id, ctx.session_id).relation == "none",
                what="the relaunch to own nothing",
            )
        after = client.capacity.inspect(run.run_id, ctx.session_id)
        assert held.owner is not None and after.owner is not None
        # The same record (a restarted node re-reports a paused run: only its times move).
        same = ("slot", "token", "run_id", "generation", "runner_id", "terminal_state")
        assert {f: getattr(after.owner, f) for f in same} == {
            f: getattr(held.owner, f) for f in same
        }
        assert (after.relation, after.verdict) == (held.relation, held.verdict)
        assert client.runs.show(run.run_id).state == "paused"


@pytest.mark.parametrize("point", ["resolve_budget", "mark_started"])
def test_r_run_2_a_checkpoint_deadline_due_while_an_approve_is_admitted_fires_once_it_fails(
    state_dir: Path, ctx: LaunchContext, point: str
) -> None:
    """A deadline that comes while an `approve` of a checkpoint wait is admitted does nothing
    (the run may go on, with the same absolute deadline). If that admission then fails, the run
    still waits: its deadline must fire then (at once, it passed). Nothing fired it again: the
    run stayed `paused` with its slot for good."""
    budget_ms = 8000  # room for two node starts on a loaded host (6 s ran out in CI)
    chain = [step(ctx, "echo", "one"), ChainStep(kind="checkpoint"), step(ctx, "echo", "two")]
    with Node.embedded(state_dir=state_dir) as node:  # leaves the checkpoint wait parked
        client = node.client()
        run = client.runs.launch(ctx.launch("chain", True, chain=chain, timeout_ms=budget_ms))
        paused(client, run.run_id)
    deadline = run.deadline_at
    assert deadline is not None

    with embedded(state_dir, faults=True, settings={"fault_points": [point]}) as node:
        client = node.client(timeout=60)
        # The capacity owner is stopped until past the deadline: the approve's slot transfer
        # (its admission's first step) waits on it, so the deadline comes while it is admitted.
        # (Not a sleep of the owner: one sized before the second node started ran out on a
        # loaded host, and a sleep is at most 10 s.)
        capacity = next(a.pid for a in node.owner_statuses() if a.name == "capacity")
        assert capacity is not None
        assert time.time() < deadline - 1, "the deadline passed before the approve could be sent"
        stop_process(capacity)
        waking = threading.Timer(
            deadline + 1.0 - time.time(), lambda: os.kill(capacity, signal.SIGCONT)
        )
        waking.start()
        try:
            with pytest.raises(InjectedFault):
                client.runs.approve(run.run_id, capacity_limit=LIMIT)
            assert time.time() > deadline, "the approve was not admitted when its deadline came"
        finally:
            waking.cancel()
            os.kill(capacity, signal.SIGCONT)

        ended = client.runs.wait(run.run_id, timeout=20)
        assert (ended.state, ended.error) == ("failed", f"Run timed out after {budget_ms} ms.")
        wait_until(lambda: used(client, ctx) == 0, what="release")
