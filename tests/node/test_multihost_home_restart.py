"""A home just restarted has not heard from its workers yet (DESIGN §1 "Multi-host"): their
beats were in the memory of the home before. A request for a worker in that window used to be
refused at once ("unreachable (last heartbeat none since the home started); nothing was sent"),
so `run --on w1` right after a home's restart failed, and worse, a launch whose home was killed
with it in flight, sent again by its client under its launch id to the next home, was refused
while the worker held (and then ran) its first send: the caller was told nothing was sent and a
run it did not know of held a slot. Now the home holds such a request until the worker's first
heartbeat is due (the heartbeat timeout after its start), and the worker answers the launch
sent again with the run its first send made: one run, the caller told which.

Real nodes on loopback; the worker is stopped (SIGSTOP) so that its first beat to the new
home comes only when the test lets it.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest

from subagents_node.client.client import Client
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.supervisor import AgentPlan, Launch, RunView, TaskItem
from tests.support.fleet import EXAMPLE_AGENTS, Fleet, fleet
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def crew() -> Iterator[Fleet]:
    with fleet(("w1",), heartbeat=(0.2, 8.0)) as started:
        yield started


def _launch(session: str) -> Launch:
    agent = AgentPlan(
        name="sleeper",
        command=["python3", str(EXAMPLE_AGENTS / "sleeper.py"), "{task}"],
    )
    return Launch(
        session_id=session,
        mode="single",
        background=True,
        cwd="/tmp",
        items=[TaskItem(agent=agent, task="seconds=30")],
        launch_id=uuid.uuid4().hex,
    )


def test_a_launch_sent_again_to_a_restarted_home_reaches_its_worker_and_finds_its_one_run(
    crew: Fleet,
) -> None:
    w1 = crew.workers["w1"]
    session = f"hr-{uuid.uuid4().hex[:8]}"
    launch = _launch(session)
    with crew.client(crew.home).on("w1") as on_w1:
        first = on_w1.runs.launch(launch)
    assert first.state == "running"

    os.kill(w1.pid, signal.SIGSTOP)  # alive, but silent: no beat reaches the new home yet
    outcome: list[RunView | SubagentsError] = []
    try:
        crew.close_client(crew.home)
        crew.home.kill()
        crew.home.start()
        # The client whose home went sends the launch again, under its id, to the next home.
        again = Client(ZmqTransport(crew.home.address), timeout=20.0)

        def send_again() -> None:
            try:
                with again.on("w1") as on_w1:
                    outcome.append(on_w1.runs.launch(launch))
            except SubagentsError as err:
                outcome.append(err)

        sender = threading.Thread(target=send_again)
        sender.start()
        sender.join(1.0)  # the home has it by now: refused at once, or held for w1's beat
    finally:
        os.kill(w1.pid, signal.SIGCONT)
    sender.join(30.0)
    again.close()
    assert len(outcome) == 1, outcome
    found = outcome[0]
    assert isinstance(found, RunView), found
    assert found.run_id == first.run_id  # the one run its first send made, not a second
    runs = crew.client(w1).runs.list(session_id=session)
    assert [r.run_id for r in runs] == [first.run_id]
    crew.client(w1).runs.stop(first.run_id)


def test_run_on_a_worker_right_after_the_home_restarted_waits_for_its_first_heartbeat(
    crew: Fleet,
) -> None:
    w1 = crew.workers["w1"]
    os.kill(w1.pid, signal.SIGSTOP)
    try:
        crew.close_client(crew.home)
        crew.home.kill()
        crew.home.start()
        done: list[tuple[int, str, str]] = []
        args = ("run", "--async", "--on", "w1", "--agents-dir", str(EXAMPLE_AGENTS))
        runner = threading.Thread(
            target=lambda: done.append(crew.cli(crew.home, *args, "sleeper", "seconds=0"))
        )
        runner.start()
        runner.join(1.0)  # refused at once before; now held for w1's first beat
    finally:
        os.kill(w1.pid, signal.SIGCONT)
    runner.join(30.0)
    code, out, err = done[0]
    assert code == 0, err
    run_id = out.strip().splitlines()[0]
    wait_until(lambda: crew.client(w1).runs.show(run_id).state == "complete", what="its end")
