"""`capacity.rollback_acquire`: the grant an acquire made under its id, given back by a caller
that never learned its handle (R-CAP-4, R-CAP-15, R-CAP-17; actors/runs/owedslots.py).

A worker's launch whose acquire the home applied but whose answer was lost owes this rollback
until the home answers it (tests/node/test_multihost_lost_acquire.py). It must free that grant
and nothing else: a grant never made (the acquire was not applied) is a no-op, a later grant of
the same run under another id (a launch sent again under its launch id) is not touched, a
started slot never is, and a second copy (the outbox resends until answered) changes nothing.

An embedded node (real owner processes, real SQLite); nothing is mocked.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from subagents_node import Client, Node
from subagents_node.messages.capacity import RollbackAcquire, RollbackResult
from subagents_node.messages.errors import BadRequest
from tests.support.nodes import short_dir


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    directory = short_dir()
    try:
        with Node.embedded(state_dir=directory) as running:
            yield running.client()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def sid() -> str:
    return f"session-{uuid.uuid4().hex[:8]}"


def _given_up(client: Client, sid: str, run_id: str, acquire_id: str) -> bool:
    owed = RollbackAcquire(session_id=sid, run_id=run_id, acquire_id=acquire_id)
    return client.ask(owed, RollbackResult).rolled_back


def test_r_cap_15_an_acquire_given_up_under_its_id_frees_its_grant_once(
    client: Client, sid: str
) -> None:
    handle = client.capacity.acquire(session_id=sid, limit=1, run_id="a", acquire_id="acq-1")
    assert handle is not None and client.capacity.snapshot(sid, 1).used == 1
    assert _given_up(client, sid, "a", "acq-1")
    assert client.capacity.snapshot(sid, 1).used == 0
    # R-CAP-17: a second copy (the outbox resends until answered) changes nothing.
    assert not _given_up(client, sid, "a", "acq-1")
    # The slot is free for the session's next launch.
    assert client.capacity.acquire(session_id=sid, limit=1, run_id="b") is not None


def test_r_cap_15_an_acquire_never_applied_is_given_up_as_a_no_op(client: Client, sid: str) -> None:
    held = client.capacity.acquire(session_id=sid, limit=2, run_id="other", acquire_id="acq-o")
    assert held is not None
    assert not _given_up(client, sid, "a", "acq-1")
    assert client.capacity.snapshot(sid, 2).used == 1
    assert client.capacity.inspect("other", sid).relation == "current"


def test_r_cap_4_another_grant_of_the_same_run_is_not_given_up(client: Client, sid: str) -> None:
    """A launch sent again under its launch id keeps its run id and acquires under an id of
    its own: the first attempt's rollback, arriving late, must not free the second's grant."""
    second = client.capacity.acquire(session_id=sid, limit=1, run_id="a", acquire_id="acq-2")
    assert second is not None
    assert not _given_up(client, sid, "a", "acq-1")
    assert client.capacity.snapshot(sid, 1).used == 1
    assert client.capacity.inspect("a", sid).owner is not None


def test_r_cap_17_a_started_grant_is_never_given_up(client: Client, sid: str) -> None:
    """The same acquire sent again and answered (the same grant) is the run's once started:
    a rollback under its id that comes after the start leaves it held."""
    handle = client.capacity.acquire(session_id=sid, limit=1, run_id="a", acquire_id="acq-1")
    again = client.capacity.acquire(session_id=sid, limit=1, run_id="a", acquire_id="acq-1")
    assert handle is not None and again is not None and again.wire == handle.wire
    again.mark_started(runner_id="runner-a", pid=4242)
    assert not _given_up(client, sid, "a", "acq-1")
    found = client.capacity.inspect("a", sid)
    assert found.owner is not None and found.owner.started
    assert client.capacity.snapshot(sid, 1).used == 1


def test_r_cap_11_an_acquire_that_arrives_after_it_was_given_up_takes_no_slot(
    client: Client, sid: str
) -> None:
    """The acquire may still be on its way when its rollback is applied (sent on a connection
    the worker dropped when it lost its home, which the kernel retransmits once a partition
    heals, while the rollback went over the next connection). Before, it then took a slot
    that no run would ever hold, until its TTL; now it is refused and takes nothing, and so is
    a second copy of one that was applied and given up."""
    assert not _given_up(client, sid, "a", "acq-late")
    with pytest.raises(BadRequest) as late:
        client.capacity.acquire(session_id=sid, limit=1, run_id="a", acquire_id="acq-late")
    assert late.value.details["reason"] == "acquire_given_up"
    assert client.capacity.snapshot(sid, 1).used == 0
    handle = client.capacity.acquire(session_id=sid, limit=1, run_id="b", acquire_id="acq-b")
    assert handle is not None and _given_up(client, sid, "b", "acq-b")
    with pytest.raises(BadRequest):
        client.capacity.acquire(session_id=sid, limit=1, run_id="b", acquire_id="acq-b")
    assert client.capacity.snapshot(sid, 1).used == 0
    # The run may acquire again under a new id (a launch sent again under its launch id).
    assert client.capacity.acquire(session_id=sid, limit=1, run_id="a", acquire_id="acq-2")
