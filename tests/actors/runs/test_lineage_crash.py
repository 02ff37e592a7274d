"""kill -9 of the node at each step of an attach (R-RES-6) and of a superseding rerun (R-MISC-2).

The node is started with faults and SUBAGENTS_TEST_KILL_AT, so it kills itself at the named
step; the source was started on an earlier node (its shim outlives every node). After a restart
nothing is stuck and no slot leaks: a chain that was never recorded leaves only a reserved slot,
freed by the reservation TTL; a recorded one that had started nothing fails and frees its slot.
A rerun's record, its link and its source's stop are one transaction: before it commits the
source runs on, unlinked; after it the source is stopped and linked, and the rerun runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView, TaskItem
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, wait_until

LIMIT = 3
#: Steps of an admission that a chain with no child of its own passes (fork_shim is not one).
KILL_POINTS = ("record_run", "mark_started", "answer_launch")


def killed_at(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
    ask: Callable[[Client], object],
) -> Client:
    """`ask` on a node that kills itself at `point`; then a restarted node's client."""
    monkeypatch.setenv("SUBAGENTS_RESERVATION_TTL_S", "1")
    dying = start_node("--faults", state_dir=state_dir, kill_at=point)
    with pytest.raises(SubagentsError):
        ask(dying.client(timeout=5))
    assert dying.wait_exited(10), f"the node did not die at {point}"
    return start_node(state_dir=state_dir).client(timeout=20)


def started_source(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    ctx: LaunchContext,
    gate: Gate,
    bg: bool,
) -> tuple[RunView, object]:
    first = start_node(state_dir=state_dir)
    source = first.client(timeout=20).runs.launch(ctx.single("gate", str(gate.path), bg, None))
    [held] = gate.accept(1)
    first.kill()  # the source's shim keeps it running
    return source, held


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_r_res_6_a_node_killed_at_each_step_of_an_attach_leaves_no_stuck_run_or_leaked_slot(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    source, held = started_source(start_node, state_dir, ctx, gate, True)
    steps = [ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="after {previous}")])]
    request = Resume(run_id=source.run_id, capacity_limit=LIMIT, attach=steps)

    client = killed_at(
        start_node, state_dir, monkeypatch, point, lambda c: c.ask(request, LaunchResult)
    )

    for run in client.runs.list(session_id=ctx.session_id):
        if run.run_id != source.run_id:
            assert client.runs.wait(run.run_id, timeout=30).state == "failed", point
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 1, what="release")
    assert client.runs.show(source.run_id).state == "running"  # the source keeps its slot
    held.release(0)  # type: ignore[attr-defined]
    assert client.runs.wait(source.run_id, timeout=30).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")
    assert client.runs.list(active_only=True) == []


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_r_misc_2_a_node_killed_at_each_step_of_a_superseding_rerun_links_both_or_neither(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
) -> None:
    ctx = launch_context(agents)
    old, held = started_source(start_node, state_dir, ctx, gate, False)

    client = killed_at(
        start_node,
        state_dir,
        monkeypatch,
        point,
        lambda c: c.runs.rerun(old.run_id, str(gate.path)),
    )

    reruns = [r for r in client.runs.list(session_id=ctx.session_id) if r.run_id != old.run_id]
    if point == "answer_launch":  # committed: the source stopped and linked, the rerun runs
        [new] = reruns
        [second] = gate.accept(1)
        stopped = client.runs.wait(old.run_id, timeout=30)
        assert (stopped.state, stopped.superseded_by) == ("stopped", new.run_id)
        assert (new.source_run_id, new.source_kind) == (old.run_id, "rerun")
        second.release(0)
        assert client.runs.wait(new.run_id, timeout=30).state == "complete"
    else:  # never committed: no rerun, the source runs on, unlinked
        assert reruns == []
        assert client.runs.show(old.run_id).superseded_by is None
        held.release(0)  # type: ignore[attr-defined]
        assert client.runs.wait(old.run_id, timeout=30).state == "complete"
    assert client.runs.list(active_only=True) == []
