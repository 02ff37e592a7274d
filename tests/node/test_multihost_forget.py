"""`nodes forget` declares a worker lost (DESIGN §1 "Multi-host", §2: a started slot is released
only by its run's proven end or by an operator's release of a lost worker). A worker that is up
is not lost: forgetting it used to release the slots of its running children and fence it,
and a fenced node learns nothing of the release, so its children ran on without slots while
the session admitted others in their place, past its limit (R-CAP-1). Now the home refuses to
forget a worker that may be alive and releases nothing; once the worker stopped cleanly (or
has been silent for the heartbeat timeout) it may be forgotten.

A worker that was only cut off (silent for the timeout, then back) and forgotten meanwhile was
told it is fenced, and its children ran on with the slots the home had released: the session
ran past its limit until the worker was restarted. Now a worker told it was forgotten stops
the runs that held those slots, saying why; one fenced by a newer start of itself stops none.

Real nodes on loopback, started, stopped and asked through the real CLI and sockets.
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator

import pytest

from subagents_node.client.keys import keys_dir
from tests.support.fleet import Fleet, fleet
from tests.support.nodes import NodeProcess, new_state_dir
from tests.support.runs import events_of, process_gone, stop_process, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def crew() -> Iterator[Fleet]:
    with fleet(("w1",), heartbeat=(0.2, 1.5)) as started:
        yield started


def _used(crew: Fleet, session: str, limit: int) -> int:
    return crew.client(crew.home).capacity.snapshot(session, limit).used


def _running_on_w1(crew: Fleet, session: str) -> tuple[str, int]:
    """A background run of one long child on w1 (the session's limit 1), with w1 up: the run's
    id and its child's pid."""
    w1 = crew.workers["w1"]
    code, out, err = crew.run_background(w1, session, "seconds=120", limit=1)
    assert code == 0, err
    run_id = out.strip().splitlines()[0]
    child = wait_until(
        lambda: next((c.pid for c in crew.client(w1).runs.show(run_id).children if c.pid), None),
        what="its child's pid",
    )
    wait_until(lambda: crew.nodes()["w1"].state == "up", what="w1 up")
    return run_id, child


def _a_newer_start_of_w1_joins(crew: Fleet) -> None:
    """Another start of w1 (the same key, another state dir) joins in its place; returns once
    the home has it `up`."""
    again = new_state_dir()
    shutil.copytree(keys_dir(crew.workers["w1"].state_dir), keys_dir(again), dirs_exist_ok=True)
    newer = crew.workers["w1-newer"] = NodeProcess(again, crew.worker_args("w1"))
    newer.start()
    wait_until(lambda: crew.nodes()["w1"].state == "up", what="the newer w1 up")


def test_r_cap_1_forgetting_a_worker_that_is_up_is_refused_and_keeps_its_running_childs_slot(
    crew: Fleet,
) -> None:
    session = f"fg-{uuid.uuid4().hex[:8]}"
    w1 = crew.workers["w1"]
    code, out, err = crew.run_background(w1, session, "seconds=60", limit=1)
    assert code == 0, err
    run_id = out.strip().splitlines()[0]
    wait_until(lambda: crew.nodes()["w1"].state == "up", what="w1 up")

    code, out, err = crew.cli(crew.home, "nodes", "forget", "w1", "--reason", "oops")
    assert code == 1, out
    assert "worker 'w1' is not lost: it is up" in err and "nothing was released" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert _used(crew, session, 1) == 1  # its child runs: its slot is held
    assert crew.nodes()["w1"].state == "up"
    assert crew.client(crew.home).capacity.releases(host="w1").releases == []
    # The session is at its limit: a second run is refused, wherever it would run.
    code, _, err = crew.run_background(w1, session, "seconds=1", limit=1)
    assert code != 0 and "exhausted" in err, err
    assert crew.client(w1).runs.show(run_id).state == "running"

    # Stopped cleanly, it is gone at once (its child runs on): now it may be forgotten.
    code, _, err = crew.cli(w1, "stop")
    assert code == 0, err
    code, out, err = crew.cli(crew.home, "nodes", "forget", "w1", "--reason", "retired")
    assert code == 0, err
    assert f"released 1 slot: {run_id}" in out
    assert _used(crew, session, 1) == 0
    # Started again, it joins again and stops the run it adopts: its slot was released.
    w1.start()
    wait_until(lambda: crew.client(w1).runs.show(run_id).state != "running", what="its end")


@pytest.fixture
def patient_crew() -> Iterator[Fleet]:
    """A home that takes a worker as gone only after 8 s of silence."""
    with fleet(("w1",), heartbeat=(0.2, 8.0)) as started:
        yield started


def test_a_home_just_restarted_refuses_to_forget_a_worker_it_has_not_heard_from_yet(
    patient_crew: Fleet,
) -> None:
    crew = patient_crew
    session = f"fr-{uuid.uuid4().hex[:8]}"
    w1 = crew.workers["w1"]
    code, out, err = crew.run_background(w1, session, "seconds=60", limit=2)
    assert code == 0, err
    run_id = out.strip().splitlines()[0]
    os.kill(w1.pid, signal.SIGSTOP)  # alive, but it cannot beat to the new home yet
    try:
        crew.close_client(crew.home)
        crew.home.kill()
        crew.home.start()
        # Within the heartbeat timeout of its start the home cannot tell a live worker from
        # a lost one (its last beats were in the killed process's memory): not lost yet.
        code, out, err = crew.cli(crew.home, "nodes", "forget", "w1", "--reason", "too soon")
        assert code == 1, out
        assert "worker 'w1' is not lost: this home started" in err, err
        assert "has not heard from it yet" in err, err
        assert _used(crew, session, 2) == 1
    finally:
        os.kill(w1.pid, signal.SIGCONT)
    wait_until(lambda: crew.nodes()["w1"].state == "up", what="w1 heartbeating the new home")
    crew.client(w1).runs.stop(run_id)


def test_r_cap_1_a_worker_forgotten_while_cut_off_stops_its_runs_when_the_partition_heals(
    crew: Fleet,
) -> None:
    """Used to: the worker, continued, was told it is fenced, and its run went on `running`
    (its child with it) while the home had released its slot, so the session (limit 1) could
    admit a second run elsewhere, past its limit, until the worker was restarted."""
    session = f"fc-{uuid.uuid4().hex[:8]}"
    w1 = crew.workers["w1"]
    run_id, child = _running_on_w1(crew, session)
    stop_process(w1.pid)  # cut off: its node beats no more; its run supervisor and child run on
    try:
        wait_until(lambda: crew.nodes()["w1"].state == "unreachable", what="w1 silent")
        code, out, err = crew.cli(crew.home, "nodes", "forget", "w1", "--reason", "cut off")
        assert code == 0, err
        assert f"released 1 slot: {run_id}" in out, out
        assert _used(crew, session, 1) == 0  # the home may grant that slot to another run
        assert not process_gone(child)  # still running while its node is stopped
    finally:
        os.kill(w1.pid, signal.SIGCONT)
    # The partition heals: the worker is told it was forgotten, and stops the run.
    view = wait_until(
        lambda: (v := crew.client(w1).runs.show(run_id)).state != "running" and v,
        what="the forgotten worker's run to end",
    )
    assert view.state == "stopped", view
    assert "forgotten by its home" in view.error, view.error
    assert "capacity slots were released there" in view.error, view.error
    assert "cut off" in view.error, view.error
    wait_until(lambda: process_gone(child), what="its child to be gone")
    status = crew.client(w1).status()
    assert status.cluster is not None and status.cluster.state == "fenced", status.cluster
    # `show` on the fenced worker shows the run and why (it used to fail on the home's ledgers).
    code, out, err = crew.cli(w1, "show", run_id)
    assert code == 0, err
    assert "Spawn budget and active async capacity: unknown" in out, out
    assert "stopped" in out and "forgotten by its home" in out, out


def test_a_worker_fenced_by_a_newer_start_of_itself_stops_none_of_its_runs(crew: Fleet) -> None:
    """Only a worker the operator forgot stops its runs (their slots were released): one fenced
    because a newer start of it joined while it was cut off stops nothing (that start owns the
    name and the home still holds the runs' slots)."""
    session = f"fs-{uuid.uuid4().hex[:8]}"
    w1 = crew.workers["w1"]
    code, out, err = crew.run_background(w1, session, "seconds=120", limit=2)
    assert code == 0, err
    run_id = out.strip().splitlines()[0]
    wait_until(lambda: crew.nodes()["w1"].state == "up", what="w1 up")
    stop_process(w1.pid)
    try:
        wait_until(lambda: crew.nodes()["w1"].state == "unreachable", what="w1 silent")
        _a_newer_start_of_w1_joins(crew)
    finally:
        os.kill(w1.pid, signal.SIGCONT)

    def fenced() -> bool:
        cluster = crew.client(w1).status().cluster
        return cluster is not None and cluster.state == "fenced"

    wait_until(fenced, what="the older w1 fenced")
    cluster = crew.client(w1).status().cluster
    assert cluster is not None and "another start of it joined" in cluster.reason, cluster
    assert crew.client(w1).runs.show(run_id).state == "running"
    assert not any(e.kind == "run.stopping" for e in events_of(crew.client(w1), run_id))
    assert _used(crew, session, 2) == 1  # the home holds its slot still
    # Its own operator may still stop it (on its own ipc socket): no child is left behind.
    child = next(c.pid for c in crew.client(w1).runs.show(run_id).children if c.pid)
    crew.client(w1).runs.stop(run_id)
    wait_until(lambda: process_gone(child), what="its child to be gone")


def test_a_worker_forgotten_while_cut_off_stops_its_runs_even_once_a_newer_start_joined(
    crew: Fleet,
) -> None:
    """Forgotten, then replaced by a newer start of it (another state dir), the cut-off
    process's runs had their slots released all the same: it stops them when it heals, though
    the home's row now names the newer start (its refusal would otherwise read `superseded`)."""
    session = f"fn-{uuid.uuid4().hex[:8]}"
    w1 = crew.workers["w1"]
    run_id, child = _running_on_w1(crew, session)
    stop_process(w1.pid)
    try:
        wait_until(lambda: crew.nodes()["w1"].state == "unreachable", what="w1 silent")
        code, out, err = crew.cli(crew.home, "nodes", "forget", "w1", "--reason", "cut off")
        assert code == 0 and f"released 1 slot: {run_id}" in out, (out, err)
        _a_newer_start_of_w1_joins(crew)
    finally:
        os.kill(w1.pid, signal.SIGCONT)
    view = wait_until(
        lambda: (v := crew.client(w1).runs.show(run_id)).state != "running" and v,
        what="the forgotten process's run to end",
    )
    assert view.state == "stopped" and "forgotten by its home" in view.error, view
    wait_until(lambda: process_gone(child), what="its child to be gone")
    assert crew.nodes()["w1"].state == "up"  # the newer start is untouched


def test_a_forgotten_workers_stop_survives_its_run_supervisor_dying_with_the_stop_in_flight(
    crew: Fleet,
) -> None:
    """Used to: the worker asked its run supervisor once; a supervisor killed with that ask in
    flight answered it with an error, and its runs (restarted, adopted) went on for good. Then
    it was asked again every 0.5 s, at most 120 times (a blind poll that gave up after 60 s).
    Now the pending stop is sent again when the restarted supervisor is ready (the node's
    owner supervision says so), and only then: twice in all, the second after the restart."""
    session = f"fk-{uuid.uuid4().hex[:8]}"
    w1 = crew.workers["w1"]
    run_id, child = _running_on_w1(crew, session)
    supervisor = next(a.pid for a in crew.client(w1).status().actors if a.name == "supervisor")
    assert supervisor is not None
    stop_process(supervisor)
    stop_process(w1.pid)
    try:
        wait_until(lambda: crew.nodes()["w1"].state == "unreachable", what="w1 silent")
        code, out, err = crew.cli(crew.home, "nodes", "forget", "w1", "--reason", "cut off")
        assert code == 0 and f"released 1 slot: {run_id}" in out, (out, err)
    finally:
        os.kill(w1.pid, signal.SIGCONT)

    def fenced() -> bool:
        cluster = crew.client(w1).status().cluster
        return cluster is not None and cluster.state == "fenced"

    try:
        wait_until(fenced, what="w1 told it was forgotten")  # its ask waits on the supervisor
    finally:
        os.kill(supervisor, signal.SIGKILL)  # dies with the ask in flight; it is restarted
    view = wait_until(
        lambda: (v := crew.client(w1).runs.show(run_id)).state != "running" and v,
        what="the forgotten worker's run to end",
    )
    assert view.state == "stopped" and "forgotten by its home" in view.error, view
    wait_until(lambda: process_gone(child), what="its child to be gone")
    log = w1.log()
    asked = "forgotten by the home: asking its run supervisor to stop its slot-holding runs"
    killed = f"owner supervisor (pid {supervisor}) was killed by SIGKILL; restarting it"
    assert log.count(asked) == 2, log  # before the kill, and once it was ready again: no poll
    assert log.index(killed) < log.rindex(asked), log
    assert "asked again once its run supervisor is ready" in log, log
