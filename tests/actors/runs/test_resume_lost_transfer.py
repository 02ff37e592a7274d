"""A resume whose capacity transfer was applied but never answered (R-CAP-18..20, R-RES-5, A-15).

The capacity owner may commit a `capacity.transfer` and never answer it: killed between its
commit and its reply, or too slow for the run supervisor's call deadline. The resume then fails
(`OwnerUnavailable`) and the slot sits with a run that will never exist, unstarted, until its TTL
gives it back to the paused source. What the user does next must not leak that slot:

- sending the resume again took a second slot (the source held none, so the transfer acquired),
  and once the first slot's TTL passed it was given back to the source, which the second resume
  had ended (`stopped`, "continued as"): a settled run held a slot for good, "retained — run is
  still paused", across restarts, with nothing (not `stop`, not a restart) able to free it;
- stopping the paused source instead: its terminal report found no slot of its own ("transferred
  to" the lost run) and was dropped, and the TTL then restored the source's slot as paused:
  the same permanent leak.

Real embedded node, real children; the capacity owner is stopped (SIGSTOP) past the
supervisor's shortened call deadline, so the transfer is applied after the resume gave up.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import OwnerUnavailable
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView, TaskItem
from subagents_node.node.node import Node
from tests.support.manage import embedded
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, stop_process, wait_until, wait_view

LIMIT = 2
#: The run supervisor's deadline for the capacity owner's answer, and the slots' TTL.
SETTINGS = {"owner_call_timeout_s": 1.5, "reservation_ttl_s": 2.0}


@pytest.fixture
def ctx(agents: Path) -> LaunchContext:
    return launch_context(agents, max_active_async_runs_per_session=LIMIT)


@pytest.fixture
def node(state_dir: Path) -> Iterator[Node]:
    with embedded(state_dir, settings=SETTINGS) as node:
        yield node


def used(client: Client, ctx: LaunchContext) -> int:
    return client.capacity.snapshot(ctx.session_id, LIMIT).used


def resume(client: Client, run_id: str) -> RunView:
    return client.ask(Resume(run_id=run_id, capacity_limit=LIMIT), LaunchResult).run


def paused_run(client: Client, ctx: LaunchContext, gate: Gate) -> RunView:
    step = ChainStep(items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))])
    run = client.runs.launch(ctx.launch("chain", True, chain=[step]))
    gate.accept(1)
    client.runs.pause(run.run_id)
    wait_view(client, run.run_id, lambda v: v.state == "paused")
    assert used(client, ctx) == 1
    return run


def lose_the_transfer_answer(node: Node, client: Client, ctx: LaunchContext, run_id: str) -> str:
    """Resume `run_id` while the capacity owner is stopped: the resume fails past the call
    deadline, then the owner applies the transfer. Returns the run id the slot now names."""
    capacity = next(a.pid for a in node.owner_statuses() if a.name == "capacity")
    assert capacity is not None
    stop_process(capacity)
    try:
        with pytest.raises(OwnerUnavailable):
            resume(client, run_id)
    finally:
        os.kill(capacity, signal.SIGCONT)
    found = client.capacity.inspect(run_id, ctx.session_id)
    assert found.relation == "source" and found.owner is not None, found  # applied late
    assert not found.owner.started
    return found.owner.run_id


def resumed_on_the_lent_slot(
    client: Client, ctx: LaunchContext, gate: Gate, source: str, again: RunView
) -> None:
    """The resume `again` of `source` runs on one slot, lent by `source`; once it completes,
    the source is `stopped` (continued) and every slot is freed."""
    [child] = gate.accept(1)
    assert used(client, ctx) == 1  # was 2: a second slot for one paused run
    held = client.capacity.inspect(again.run_id, ctx.session_id)
    assert held.relation == "current" and held.owner is not None
    assert held.owner.source_run_id == source
    child.release()
    assert client.runs.wait(again.run_id, timeout=20).state == "complete"
    assert client.runs.show(source).state == "stopped"  # continued
    wait_until(lambda: used(client, ctx) == 0, what="every slot to be freed", timeout=20)


def settled_and_freed(client: Client, ctx: LaunchContext, lost: str) -> None:
    """Every slot is freed, the lost transfer's included (gone by its TTL, or taken over)."""
    wait_until(lambda: used(client, ctx) == 0, what="every slot to be freed", timeout=20)
    gone = client.capacity.inspect(lost, ctx.session_id)
    assert gone.relation == "none", gone
    assert used(client, ctx) == 0


def test_r_cap_18_a_resume_sent_again_after_its_transfer_answer_was_lost_takes_that_slot(
    node: Node, ctx: LaunchContext, gate: Gate
) -> None:
    """The second resume takes over the slot the lost one was given (one slot, not two), and
    once it ends the slot is freed for good: the TTL of the lost transfer gives nothing back to
    the source it continued."""
    client = node.client(timeout=30)
    run = paused_run(client, ctx, gate)
    lost = lose_the_transfer_answer(node, client, ctx, run.run_id)

    again = resume(client, run.run_id)
    assert again.run_id != lost
    resumed_on_the_lent_slot(client, ctx, gate, run.run_id, again)
    settled_and_freed(client, ctx, lost)


def test_r_cap_25_a_paused_run_stopped_while_its_lost_transfer_waits_for_its_ttl_frees_its_slot(
    node: Node, ctx: LaunchContext, gate: Gate
) -> None:
    """The stop's terminal report reaches the slot the lost transfer holds: when its TTL gives
    the slot back, the source is stopped and the slot is freed, not kept as a paused run's."""
    client = node.client(timeout=30)
    run = paused_run(client, ctx, gate)
    lost = lose_the_transfer_answer(node, client, ctx, run.run_id)

    assert client.runs.stop(run.run_id).state == "stopped"
    settled_and_freed(client, ctx, lost)
    assert client.capacity.inspect(run.run_id, ctx.session_id).relation == "none"


def test_r_cap_18_a_capacity_owner_killed_after_lending_the_slot_is_asked_again_and_lends_one(
    state_dir: Path, ctx: LaunchContext, gate: Gate
) -> None:
    """The capacity owner alone is killed (and restarted by the node) after it committed a
    resume's transfer and before it answered. The resume failed ("capacity restarted with
    capacity.transfer in flight") and its slot sat lent to a run that would never exist until
    its TTL gave it back. The run supervisor sends the transfer again under its id now: the
    slot it lent is answered, and the resume runs on that one slot."""
    settings = {"owner_call_timeout_s": 2.0, "fault_kill_points": ["owner:slot_transferred"]}
    with embedded(state_dir, faults=True, settings=settings) as node:
        client = node.client(timeout=30)
        run = paused_run(client, ctx, gate)
        again = resume(client, run.run_id)  # sent once: the client does not resend
        [capacity] = [a for a in node.owner_statuses() if a.name == "capacity"]
        assert capacity.restarts == 1, "the capacity owner was not killed"
        resumed_on_the_lent_slot(client, ctx, gate, run.run_id, again)
