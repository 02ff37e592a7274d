"""The run supervisor's outbox: what a run's end owes the ledgers is durable and replayed in order
until answered (DESIGN §1 "their reports are queued durably ... and replayed on reconnect", §2;
R-CAP-21, R-CAP-24: release is eventual; R-RUN-5).

- A run that ends while its capacity owner cannot answer (SIGSTOP) and then loses the request
  with it (kill -9 of the stopped owner, which the node restarts) still frees its slot once the
  owner is back, with no operator action. Before the outbox the report was lost for good.
- Two runs ending around such an outage are reported in their end order: the second report is
  not sent while the first is unanswered, even to a capacity owner that serves again; and the
  session owner's rows are not held back by the capacity owner's outage.
- kill -9 of the node (with its run supervisor) after a run's end is committed and before its
  report was answered: the restarted supervisor replays the report and the slot is freed; when
  the report had been applied already, the replay changes nothing.
- kill -9 of the node once a chain append is recorded and before its claims are committed
  (R-APP-4): the restarted supervisor owes the commit through the outbox, and the claims exist;
  the run it adopted without the appended step fails, and its resume runs that step.
- A worker node's run ends while its home cannot be reached (the home node SIGSTOPped): the
  child ends, its report waits in the worker's outbox, and once the home answers again the
  slot it holds there is freed (DESIGN §1 "replayed on reconnect").

Real processes throughout: an embedded node's owner processes (or a detached node), real
children behind a gate, real sockets and SQLite files, signals sent to real pids. The outbox is
read from `runs.db` on a read-only connection of the test's own. Every wait has a deadline and
waits on an event or re-reads a snapshot (`wait_until`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.lineage import Append, AppendResult, Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView, TaskItem
from subagents_node.node.node import Node
from tests.support.fleet import fleet
from tests.support.manage import embedded, store_rows
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, GateChild, launch_context, stopped, wait_until

pytestmark = pytest.mark.processes

REPORT = "capacity.report_terminal"
TRACK = "session.track_run"
#: How long the supervisor waits for an owner's answer here (15 s by default): a request lost
#: with a killed owner is then retried within seconds.
CALL_TIMEOUT_S = 4.0


def outbox(state_dir: Path) -> list[tuple[str, str]]:
    """(type, run id) of every row the supervisor still owes, oldest first."""
    rows = store_rows(state_dir, "SELECT type, run_id FROM run_outbox ORDER BY seq")
    return [(str(t), str(r)) for t, r in rows]


def pid_of(client: Client, owner: str) -> int:
    return next(int(a.pid or 0) for a in client.status().actors if a.name == owner)


def slot_held(client: Client, run: RunView) -> bool:
    return client.capacity.inspect(run.run_id, run.session_id).relation == "current"


def kill_stopped(client: Client, pid: int, owner: str) -> None:
    """kill -9 of a stopped owner (what it had read of its socket dies with it); wait until
    the node has restarted it and it answers."""
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid_of(client, owner) not in (0, pid), what=f"{owner} restarted")


def start_gated(
    client: Client, agents: Path, gate: Gate, limit: int, count: int
) -> list[tuple[RunView, GateChild]]:
    """`count` background runs of one session, each holding a started slot, each at the gate."""
    ctx = launch_context(agents, max_active_async_runs_per_session=limit)
    runs = []
    for _ in range(count):
        run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
        [child] = gate.accept(1)
        runs.append((run, child))
    wait_until(
        lambda: all(
            (o := client.capacity.inspect(r.run_id, r.session_id).owner) and o.runner_id
            for r, _ in runs
        ),
        what="every run's slot started",
    )
    return runs


@pytest.fixture
def node(state_dir: Path) -> Iterator[Node]:
    with embedded(state_dir, settings={"owner_call_timeout_s": CALL_TIMEOUT_S}) as started:
        yield started


@pytest.mark.slow
def test_r_cap_21_report_lost_to_a_restarting_capacity_owner_is_replayed(
    node: Node, state_dir: Path, agents: Path, gate: Gate
) -> None:
    client = node.client()
    [(run, child)] = start_gated(client, agents, gate, limit=1, count=1)
    capacity = pid_of(client, "capacity")

    with stopped(capacity):
        child.release(0)
        assert client.runs.wait(run.run_id, timeout=20).state == "complete"
        # The run's end is durable, and so is what it owes the capacity owner.
        wait_until(lambda: outbox(state_dir) == [(REPORT, run.run_id)], what="the report owed")
        kill_stopped(client, capacity, "capacity")  # the report it had received dies with it

    wait_until(lambda: not slot_held(client, run), timeout=30, what="the slot freed")
    assert client.capacity.snapshot(run.session_id, 1).used == 0
    wait_until(lambda: outbox(state_dir) == [], what="the outbox drained")


@pytest.mark.slow
def test_r_cap_21_reports_to_an_unavailable_capacity_owner_are_replayed_in_end_order(
    node: Node, state_dir: Path, agents: Path, gate: Gate
) -> None:
    client = node.client()
    (first, first_child), (second, second_child) = start_gated(
        client, agents, gate, limit=2, count=2
    )
    capacity = pid_of(client, "capacity")

    with stopped(capacity):
        first_child.release(0)
        assert client.runs.wait(first.run_id, timeout=20).state == "complete"
        # The session owner answered its row: the capacity owner's outage holds back only its own.
        wait_until(lambda: outbox(state_dir) == [(REPORT, first.run_id)], what="session answered")
        kill_stopped(client, capacity, "capacity")  # the first report is lost with it

    # The capacity owner serves again, but the first report waits for its call timeout.
    assert client.capacity.snapshot(first.session_id, 2).used == 2
    second_child.release(0)
    assert client.runs.wait(second.run_id, timeout=20).state == "complete"
    reports = [row for row in outbox(state_dir) if row[0] == REPORT]
    assert reports == [(REPORT, first.run_id), (REPORT, second.run_id)]
    assert slot_held(client, first), "the first report was replayed before the test could look"

    def both_freed() -> bool:
        # Whenever the second run's slot is seen free, the first run's was freed before it.
        # So look at the second first: read the other way round, both could be freed, in
        # order, between the two reads, and the test would blame the owner for its own race.
        second_held = slot_held(client, second)
        first_held = slot_held(client, first)
        assert first_held <= second_held, "the later report was applied before the earlier one"
        return not first_held and not second_held

    wait_until(both_freed, timeout=30, what="both slots freed")
    wait_until(lambda: outbox(state_dir) == [], what="the outbox drained")


@pytest.mark.slow
@pytest.mark.parametrize(
    "point",
    [f"outbox_send_{REPORT}", f"outbox_answered_{REPORT}"],
    ids=["committed-not-sent", "applied-not-acknowledged"],
)
def test_r_cap_21_supervisor_killed_after_a_run_end_replays_its_report_on_restart(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
    point: str,
) -> None:
    """The node (and its run supervisor) dies with SIGKILL once the run's end has committed:
    before the report went out, or after the capacity owner applied it and before the
    supervisor recorded its answer. Either way the restarted supervisor sends it again; a copy
    of an applied report changes nothing, here the slot another run still holds."""
    dying = start_node("--faults", state_dir=state_dir, kill_at=point)
    client = dying.client(timeout=20)
    (ended, ended_child), (running, running_child) = start_gated(
        client, agents, gate, limit=2, count=2
    )
    held = client.capacity.inspect(running.run_id, running.session_id)

    ended_child.release(0)
    assert dying.wait_exited(20), f"the node did not die at {point}"
    assert (REPORT, ended.run_id) in outbox(state_dir)  # committed, never acknowledged

    client = start_node(state_dir=state_dir).client(timeout=20)
    assert client.runs.show(ended.run_id).state == "complete"
    wait_until(lambda: not slot_held(client, ended), what="the replayed report to free the slot")
    wait_until(lambda: outbox(state_dir) == [], what="the outbox drained")
    assert client.capacity.inspect(running.run_id, running.session_id) == held
    assert client.capacity.snapshot(running.session_id, 2).used == 1

    running_child.release(0)
    assert client.runs.wait(running.run_id, timeout=20).state == "complete"
    wait_until(lambda: client.capacity.snapshot(running.session_id, 2).used == 0, what="release")


@pytest.mark.slow
def test_r_app_4_an_append_recorded_before_a_node_kill_is_committed_and_kept_on_restart(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
) -> None:
    dying = start_node("--faults", state_dir=state_dir, kill_at="append_recorded")
    client = dying.client(timeout=20)
    ctx = launch_context(agents)
    first = ChainStep(items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))])
    run = client.runs.launch(ctx.launch("chain", True, chain=[first]))
    [held] = gate.accept(1)
    later = ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="later")])

    with pytest.raises(SubagentsError):  # the node dies before it answers
        dying.client(timeout=2).ask(Append(run_id=run.run_id, steps=[later]), AppendResult)
    assert dying.wait_exited(20), "the node did not die at append_recorded"
    [(reservation, state)] = store_rows(
        state_dir, "SELECT reservation_id, state FROM run_appends WHERE run_id=?", run.run_id
    )
    assert state == "pending"  # recorded; its claims reserved and not committed

    client = start_node(state_dir=state_dir).client(timeout=20)

    def reservation_state() -> str:
        rows = store_rows(
            state_dir,
            "SELECT state FROM fanout_reservations WHERE reservation_id=?",
            reservation,
            owner="fanout",
        )
        return str(rows[0][0])

    wait_until(lambda: reservation_state() == "committed", what="the claims committed")
    wait_until(
        lambda: (
            store_rows(state_dir, "SELECT state FROM run_appends WHERE run_id=?", run.run_id)
            == [("committed",)]
        ),
        what="the append recorded as committed",
    )
    assert client.fanout.snapshot(decode_descriptor(run.fanout_descriptor)).used == 2
    wait_until(lambda: outbox(state_dir) == [], what="the outbox drained")
    held.release(0)
    ended = client.runs.wait(run.run_id, timeout=20)
    # Its step never joined the execution the node adopted: the run used to end `complete`
    # without it (the append lost, its claims spent). It fails, and its resume runs the step,
    # which the record kept.
    assert (ended.state, ended.error) == (
        "failed",
        "The node restarted before every child started.",
    )
    resumed = client.ask(Resume(run_id=run.run_id), LaunchResult).run
    [again] = gate.accept(1)
    again.release(0)
    done = client.runs.wait(resumed.run_id, timeout=20)
    assert [(c.label, c.output) for c in done.children] == [
        ("chain[0]", "released 0"),
        ("chain[1]", "later"),
    ]


@pytest.mark.slow
def test_r_cap_21_a_workers_report_made_while_its_home_is_unreachable_is_replayed_on_reconnect(
    agents: Path, gate: Gate
) -> None:
    with fleet(("w1",)) as crew:
        worker = crew.workers["w1"]
        client, home = crew.client(worker), crew.client(crew.home)
        [(run, child)] = start_gated(client, agents, gate, limit=1, count=1)
        assert home.capacity.snapshot(run.session_id, 1).used == 1  # the slot is the home's

        with stopped(crew.home.pid):  # the home's gateway answers nothing: a partition
            wait_until(
                lambda: (
                    (cluster := client.status().cluster) is not None
                    and cluster.state == "unreachable"
                ),
                what="the worker to see its home unreachable",
            )
            child.release(0)
            assert client.runs.wait(run.run_id, timeout=20).state == "complete"  # it runs on

            def refused() -> bool:  # the report was sent, failed, and is kept for a retry
                rows = store_rows(
                    worker.state_dir, "SELECT attempts FROM run_outbox WHERE type=?", REPORT
                )
                return bool(rows) and int(rows[0][0]) >= 1

            wait_until(refused, what="the report refused while the home is away")

        wait_until(
            lambda: home.capacity.snapshot(run.session_id, 1).used == 0,
            timeout=30,
            what="the home to free the worker's slot",
        )
        wait_until(lambda: outbox(worker.state_dir) == [], what="the worker's outbox drained")
