"""A worker's launch whose slot the home took but could not give back in time (DESIGN §1
"Multi-host"; SPEC R-ADM-2, R-ADM-3, R-CAP-15, R-CAP-17; actors/runs/owedslots.py).

The capacity ledger of a worker's runs is the home's. When the home's capacity owner committed
a launch's slot and the home went down before its answer reached the worker, the launch failed
"outcome unknown" (`home_unreachable_in_flight`) and no run ever held that slot; and when a
later step of the admission failed because the home was lost, the rollback of the slot it held
could not be sent. Either way the slot stayed held on the home until its TTL (60 s, counted
again from the home's restart), and the session's launches were refused at a limit of 1 all
that while. Now the worker owes that rollback in its outbox (by the acquire's id, or by the
handle it holds) and sends it until the home answers, so the slot is free seconds after the
home is back. The same holds for an acquire that went unanswered and whose resend was then
refused "not sent" (the home unreachable): that refusal was the launch's answer ("nothing was
applied"), while the first send, still queued, was applied once the home came back; the
launch's outcome is unknown now. And an acquire whose answer was lost with the home's capacity
owner alone is sent again under its id and answered with the same grant: the run that holds it
keeps it.

Real nodes, on loopback and (as root) each on its own host of a network namespace fabric: a
home and one worker, each a process with its own state dir and keys. The home dies at its
capacity owner's commit through its test-only kill point (SUBAGENTS_TEST_KILL_AT), or is
killed with SIGKILL while its fan-out owner is stopped (SIGSTOP). Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import sys
import threading
import uuid
from collections.abc import Callable

import psutil
import pytest

from subagents_node.client.paths import owner_db
from subagents_node.messages.constants import ENV_TEST_KILL_AT
from subagents_node.messages.errors import OwnerUnavailable, SubagentsError
from subagents_node.messages.supervisor import AgentPlan, Launch, RunView, TaskItem
from tests.support.fleet import PLACES, Fleet, fleet, fleet_on
from tests.support.runs import stop_process, stopped, wait_until

pytestmark = pytest.mark.slow

#: Far below the slot's TTL (60 s): the slot is given back once the home answers, not then.
GIVEN_BACK_S = 15.0
#: A child that sleeps until it is stopped, and one that ends at once.
NAP = AgentPlan(name="nap", command=[sys.executable, "-c", "import time; time.sleep(300)"])
QUICK = AgentPlan(name="quick", command=[sys.executable, "-c", ""])


def _launch(session_id: str, agent: AgentPlan = NAP) -> Launch:
    return Launch(
        session_id=session_id,
        mode="single",
        background=True,
        items=[TaskItem(agent=agent, task="go")],
        cwd="/",
        capacity_limit=1,  # a slot is held (R-CAP-10): one leaked refuses every launch
        spawns_per_session=5,
    )


def _joined(crew: Fleet) -> None:
    w1 = crew.workers["w1"]
    wait_until(
        lambda: (c := w1.status().cluster) is not None and c.state == "joined",
        timeout=30.0,
        what="w1 sees its home back",
    )


def _home_back(crew: Fleet) -> None:
    """The home started again (with no kill point), and w1 joined to it."""
    crew.close_client(crew.home)
    crew.home.env = {}
    crew.home.start()
    _joined(crew)


def _given_back(crew: Fleet, session_id: str) -> None:
    """R-ADM-2/3: the slot of the failed launch is free soon after the home is back, and the
    session's next launch on w1 is admitted (the last one ends at once)."""
    home = crew.client(crew.home)
    wait_until(
        lambda: home.capacity.snapshot(session_id, 1).used == 0,
        timeout=GIVEN_BACK_S,
        what="the failed launch's slot given back (it used to stay held until its TTL)",
    )
    assert crew.client(crew.workers["w1"]).runs.launch(_launch(session_id, QUICK)).run_id


@pytest.mark.parametrize("place", PLACES)
def test_a_slot_the_home_took_for_a_launch_whose_answer_it_never_sent_is_given_back(
    place: str,
) -> None:
    with fleet_on(
        place, ("w1",), heartbeat=(0.2, 1.5), home_env={ENV_TEST_KILL_AT: "slot_acquired"}
    ) as crew:
        session_id = f"lost-{uuid.uuid4().hex[:8]}"
        # The home dies (node and owners) right after its capacity owner committed the slot.
        with pytest.raises(OwnerUnavailable) as lost:
            crew.client(crew.workers["w1"]).runs.launch(_launch(session_id))
        err = lost.value
        assert err.details.get("reason") == "home_unreachable_in_flight", err.to_wire()
        # Its outcome is known: no run (not "look before sending it again").
        assert err.details.get("launched") is False, err.to_wire()
        assert "outcome" not in err.details, err.to_wire()
        assert err.message.startswith("The run was not launched"), err.message
        assert "given back as soon as the home answers again" in err.message
        assert crew.home.wait_exited(10.0)
        _home_back(crew)
        _given_back(crew, session_id)


def _owner_pid(crew: Fleet, name: str) -> int:
    actor = next(a for a in crew.home.status().actors if a.name == name)
    assert actor.pid is not None, f"the home's {name} owner has no pid"
    return actor.pid


def _connects_to(pid: int, owner_pid: int) -> Callable[[], bool]:
    """Whether process `pid` has a tcp connection to a port `owner_pid` listens on: a worker's
    link to a home owner opens with its first request to that owner."""
    listening = {
        c.laddr.port
        for c in psutil.Process(owner_pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    }
    return lambda: any(
        c.raddr and c.raddr.port in listening for c in psutil.Process(pid).net_connections("tcp")
    )


def _launching(
    crew: Fleet, session_id: str, outcome: list[RunView | SubagentsError]
) -> threading.Thread:
    """w1's launch, in a thread of its own: its view or its error lands in `outcome`."""

    def launch() -> None:
        try:
            outcome.append(
                crew.client(crew.workers["w1"], timeout=60.0).runs.launch(_launch(session_id))
            )
        except SubagentsError as err:
            outcome.append(err)

    thread = threading.Thread(target=launch)
    thread.start()
    return thread


def test_a_slot_whose_rollback_could_not_reach_the_lost_home_is_given_back() -> None:
    with fleet(("w1",), heartbeat=(0.2, 1.5)) as crew:
        w1 = crew.workers["w1"]
        session_id = f"cut-{uuid.uuid4().hex[:8]}"
        fanout_pid = _owner_pid(crew, "fanout")
        # w1's first request to the home's fan-out owner: the launch's budget, once it holds
        # its slot.
        budget_sent = _connects_to(w1.pid, fanout_pid)
        assert not budget_sent()
        outcome: list[RunView | SubagentsError] = []
        stop_process(fanout_pid)  # the budget request waits there, unanswered
        try:
            launching = _launching(crew, session_id, outcome)
            wait_until(budget_sent, what="w1's launch past its acquire")
            assert crew.client(crew.home).capacity.snapshot(session_id, 1).used == 1
            crew.close_client(crew.home)
            crew.home.kill()
            launching.join(30.0)
        finally:
            with contextlib.suppress(ProcessLookupError):  # died with its node, or here
                os.kill(fanout_pid, signal.SIGKILL)
        assert not launching.is_alive(), "the launch went unanswered"
        err = outcome[0]
        assert isinstance(err, OwnerUnavailable), err
        assert err.details.get("reason") == "home_unreachable_in_flight", err.to_wire()
        _home_back(crew)
        _given_back(crew, session_id)


def test_an_acquire_that_went_unanswered_and_could_not_be_sent_again_is_given_back() -> None:
    """The first acquire waits on w1's link to the home's stopped capacity owner past the
    worker's remote timeout (5 s); its resend then finds the home unreachable and is refused
    "not sent (nothing was applied)". That refusal was the launch's answer, although the first
    acquire was still queued and was applied once the home came back: the slot stayed held
    until its TTL. Now the launch's outcome is unknown and the slot is owed back."""
    # A long heartbeat timeout: the home is unreachable (admissions fail closed) but never
    # lost, so what is queued to it stays queued.
    with fleet(("w1",), heartbeat=(0.2, 60.0)) as crew:
        w1 = crew.workers["w1"]
        session_id = f"again-{uuid.uuid4().hex[:8]}"
        capacity_pid = _owner_pid(crew, "capacity")
        sent_to = _connects_to(w1.pid, capacity_pid)
        assert not sent_to()
        outcome: list[RunView | SubagentsError] = []
        stop_process(capacity_pid)  # the acquire waits on w1's side (handshake pending)
        try:
            launching = _launching(crew, session_id, outcome)
            wait_until(sent_to, what="w1's acquire on its way to the home")
            with stopped(crew.home.pid):
                wait_until(
                    lambda: (c := w1.status().cluster) is not None and c.state == "unreachable",
                    what="w1 sees its home unreachable",
                )
                launching.join(30.0)
        finally:
            os.kill(capacity_pid, signal.SIGCONT)
        assert not launching.is_alive(), "the launch went unanswered"
        err = outcome[0]
        assert isinstance(err, OwnerUnavailable), err
        # Not "not sent (nothing was applied)": the first send was applied when the home came
        # back, and its slot is given back.
        assert err.details.get("launched") is False, err.to_wire()
        assert err.message.startswith("The run was not launched"), err.message
        _joined(crew)
        _given_back(crew, session_id)


def test_an_acquire_answered_again_under_its_id_keeps_its_slot_for_its_run() -> None:
    """The home's capacity owner alone is killed after its commit: the worker sends the
    acquire again under its id once the answer did not come, is answered the same grant, and
    the run holds it (R-CAP-17: nothing owed frees a started slot)."""
    kill_owner = {ENV_TEST_KILL_AT: "owner:slot_acquired"}
    with fleet(("w1",), heartbeat=(0.2, 1.5), home_env=kill_owner) as crew:
        w1 = crew.workers["w1"]
        session_id = f"again-{uuid.uuid4().hex[:8]}"
        view = crew.client(w1, timeout=60.0).runs.launch(_launch(session_id))
        home = crew.client(crew.home)
        capacity = next(a for a in crew.home.status().actors if a.name == "capacity")
        assert capacity.restarts >= 1, "the home's capacity owner was not killed at its commit"
        found = home.capacity.inspect(view.run_id, session_id)
        assert found.owner is not None and found.owner.started, found
        assert home.capacity.snapshot(session_id, 1).used == 1
        with contextlib.closing(sqlite3.connect(owner_db(w1.state_dir, "supervisor"))) as db:
            owed = db.execute(
                "SELECT count(*) FROM run_outbox WHERE type = 'capacity.rollback_acquire'"
            ).fetchone()[0]
        assert owed == 0, "a rollback was owed for an acquire its run holds"
        crew.client(w1).runs.stop(view.run_id)
        wait_until(
            lambda: home.capacity.snapshot(session_id, 1).used == 0,
            what="the run's slot released once it stopped",
        )
