"""A worker's clean stop leaves its membership (DESIGN §1 "Multi-host"): the quick stop + start
of an upgrade joins again at once instead of being refused as a live member until the heartbeat
timeout has passed, and only the live process of a worker can make it leave.

The home's heartbeat timeout here is 30 s, far longer than a stop and a start take, so a start
that joins at once proves the leave and not the timeout. The nodes are real processes on
loopback, started and stopped through the real CLI; the stale leave is sent over the home's
tcp socket with the worker's own key.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from subagents_node.client.client import Client
from subagents_node.client.keys import CLIENT_KEY, ClientCredentials, keys_dir, read_keypair
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Ack
from subagents_node.messages.errors import BadRequest, MembershipRefused
from subagents_node.messages.members import MemberLeave
from tests.support.fleet import Fleet, fleet
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow

#: Far longer than a worker's stop and start: a join within it is no timeout's doing.
HEARTBEAT_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def slow_crew() -> Iterator[Fleet]:
    with fleet(("w1",), heartbeat=(0.2, HEARTBEAT_TIMEOUT_S)) as started:
        yield started


def _w1_up(crew: Fleet) -> int:
    """w1's generation, once the home sees it up."""
    wait_until(lambda: crew.nodes()["w1"].state == "up", what="w1 up")
    return crew.nodes()["w1"].generation


def test_a_worker_stopped_cleanly_joins_again_at_once_when_it_starts(slow_crew: Fleet) -> None:
    crew = slow_crew
    worker = crew.workers["w1"]
    generation = _w1_up(crew)

    code, _, err = crew.cli(worker, "stop")
    assert code == 0, err
    # The home took the leave: w1 is not a live member any more, with no timeout passed.
    assert crew.nodes()["w1"].state == "unreachable", "the home still counts w1 as live"

    worker.start()  # asserts the start succeeded (it was refused as a live member before)
    assert _w1_up(crew) == generation + 1
    assert "worker w1 left (a clean stop)" in crew.home.log()


def test_a_leave_from_a_process_that_is_not_the_live_one_is_refused_and_changes_nothing(
    slow_crew: Fleet,
) -> None:
    crew = slow_crew
    generation = _w1_up(crew)
    pair = read_keypair(keys_dir(crew.workers["w1"].state_dir) / CLIENT_KEY)
    keys = ClientCredentials(pair, crew.home_key)
    stale = (
        (MemberLeave(name="w1", instance="an-old-process", generation=generation), "fenced"),
        (MemberLeave(name="w1", instance="x", generation=generation - 1), "fenced"),
        (MemberLeave(name="w9", instance="x", generation=generation), "name_mismatch"),
    )
    with Client(ZmqTransport(crew.endpoint, credentials=keys)) as client:
        for request, reason in stale:
            with pytest.raises(MembershipRefused) as refused:
                client.ask(request, Ack)
            assert refused.value.details["reason"] == reason
    with pytest.raises(BadRequest) as local:  # it names a tcp peer: never served on ipc
        crew.client(crew.home).ask(MemberLeave(name="w1", instance="x", generation=1), Ack)
    assert local.value.details["reason"] == "peer_only"
    assert crew.nodes()["w1"].state == "up" and crew.nodes()["w1"].generation == generation
