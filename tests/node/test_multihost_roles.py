"""A home's or a worker's state dir is served in that role again (DESIGN §1 "Multi-host"; §2:
a started slot is released only by its run's proven end or an operator's release).

A foreground `run` on a worker, whose node was killed under it, used to take the state dir
over with a node of its own: a plain node, with empty ledgers of its own. It adopted the
worker's runs, found no capacity slot for them there and stopped them (another user's
background run killed), and their ends went to its own ledger, so the home kept their slots
held for good. A plain `start` (the fix the CLI's "no node is running" message suggests) did
the same; on a home's dir it cut every worker off. Now a node without the role refuses such a
dir in one line, the foreground command says its run goes on, and nothing is stopped.

Real nodes on loopback, started and killed through the real CLI.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.support.fleet import EXAMPLE_AGENTS, Fleet, fleet
from tests.support.nodes import CLI, REPO
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def crew() -> Iterator[Fleet]:
    with fleet(("w1",), heartbeat=(0.2, 1.5)) as started:
        yield started


def _followed_run(follower: subprocess.Popen[str]) -> str:
    """The run id the foreground command says it follows (its launch was answered)."""
    assert follower.stderr is not None
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([follower.stderr], [], [], deadline - time.monotonic())
        line = follower.stderr.readline() if ready else ""
        words = line.split()
        if len(words) == 4 and words[1] == "run" and words[3] == "started":
            return words[2]
        assert line or ready, "the foreground run never said it started"
    raise AssertionError("the foreground run never said it started")


def test_a_killed_workers_dir_is_not_taken_over_by_a_plain_node_and_its_runs_go_on(
    crew: Fleet,
) -> None:
    w1 = crew.workers["w1"]
    session = f"ro-{uuid.uuid4().hex[:8]}"
    code, out, err = crew.run_background(w1, session, "seconds=60", limit=3)
    assert code == 0, err
    background = out.strip().splitlines()[0]
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": "3"}
    args = ("--state-dir", str(w1.state_dir), "run", "--session", session)
    follower = subprocess.Popen(
        [*CLI, *args, "--agents-dir", str(EXAMPLE_AGENTS), "sleeper", "seconds=20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        foreground = _followed_run(follower)
        crew.close_client(w1)
        w1.kill()
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode != 0
    assert "was last served by a worker node" in err, err
    assert f"Run {foreground} goes on" in err, err

    # A plain start is refused too, in one line; the worker's own start adopts both runs.
    code, _, err = crew.cli(w1, "start", "--detach")
    assert code == 1 and "start it as that worker again" in err, err
    assert len(err.strip().splitlines()) == 1, err
    w1.start()
    runs = {r.run_id: r.state for r in crew.client(w1).runs.list(session_id=session)}
    assert runs == {background: "running", foreground: "running"}, runs
    assert crew.client(crew.home).capacity.snapshot(session, 3).used == 1  # the background's
    assert crew.client(w1).runs.stop(background) is not None
    assert crew.client(w1).runs.stop(foreground) is not None
    wait_until(
        lambda: crew.client(crew.home).capacity.snapshot(session, 3).used == 0,
        what="the background run's slot released by its proven end",
    )


def test_a_killed_homes_dir_is_served_only_by_a_home_again(crew: Fleet) -> None:
    crew.close_client(crew.home)
    crew.home.kill()
    code, _, err = crew.cli(crew.home, "start", "--detach")
    assert code == 1 and "was last served by a home node" in err, err
    crew.home.start()  # as a home: its worker heartbeats it again
    wait_until(lambda: crew.nodes()["w1"].state == "up", what="w1 back with its home")


def test_a_workers_dir_started_under_another_name_is_refused_and_its_run_goes_on(
    crew: Fleet,
) -> None:
    """Started under a new name (its key allowed as that name), a worker's dir used to adopt
    its runs, find no slot for them under the new name and stop them ("Its capacity slot was
    lost while the node was down"), while the home held their slots under the old name."""
    w1 = crew.workers["w1"]
    session = f"rn-{uuid.uuid4().hex[:8]}"
    code, out, err = crew.run_background(w1, session, "seconds=60", limit=3)
    assert code == 0, err
    run_id = out.strip().splitlines()[0]
    code, _, err = crew.cli(w1, "stop")
    assert code == 0, err
    for args in (("keys", "revoke", "w1"), ("keys", "allow", "--name", "w5", "--")):
        extra = (crew.public_key(w1.state_dir),) if args[1] == "allow" else ()
        code, _, err = crew.cli(crew.home, *args, *extra)
        assert code == 0, err

    code, _, err = crew.cli(w1, "start", "--detach", *crew.worker_args("w5"))
    assert code == 1 and "was last served as worker 'w1', not 'w5'" in err, err
    assert crew.client(crew.home).capacity.snapshot(session, 3).used == 1
    # Back under its name (its key allowed as w1 again), it adopts the run, still running.
    for args in (("keys", "revoke", "w5"), ("keys", "allow", "--name", "w1", "--")):
        extra = (crew.public_key(w1.state_dir),) if args[1] == "allow" else ()
        code, _, err = crew.cli(crew.home, *args, *extra)
        assert code == 0, err
    w1.start()
    assert crew.client(w1).runs.show(run_id).state == "running"
    crew.client(w1).runs.stop(run_id)
    wait_until(
        lambda: crew.client(crew.home).capacity.snapshot(session, 3).used == 0,
        what="its slot released by its proven end",
    )
