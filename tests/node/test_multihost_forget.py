"""`nodes forget` declares a worker lost (DESIGN §1 "Multi-host", §2: a started slot is released
only by its run's proven end or by an operator's release of a lost worker). A worker that is up
is not lost: forgetting it used to release the slots of its running children and fence it,
and a fenced node learns nothing of the release, so its children ran on without slots while
the session admitted others in their place, past its limit (R-CAP-1). Now the home refuses to
forget a worker that may be alive and releases nothing; once the worker stopped cleanly (or
has been silent for the heartbeat timeout) it may be forgotten.

Real nodes on loopback, started, stopped and asked through the real CLI and sockets.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator

import pytest

from tests.support.fleet import Fleet, fleet
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def crew() -> Iterator[Fleet]:
    with fleet(("w1",), heartbeat=(0.2, 1.5)) as started:
        yield started


def _used(crew: Fleet, session: str, limit: int) -> int:
    return crew.client(crew.home).capacity.snapshot(session, limit).used


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
