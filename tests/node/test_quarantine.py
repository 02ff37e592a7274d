"""Quarantine, not crash (issue 11, item 3; DESIGN §2: "A record that does not parse is
quarantined: counted as occupied, reported by status and doctor, never a crash of its owner").

Each test writes real records through a real node, stops it, breaks one stored record directly
in that owner's SQLite file (as a bug, a bad migration or a hand edit would), and starts the node
again: the broken record is listed by `status --json` and by `doctor` (a failing check with its
fix), it is never handed out (a slot counts as occupied, a budget or a session refuses with
`RecordQuarantined`), the owner never restarts, and every other record keeps working.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from subagents_node.client.client import Client
from subagents_node.client.paths import owner_db
from subagents_node.messages.capacity import RunnerProof
from subagents_node.messages.errors import CapacityExhausted, RecordQuarantined
from subagents_node.messages.supervisor import TaskItem
from tests.support.nodes import NodeProcess, run_cli
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, new_session, wait_until

pytestmark = pytest.mark.processes

StartNode = Callable[..., NodeProcess]


def corrupt(state_dir: Path, owner: str, sql: str, *args: object) -> None:
    """Break a stored record in `owner`'s database behind its back (CHECK constraints off, as
    a foreign writer or an old bug would), while no node runs."""
    db = sqlite3.connect(owner_db(state_dir, owner))
    try:
        db.execute("PRAGMA ignore_check_constraints = ON")
        assert db.execute(sql, args).rowcount == 1, "the test must break exactly one record"
        db.commit()
    finally:
        db.close()


def echo_runs(client: Client, agents: Path, count: int) -> list[str]:
    """`count` finished background runs of the echo agent, each in its own session."""
    run_ids = []
    for n in range(count):
        ctx = launch_context(agents)
        item = TaskItem(agent=ctx.plan("echo"), task=f"run {n}")
        run = client.runs.launch(ctx.launch("single", True, items=[item]))
        assert client.runs.wait(run.run_id, timeout=20).state == "complete"
        run_ids.append(run.run_id)
    return run_ids


def stop(node: NodeProcess) -> None:
    node.close_clients()
    done = node.stop()
    assert done.returncode == 0, done.stderr


def status_json(state_dir: Path) -> dict[str, Any]:
    done = run_cli("status", "--json", state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def quarantined(state_dir: Path) -> list[dict[str, Any]]:
    return [q for actor in status_json(state_dir)["actors"] for q in actor["quarantined"]]


def restarts(state_dir: Path, owner: str) -> int:
    actors = status_json(state_dir)["actors"]
    return int(next(a["restarts"] for a in actors if a["name"] == owner))


def assert_reported(state_dir: Path, owner: str, table: str, key: str) -> None:
    """`status --json` lists exactly that record; `doctor` fails on it and says what to do."""
    listed = quarantined(state_dir)
    assert [(q["owner"], q["table"], q["key"]) for q in listed] == [(owner, table, key)]
    assert listed[0]["reason"]
    text = run_cli("status", state_dir=state_dir)
    assert f"{owner} {table}[{key}]" in text.stdout
    doctor = run_cli("doctor", state_dir=state_dir)
    assert doctor.returncode == 1
    assert f"[FAIL] quarantine {owner}: {table}[{key}]" in doctor.stdout
    assert f"repair or delete that row of {table}" in doctor.stdout
    checks = json.loads(run_cli("doctor", "--json", state_dir=state_dir).stdout)["checks"]
    failing = [c for c in checks if c["name"] == f"quarantine {owner}"]
    assert len(failing) == 1 and failing[0]["level"] == "fail" and failing[0]["fix"]


def test_corrupt_capacity_record_is_quarantined_and_counted_occupied(
    start_node: StartNode, state_dir: Path, agents: Path
) -> None:
    """R-CAP-3, and R-CAP-23: a slot is released only if its record parses; a report with
    matching observed proof for a run whose record does not is refused and frees nothing."""
    broken, healthy = new_session(), new_session()
    first = start_node(state_dir=state_dir)
    client = first.client()
    held = client.capacity.acquire(broken, 2, "run-broken", ttl_s=3600)
    assert held is not None
    held.mark_started(runner_id="runner-broken")  # so matching proof would release it
    assert client.capacity.acquire(healthy, 2, "run-healthy", ttl_s=3600) is not None
    stop(first)
    corrupt(
        state_dir,
        "capacity",
        "UPDATE capacity_slots SET terminal = '{not json' WHERE session_id = ?",
        broken,
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    assert_reported(state_dir, "capacity", "capacity_slots", f"{broken}/0")
    # Limit 2 with one quarantined slot: exactly one more acquire succeeds (fail closed).
    assert client.capacity.snapshot(broken, 2).used == 1
    more = client.capacity.acquire(broken, 2, "run-more", ttl_s=3600)
    assert more is not None and more.slot == 1
    with pytest.raises(CapacityExhausted) as full:
        client.capacity.acquire(broken, 2, "run-one-too-many")
    assert full.value.details["used"] == 2
    # A request that needs the unreadable slot itself is refused, typed, not a crash.
    with pytest.raises(RecordQuarantined) as refused:
        client.capacity.inspect("run-broken", broken)
    assert refused.value.details["key"] == f"{broken}/0"
    proof = RunnerProof(state="observed", runner_id="runner-broken", exit_code=0)
    with pytest.raises(RecordQuarantined):
        client.capacity.report_terminal(broken, "run-broken", "complete", proof=proof)
    assert client.capacity.snapshot(broken, 2).used == 2
    # Every other session keeps working, background launches included.
    assert client.capacity.snapshot(healthy, 2).used == 1
    assert client.capacity.acquire(healthy, 2, "run-healthy-2") is not None
    ctx = launch_context(agents)
    launch = ctx.launch("single", True, items=[TaskItem(agent=ctx.plan("echo"), task="still up")])
    run = client.runs.launch(launch)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"
    assert restarts(state_dir, "capacity") == 0


def test_corrupt_fanout_budget_is_quarantined_and_refuses_its_claims(
    start_node: StartNode, state_dir: Path
) -> None:
    first = start_node(state_dir=state_dir)
    client = first.client()
    broken = client.fanout.create("root-broken", 3)
    healthy = client.fanout.create("root-healthy", 3)
    client.fanout.claim(broken, ["a"])
    client.fanout.claim(healthy, ["a"])
    stop(first)
    corrupt(
        state_dir,
        "fanout",
        "UPDATE fanout_budgets SET used = 'lots' WHERE budget_id = ?",
        broken.budget_id,
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    assert_reported(state_dir, "fanout", "fanout_budgets", broken.budget_id)
    with pytest.raises(RecordQuarantined) as refused:
        client.fanout.claim(broken, ["b"])
    assert refused.value.details["table"] == "fanout_budgets"
    assert "quarantined" in refused.value.message
    with pytest.raises(RecordQuarantined):
        client.fanout.reserve(broken, ["c"], ttl_s=60)
    assert client.fanout.claim(healthy, ["b", "c"]).used == 3
    fresh = client.fanout.create("root-fresh", 1)
    assert client.fanout.claim(fresh, ["a"]).used == 1
    assert restarts(state_dir, "fanout") == 0


def test_corrupt_fanout_reservation_is_quarantined_and_keeps_its_claims_counted(
    start_node: StartNode, state_dir: Path
) -> None:
    first = start_node(state_dir=state_dir)
    client = first.client()
    budget = client.fanout.create("root-reserving", 4)
    broken = client.fanout.reserve(budget, ["a", "b"], ttl_s=3600)
    healthy = client.fanout.reserve(budget, ["c"], ttl_s=3600)
    stop(first)
    corrupt(
        state_dir,
        "fanout",
        "UPDATE fanout_reservations SET state = 'half-done' WHERE reservation_id = ?",
        broken.reservation_id,
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    assert_reported(state_dir, "fanout", "fanout_reservations", broken.reservation_id)
    with pytest.raises(RecordQuarantined):
        client.fanout.commit(broken.reservation_id)
    with pytest.raises(RecordQuarantined):
        client.fanout.abort(broken.reservation_id)
    assert client.fanout.abort(healthy.reservation_id).used == 2  # its 2 claims stay counted
    assert client.fanout.claim(budget, ["d", "e"]).used == 4
    assert restarts(state_dir, "fanout") == 0


def test_corrupt_session_budget_is_quarantined_and_refuses_that_session_only(
    start_node: StartNode, state_dir: Path
) -> None:
    broken, healthy = new_session(), new_session()
    first = start_node(state_dir=state_dir)
    client = first.client()
    for session in (broken, healthy):
        client.session.open(session, 3)
        client.session.reserve(session, 1)
    stop(first)
    corrupt(
        state_dir, "session", "UPDATE session_budgets SET used = -2 WHERE session_id = ?", broken
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    assert_reported(state_dir, "session", "session_budgets", broken)
    with pytest.raises(RecordQuarantined) as refused:
        client.session.reserve(broken, 1)
    assert refused.value.details["key"] == broken
    with pytest.raises(RecordQuarantined):
        client.session.preflight(broken, 1)
    assert client.session.reserve(healthy, 2).snapshot.used == 3
    assert client.session.open(new_session(), 2).created
    assert restarts(state_dir, "session") == 0


def test_corrupt_session_run_row_is_quarantined_and_counts_as_active(
    start_node: StartNode, state_dir: Path
) -> None:
    session = new_session()
    first = start_node(state_dir=state_dir)
    client = first.client()
    client.session.open(session, 3)
    client.session.track_run(session, "run-a", "running")
    client.session.track_run(session, "run-a", "complete")
    client.session.track_run(session, "run-b", "paused")
    stop(first)
    corrupt(
        state_dir,
        "session",
        "UPDATE session_runs SET state = 'zombie' WHERE session_id = ? AND run_id = 'run-b'",
        session,
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    assert_reported(state_dir, "session", "session_runs", f"{session}/run-b")
    status = client.session.status(session)
    assert status.active == 1 and status.runs == []  # counted, never shown as a state
    assert client.session.reserve(session, 1).counted == 1
    assert restarts(state_dir, "session") == 0


def test_corrupt_session_reservation_is_quarantined_and_refuses_that_reservation_only(
    start_node: StartNode, state_dir: Path
) -> None:
    """A launch's spawn reservation that cannot be read might be that launch's, counted: the
    launch sent again is refused (fail closed), never counted a second time."""
    session, broken, healthy = new_session(), "launch-broken", "launch-healthy"
    first = start_node(state_dir=state_dir)
    client = first.client()
    client.session.open(session, 5)
    for launch in (broken, healthy):
        client.session.reserve(session, 1, reservation_id=launch)
    stop(first)
    corrupt(
        state_dir,
        "session",
        "UPDATE session_reservations SET requested = 'x' WHERE reservation_id = ?",
        broken,
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    assert_reported(state_dir, "session", "session_reservations", broken)
    for call in (client.session.preflight, client.session.reserve):
        with pytest.raises(RecordQuarantined) as refused:
            call(session, 1, reservation_id=broken)
        assert refused.value.details["key"] == broken
    assert client.session.reserve(session, 1, reservation_id=healthy).repeated
    assert client.session.reserve(session, 1).snapshot.used == 3
    assert restarts(state_dir, "session") == 0


def test_corrupt_run_record_is_quarantined_and_every_other_run_works(
    start_node: StartNode, state_dir: Path, agents: Path
) -> None:
    first = start_node(state_dir=state_dir)
    broken, healthy = echo_runs(first.client(), agents, 2)
    stop(first)
    corrupt(
        state_dir,
        "supervisor",
        "UPDATE runs SET snapshots = '{\"fanout\":' WHERE run_id = ?",
        broken,
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    # A finished run holds nothing to adopt: recovery reads only the runs that may still be
    # going (never the whole history), so its broken row is reported once it is first read.
    with pytest.raises(RecordQuarantined) as refused:
        client.runs.show(broken)
    assert refused.value.details["key"] == broken
    assert_reported(state_dir, "supervisor", "runs", broken)
    assert [r.run_id for r in client.runs.list()] == [healthy]
    assert client.runs.show(healthy).state == "complete"
    assert len(echo_runs(client, agents, 1)) == 1  # launches keep working
    assert restarts(state_dir, "supervisor") == 0


def test_corrupt_child_row_is_quarantined_with_its_run_only(
    start_node: StartNode, state_dir: Path, agents: Path
) -> None:
    first = start_node(state_dir=state_dir)
    broken, healthy = echo_runs(first.client(), agents, 2)
    stop(first)
    corrupt(
        state_dir,
        "supervisor",
        "UPDATE run_children SET state = 'exploded' WHERE run_id = ?",
        broken,
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    with pytest.raises(RecordQuarantined):
        client.runs.show(broken)  # a finished run's rows are checked when first read
    assert_reported(state_dir, "supervisor", "run_children", f"{broken}/0")
    assert [r.run_id for r in client.runs.list()] == [healthy]
    assert restarts(state_dir, "supervisor") == 0


def test_corrupt_running_run_is_not_recovered_and_keeps_its_slot(
    start_node: StartNode, state_dir: Path, agents: Path, gate: Gate
) -> None:
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=2)
    item = TaskItem(agent=ctx.plan("gate"), task=str(gate.path))
    run = client.runs.launch(ctx.launch("single", True, items=[item]))
    (child,) = gate.accept(1)
    stop(first)  # the child keeps running under its shim
    corrupt(
        state_dir,
        "supervisor",
        "UPDATE runs SET capacity = 'slot zero' WHERE run_id = ?",
        run.run_id,
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    assert_reported(state_dir, "supervisor", "runs", run.run_id)
    events = client.runs.watch_all(0, wait_s=0).events
    assert "run.recovered" not in [e.kind for e in events if e.run_id == run.run_id]
    child.release(0)
    child.wait_exit()
    # Nobody settles the unreadable run, so its slot is never freed: fail closed.
    assert client.capacity.snapshot(ctx.session_id, 2).used == 1
    other = client.runs.launch(ctx.launch("single", True, items=[item]))
    gate.accept(1)[0].release(0)
    assert client.runs.wait(other.run_id, timeout=20).state == "complete"
    assert restarts(state_dir, "supervisor") == 0


def test_corrupt_child_process_row_is_quarantined_and_its_child_never_adopted(
    start_node: StartNode, state_dir: Path, agents: Path, gate: Gate
) -> None:
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=2)
    item = TaskItem(agent=ctx.plan("gate"), task=str(gate.path))
    run = client.runs.launch(ctx.launch("single", True, items=[item]))
    (child,) = gate.accept(1)
    stop(first)
    child_id = f"{run.run_id}-0"
    corrupt(
        state_dir, "supervisor", "UPDATE children SET grace_s = 'soon' WHERE child_id = ?", child_id
    )

    node = start_node(state_dir=state_dir)
    client = node.client()

    assert_reported(state_dir, "supervisor", "children", child_id)
    child.release(0)
    child.wait_exit()
    # Its exit is never applied from the unreadable row: the run and its slot stay held.
    assert client.runs.show(run.run_id).state == "running"
    assert client.capacity.snapshot(ctx.session_id, 2).used == 1
    other = client.runs.launch(ctx.launch("single", True, items=[item]))
    gate.accept(1)[0].release(0)
    assert client.runs.wait(other.run_id, timeout=20).state == "complete"
    assert restarts(state_dir, "supervisor") == 0


def test_a_report_refused_as_quarantined_is_kept_by_its_shim_and_settles_once_repaired(
    start_node: StartNode, state_dir: Path, agents: Path, gate: Gate
) -> None:
    """The supervisor refuses a shim's report about a child whose row it cannot read
    (`record_quarantined`); the shim keeps it and resends it, as after `store_full`. It used
    to take that refusal as an acknowledgement: its child had ended, so it exited, and the
    child's exit status reached the run only at the next node restart. Once the row is
    repaired, the next resend settles the run with the child's true exit code."""
    first = start_node(state_dir=state_dir)
    ctx = launch_context(agents, max_active_async_runs_per_session=2)
    item = TaskItem(agent=ctx.plan("gate"), task=str(gate.path))
    run = first.client().runs.launch(ctx.launch("single", True, items=[item]))
    (child,) = gate.accept(1)
    stop(first)
    child_id = f"{run.run_id}-0"
    corrupt(
        state_dir, "supervisor", "UPDATE children SET grace_s = 'soon' WHERE child_id = ?", child_id
    )
    client = start_node(state_dir=state_dir).client()
    assert_reported(state_dir, "supervisor", "children", child_id)

    child.release(3)
    child.wait_exit()
    # The shim writes its exit record, then sends the report that is refused.
    wait_until(lambda: list(Path(run.run_dir).rglob("exit.json")), what="the exit record")
    db = sqlite3.connect(owner_db(state_dir, "supervisor"))
    try:  # the operator repairs the row (doctor: "repair or delete that row")
        db.execute("UPDATE children SET grace_s = 5 WHERE child_id = ?", (child_id,))
        db.commit()
    finally:
        db.close()

    done = client.runs.wait(run.run_id, timeout=20)
    assert (done.state, done.children[0].exit_code) == ("failed", 3)
    assert done.children[0].proof_state == "observed"
