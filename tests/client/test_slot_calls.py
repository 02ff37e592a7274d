"""A capacity acquire cut short by its caller gives its slot back; one that timed out is asked
again under its id (R-CAP-8..17; client/slotcalls.py).

A `capacity.acquire` cancelled after its send (`asyncio.wait_for` that ran out, a cancelled
task, Ctrl-C in a blocking call) took its slot all the same, and nobody could name it: it stayed
held until its TTL (60 s by default), and a session with a limit of 1 refused every acquire
meanwhile. One that timed out raised `NodeTimeout` while the slot it took stayed held the same
way. The client now gives every acquire an id of its own: a timed-out acquire is sent again
under it (the ledger answers the slot the first send took), and a cut-short one is given back
(sent again under it, and the slot it answers rolled back).

Real node process, real sockets: the capacity owner is stopped (SIGSTOP) so that the acquire is
in flight when it is cut short or times out, and continued when the test says so.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from subagents_node import AsyncClient
from subagents_node.client.client import Client, connect
from subagents_node.client.slotcalls import SlotCall
from subagents_node.messages.capacity import Acquire, AcquireResult, Rollback
from subagents_node.messages.errors import BadRequest, NodeTimeout
from tests.support.nodes import NodeProcess
from tests.support.runs import stop_process

SESSION = "slot-calls"
LIMIT = 1


def owner_pid(client: Client, name: str = "capacity") -> int:
    [pid] = [a.pid for a in client.status().actors if a.name == name]
    assert pid is not None
    return pid


def used(client: Client) -> int:
    return client.capacity.snapshot(SESSION, LIMIT).used


@contextmanager
def interrupted_after(seconds: float, owner: int) -> Iterator[None]:
    """Ctrl-C (KeyboardInterrupt) in this thread after `seconds`; the stopped `owner` is
    continued first, so that what it was sent is answered, too late for the interrupted call."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        os.kill(owner, signal.SIGCONT)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.kill(owner, signal.SIGCONT)


def test_an_acquire_interrupted_in_flight_gives_its_slot_back_at_once(node: NodeProcess) -> None:
    """Before, the slot the interrupted acquire took stayed held for its TTL: the session's
    only slot, refused to every other run for 60 s."""
    with connect(node.address, timeout=20) as client:
        owner = owner_pid(client)
        assert used(client) == 0  # connected to the owner before it is stopped
        stop_process(owner)
        with pytest.raises(KeyboardInterrupt), interrupted_after(0.3, owner):
            client.capacity.acquire(SESSION, LIMIT, "interrupted")
        assert used(client) == 0
        handle = client.capacity.acquire(SESSION, LIMIT, "next")
        assert handle is not None and handle.run_id == "next"
        assert handle.rollback()


def test_an_async_acquire_cancelled_in_flight_gives_its_slot_back(node: NodeProcess) -> None:
    """`asyncio.wait_for` runs out while the acquire waits for its answer: the cancelled call
    gives back the slot the owner takes once it is continued."""
    with connect(node.address, timeout=20) as sync:
        owner = owner_pid(sync)

        async def go() -> None:
            async with AsyncClient(node.address, timeout=20) as client:
                # Connected to the owner first: a connection whose handshake the stopped owner
                # never finished would drop the acquire unsent.
                assert (await client.capacity.snapshot(SESSION, LIMIT)).used == 0
                stop_process(owner)
                loop = asyncio.get_running_loop()
                loop.call_later(0.5, os.kill, owner, signal.SIGCONT)
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(client.capacity.acquire(SESSION, LIMIT, "cut"), 0.2)

        try:
            asyncio.run(go())
        finally:
            os.kill(owner, signal.SIGCONT)
        assert used(sync) == 0


def test_an_acquire_that_timed_out_is_asked_again_under_its_id_and_answered_with_its_slot(
    node: NodeProcess,
) -> None:
    """Before, the caller got `NodeTimeout` while the slot its acquire took stayed held."""
    with connect(node.address, timeout=1.0) as client:
        owner = owner_pid(client)
        assert used(client) == 0  # connected to the owner before it is stopped
        stop_process(owner)
        later = threading.Timer(1.4, os.kill, (owner, signal.SIGCONT))
        later.start()
        try:
            handle = client.capacity.acquire(SESSION, LIMIT, "slow")
        finally:
            later.cancel()
            os.kill(owner, signal.SIGCONT)
        assert handle is not None and handle.run_id == "slow"
        assert used(client) == 1  # one slot: the second send answered the first one's
        assert handle.rollback()
        assert used(client) == 0


def test_a_reserve_interrupted_in_flight_is_aborted_at_once(node: NodeProcess) -> None:
    """Before, the interrupted reservation's claims counted against the run tree's budget
    until its `ttl_s` ran out."""
    with connect(node.address, timeout=20) as client:
        budget = client.fanout.create("slot-calls-root", 4)
        owner = owner_pid(client, "fanout")
        assert client.fanout.snapshot(budget).used == 0  # connected before it is stopped
        stop_process(owner)
        with pytest.raises(KeyboardInterrupt), interrupted_after(0.3, owner):
            client.fanout.reserve(budget, ["a", "b"], ttl_s=600)
        assert client.fanout.snapshot(budget).used == 0
        reservation = client.fanout.reserve(budget, ["c"], ttl_s=600)
        assert reservation.commit().used == 1


# -- the plans, without a node: what is sent after which answer --------------------------------


FIELDS = {"session_id": SESSION, "limit": LIMIT, "run_id": "r"}


def older_refusal() -> BadRequest:
    """What a node that knows no `acquire_id` answers an acquire that carries one."""
    return BadRequest(
        "invalid capacity.acquire request: acquire_id: Extra inputs are not permitted",
        reason="schema",
        field="acquire_id",
    )


def test_an_acquire_id_refused_by_an_older_node_is_dropped_and_the_acquire_sent_once_more() -> None:
    call = SlotCall(Acquire, FIELDS, None)
    plan = call.plan()
    first = next(plan)
    assert isinstance(first.request, Acquire) and first.request.acquire_id is not None
    again = plan.throw(older_refusal())
    assert isinstance(again.request, Acquire) and again.request.acquire_id is None
    # Sent without an id, the call has nothing to give back by.
    assert list(call.give_back_plan()) == []


def test_an_acquire_id_the_caller_chose_is_never_dropped_nor_given_back() -> None:
    call = SlotCall(Acquire, FIELDS, "mine")
    plan = call.plan()
    assert next(plan).request.acquire_id == "mine"  # type: ignore[attr-defined]
    with pytest.raises(BadRequest):
        plan.throw(older_refusal())
    assert list(call.give_back_plan()) == []


def test_a_give_back_rolls_back_the_slot_its_acquire_answers() -> None:
    call = SlotCall(Acquire, FIELDS, None)
    give_back = call.give_back_plan()
    again = next(give_back)
    assert again.request.acquire_id == call.call_id  # type: ignore[attr-defined]
    taken = AcquireResult.model_validate(
        {
            "handle": {
                "session_id": SESSION,
                "slot": 0,
                "token": "t",
                "run_id": "r",
                "generation": 1,
                "kind": "runner",
            },
            "snapshot": {"used": 1, "limit": LIMIT},
        }
    )
    rollback = give_back.send(taken)
    assert isinstance(rollback.request, Rollback) and rollback.request.handle == taken.handle


def test_a_second_timeout_is_raised() -> None:
    plan = SlotCall(Acquire, FIELDS, None).plan()
    first = next(plan)
    again = plan.throw(NodeTimeout("no answer", address="", timeout_s=1.0))
    assert again.request == first.request
    with pytest.raises(NodeTimeout):
        plan.throw(NodeTimeout("no answer", address="", timeout_s=1.0))
