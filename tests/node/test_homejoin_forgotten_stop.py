"""A forgotten worker's stop of its slot-holding runs (`runs.stop_released`, R-CAP-1) is sent
to its run supervisor on events, not on a timer (runtime/node/homejoin.py).

It used to be asked again every 0.5 s, at most 120 times, while the supervisor did not answer
with its RunList: a blind poll that gave up silently after 60 s, so a supervisor back after
61 s was never asked and the runs whose slots the home had released ran on past their
sessions' limits. Now the stop stays pending until the supervisor answers it with its RunList:
it is sent when the supervisor is ready (at once if it is ready now), and again each time the
supervisor becomes ready (the node's owner supervision says so), however long it was down;
never once the node stops; nothing is sent meanwhile.

HomeJoin here is the real class with a real Dispatcher; the run supervisor's route is the
test's own function that records each request and lets the test answer it, as the forwarder
would (an owner that ended with it in flight, or the supervisor's RunList). The node's side of
the wiring (its owner supervision telling HomeJoin) is in tests/node/test_multihost_forget.py.
"""

from __future__ import annotations

import threading

from subagents_node.actors.outcomes import ReplyFn
from subagents_node.messages.base import Request
from subagents_node.messages.errors import OwnerUnavailable
from subagents_node.messages.supervisor import RunList, StopReleased
from subagents_node.node.dispatch import Dispatcher
from subagents_node.node.homejoin import HomeJoin

#: Longer than the old retry's 0.5 s: a timer would have asked again within it.
QUIET_S = 1.0


class Supervisor:
    """The run supervisor's route: what was asked of it, and a way to answer each ask."""

    def __init__(self) -> None:
        self.asked: list[tuple[StopReleased, ReplyFn]] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)

    def route(self, request: Request, target: str, reply: ReplyFn) -> None:
        assert isinstance(request, StopReleased) and target == "supervisor", request
        with self._arrived:
            self.asked.append((request, reply))
            self._arrived.notify_all()

    def asks_within(self, count: int, timeout: float) -> int:
        """How many asks there are once `count` arrived or `timeout` passed (an event wait)."""
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.asked) >= count, timeout)
            return len(self.asked)

    def answer_ended(self) -> None:
        """The supervisor's process ended with the last ask in flight (what the links say)."""
        self.asked[-1][1](
            OwnerUnavailable(
                "supervisor ended with runs.stop_released in flight",
                owner="supervisor",
                state="unknown",
                reason="timeout",
            )
        )

    def answer_taken(self) -> None:
        self.asked[-1][1](RunList(runs=[], last_seq=0))


def _worker() -> tuple[HomeJoin, Supervisor]:
    dispatcher = Dispatcher(lambda request, principal, reply: None, 100)
    supervisor = Supervisor()
    dispatcher.register("supervisor", supervisor.route)
    return HomeJoin("tcp://127.0.0.1:9", dispatcher, "node-test"), supervisor


def test_r_cap_1_a_forgotten_workers_stop_is_sent_at_each_ready_of_its_supervisor_only() -> None:
    """Used to: asked at once, then every 0.5 s while refused, at most 120 times (60 s), then
    never again. Now: nothing is sent while the supervisor is not ready, however long; one ask
    each time it becomes ready, until one is answered with its RunList."""
    join, supervisor = _worker()
    join._forgotten("cut off")  # the home link's word, the supervisor restarting
    assert supervisor.asks_within(1, QUIET_S) == 0  # not ready: nothing sent, no timer
    for restart in range(1, 4):  # it becomes ready, dies with the ask in flight, restarts...
        join.runs_ready(True)
        assert supervisor.asks_within(restart, QUIET_S) == restart
        request = supervisor.asked[-1][0]
        assert "forgotten by its home tcp://127.0.0.1:9" in request.reason
        assert "cut off" in request.reason, request.reason
        join.runs_ready(False)
        supervisor.answer_ended()
        assert supervisor.asks_within(restart + 1, QUIET_S) == restart  # no ask till ready
    join.runs_ready(True)  # back, however long it took (the old retry gave up after 60 s)
    assert supervisor.asks_within(4, QUIET_S) == 4
    supervisor.answer_taken()
    join.runs_ready(False)
    join.runs_ready(True)  # answered: the stop is no longer pending
    assert supervisor.asks_within(5, QUIET_S) == 4
    join.stop()


def test_a_forgotten_workers_stop_goes_at_once_to_a_ready_run_supervisor_and_once_only() -> None:
    join, supervisor = _worker()
    join.runs_ready(True)
    join._forgotten("")
    assert supervisor.asks_within(1, QUIET_S) == 1
    assert "(`nodes forget`)" in supervisor.asked[0][0].reason  # no reason given: none said
    join.runs_ready(True)  # ready still: no new event, no second ask while one is in flight
    supervisor.answer_taken()
    assert supervisor.asks_within(2, QUIET_S) == 1
    join.stop()


def test_a_stop_refused_after_its_run_supervisor_became_ready_again_is_sent_again_at_once() -> None:
    """The supervisor died with the ask in flight and was ready again before the links said so:
    its ready event has passed, so the refusal itself sends the ask again."""
    join, supervisor = _worker()
    join.runs_ready(True)
    join._forgotten("cut off")
    assert supervisor.asks_within(1, QUIET_S) == 1
    join.runs_ready(False)
    join.runs_ready(True)  # the ask is in flight still: not sent twice
    assert supervisor.asks_within(2, QUIET_S) == 1
    supervisor.answer_ended()  # only now: the ready event came while it was in flight
    assert supervisor.asks_within(2, QUIET_S) == 2
    supervisor.answer_taken()
    join.stop()


def test_a_forgotten_workers_stop_is_never_sent_once_the_node_stops() -> None:
    join, supervisor = _worker()
    join._forgotten("cut off")
    join.stop()
    join.runs_ready(True)
    assert supervisor.asks_within(1, QUIET_S) == 0
    # In flight as the node stops: its refusal sends nothing either.
    join, supervisor = _worker()
    join.runs_ready(True)
    join._forgotten("cut off")
    assert supervisor.asks_within(1, QUIET_S) == 1
    join.runs_ready(False)
    join.runs_ready(True)
    join.stop()
    supervisor.answer_ended()
    assert supervisor.asks_within(2, QUIET_S) == 1
