"""A launch the home gave up on, answered late by its worker (DESIGN §1 "Multi-host";
runtime/node/hostcalls.py): no run runs unaccounted.

A worker that does not answer within the home's wait (75 s; 1 s here, through the home's
test-only knob) may still start the run: a stopped process (SIGSTOP, here) or a healed
partition finds the launch in its socket and runs it. Its ledgers are the home's, so the run's
slot and spawn are counted as any run's; the caller is told its launch's outcome is unknown
(`host_timeout`, `outcome: unknown`), never that nothing was applied, with the session to look
in; and a nested launch a worker placed is recorded as that worker's when the late answer comes,
so the worker may follow and stop the run it placed (before, it was refused
`not_placed_by_you` for good, and only the home's operator could stop it).

Real nodes, on loopback and (as root) each on its own host of a network namespace fabric: a
home and two workers, each a process with its own state dir, keys and sockets; the test
process speaks to the home over tcp with a worker's own CURVE key, as
test_multihost_placed.py does.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from subagents_node.messages.base import Request
from subagents_node.messages.constants import ENV_TEST_HOST_CALL_TIMEOUT
from subagents_node.messages.errors import OwnerUnavailable, SubagentsError
from subagents_node.messages.fanout import encode_descriptor
from subagents_node.messages.supervisor import (
    AgentPlan,
    Launch,
    RunView,
    Show,
    Stop,
    TaskItem,
)
from tests.support.fleet import PLACES, Fleet, fleet_on
from tests.support.runs import stopped, wait_until

pytestmark = pytest.mark.slow

#: The home's wait for a worker's answer in these tests (75 s otherwise).
HOST_WAIT_S = 1.0
#: A child that sleeps until it is stopped (or the fleet is torn down).
NAP = AgentPlan(name="nap", command=[sys.executable, "-c", "import time; time.sleep(300)"])


@pytest.fixture(scope="module", params=PLACES)
def crew(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    # A long heartbeat timeout: the stopped worker stays `up`, so the launch is sent to it.
    with fleet_on(
        request.param,
        ("w1", "w2"),
        heartbeat=(0.2, 60.0),
        home_env={ENV_TEST_HOST_CALL_TIMEOUT: str(HOST_WAIT_S)},
    ) as started:
        try:
            yield started
        finally:  # a failed test's runs: their children would outlive the nodes
            for node in [started.home, *started.workers.values()]:
                with contextlib.suppress(SubagentsError):
                    client = started.client(node)
                    for view in client.runs.list(active_only=True, limit=1000):
                        client.runs.stop(view.run_id)


@contextlib.contextmanager
def _stopped(crew: Fleet, name: str) -> Iterator[None]:
    """Worker `name`'s node process stopped (SIGSTOP) for the block: it answers nothing until
    it is continued (SIGCONT), then answers what it was sent meanwhile."""
    with stopped(crew.workers[name].pid):
        yield


def _launch(crew: Fleet, nested: bool) -> Launch:
    descriptor = crew.client(crew.home).fanout.create(f"root-{uuid.uuid4().hex[:8]}", 8)
    return Launch(
        session_id=f"late-{uuid.uuid4().hex[:8]}",
        mode="single",
        background=True,
        items=[TaskItem(agent=NAP, task="nap")],
        cwd="/",
        depth=1 if nested else 0,
        max_depth=3,
        inherited_fanout=encode_descriptor(descriptor) if nested else None,
        capacity_limit=3,  # a slot is held (R-CAP-10), not unlimited (R-CAP-8)
        spawns_per_session=5,
    )


#: One request asked of the home over tcp with a worker's own key, from that worker's host (its
#: namespaces: the fabric's addresses exist there, not here): its answer, or typed error, as JSON.
_PROBE = """
import json, sys
from pathlib import Path
from subagents_node.client.client import Client
from subagents_node.client.keys import CLIENT_KEY, ClientCredentials, keys_dir, read_keypair
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.protocol import parse_request
state_dir, endpoint, home_key, host, type_, body = sys.argv[1:]
keys = ClientCredentials(read_keypair(keys_dir(Path(state_dir)) / CLIENT_KEY), home_key)
request = parse_request(type_, json.loads(body))
with Client(ZmqTransport(endpoint, credentials=keys, host=host), timeout=20.0) as client:
    try:
        answer = client.ask(request, request.Result).model_dump(mode="json")
        print(json.dumps({"reply": answer}))
    except SubagentsError as err:
        print(json.dumps({"error": err.code, "message": err.message, "details": err.details}))
"""


def _as_worker(crew: Fleet, name: str, host: str, request: Request) -> dict[str, Any]:
    """What the home answers worker `name`'s key asking `request` for `host`."""
    worker = crew.workers[name]
    body = request.model_dump_json()
    argv = [sys.executable, "-c", _PROBE, str(worker.state_dir), crew.endpoint, crew.home_key]
    done = subprocess.run(
        [*worker.prefix, *argv, host, request.type, body],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def _assert_outcome_unknown(
    code: str, message: str, details: dict[str, Any], launch: Launch
) -> None:
    assert (code, details["reason"]) == ("unavailable", "host_timeout"), message
    assert details["outcome"] == "unknown", message
    assert details["session_id"] == launch.session_id
    assert "outcome is unknown" in message
    assert f"runs --session {launch.session_id}" in message  # where to look


def _started_late(crew: Fleet, host: str, session_id: str) -> RunView:
    """The run the late launch started on `host`, found as the caller was told to look."""
    home = crew.client(crew.home)

    def found() -> RunView | None:
        runs = [r for h in home.hosts.runs(session_id=session_id) if h.host == host for r in h.runs]
        return runs[0] if runs and runs[0].state == "running" else None

    return wait_until(found, what=f"the late launch's run on {host}")


def test_a_launch_whose_worker_answers_after_the_homes_wait_says_its_outcome_is_unknown_and_its_run_is_counted(  # noqa: E501
    crew: Fleet,
) -> None:
    launch = _launch(crew, nested=False)
    on_w1 = crew.client(crew.home).hosts.on("w1")
    with _stopped(crew, "w1"), pytest.raises(OwnerUnavailable) as timed_out:
        on_w1.runs.launch(launch)
    err = timed_out.value
    _assert_outcome_unknown(err.code, err.message, err.details, launch)

    run = _started_late(crew, "w1", launch.session_id)
    home = crew.client(crew.home)
    # R-CAP-3, R-SPN-1: the run the caller was not told of holds its slot and its spawn.
    assert home.capacity.snapshot(launch.session_id).used == 1
    assert home.session.spawn_snapshot(launch.session_id).used == 1
    on_w1.runs.stop(run.run_id)
    wait_until(
        lambda: home.capacity.snapshot(launch.session_id).used == 0,
        what="the late run's slot released once it stopped",
    )


def test_a_nested_launch_placed_by_a_worker_and_answered_late_is_recorded_as_that_workers(
    crew: Fleet,
) -> None:
    launch = _launch(crew, nested=True)
    with _stopped(crew, "w1"):
        placed = _as_worker(crew, "w2", "w1", launch)
    assert "error" in placed, placed
    _assert_outcome_unknown(placed["error"], placed["message"], placed["details"], launch)
    run_id = _started_late(crew, "w1", launch.session_id).run_id

    def followed() -> dict[str, Any] | None:
        shown = _as_worker(crew, "w2", "w1", Show(run_id=run_id))
        if "error" in shown:  # the late answer is not settled yet
            assert shown["details"]["reason"] == "not_placed_by_you", shown
            return None
        return shown

    # The worker that placed the run may follow it, and stop it, as if answered in time.
    assert (
        wait_until(followed, what=f"w2 allowed to follow {run_id}")["reply"]["state"] == "running"
    )
    assert "reply" in _as_worker(crew, "w2", "w1", Stop(run_id=run_id))
    home = crew.client(crew.home)
    wait_until(
        lambda: home.capacity.snapshot(launch.session_id).used == 0,
        what="the placed run's slot released once its placer stopped it",
    )
