"""A call's timeout holds while its request is being sent, in both clients.

A client DEALER queues at most SNDHWM requests (10,000, client/channel.py) that its peer has not
read. Calls that time out leave their frames queued, so an owner that stops reading (stopped,
swapped out, stuck in a long lock) fills the queue, and the send of the next call used to block
until the owner read again, whatever that call's timeout (even 0): one thread making calls with
short timeouts hung for good. Now the send waits for room until the call's deadline at most, and
the call raises NodeTimeout (reason `not_sent`): nothing was sent, nothing applied.

The owner is stopped with SIGSTOP (and always continued in a `finally`); the filling runs where
a hang is bounded (a thread joined with a timeout; `asyncio.wait_for`). Real node, real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

from subagents_node import AsyncClient
from subagents_node.client.client import Client
from subagents_node.messages.capacity import CapacitySnapshot, Snapshot
from subagents_node.messages.errors import NodeTimeout
from tests.support.nodes import NodeProcess
from tests.support.runs import stop_process

#: More calls than any send queue and socket buffer hold: one of them must find it full.
MOST_CALLS = 40_000
#: The timeout of the call made once the queue is full: it must end about then, not later.
BOUNDED_S = 0.5
SNAPSHOT = Snapshot(session_id="s", limit=1)


def _owner_pid(client: Client, name: str) -> int:
    [pid] = [actor.pid for actor in client.status().actors if actor.name == name]
    assert pid is not None
    return pid


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """The process stops reading anything (SIGSTOP) for the block; continued after it."""
    stop_process(pid)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _not_sent(err: NodeTimeout) -> bool:
    return err.details.get("reason") == "not_sent"


def test_a_call_to_an_owner_that_stopped_reading_times_out_in_its_send_not_when_it_reads(
    node: NodeProcess,
) -> None:
    client = node.client(timeout=10)
    pid = _owner_pid(client, "capacity")
    stop = threading.Event()
    seen: list[tuple[int, NodeTimeout, float]] = []  # calls made, then the bounded call

    def fill_then_call() -> None:
        calls = 0
        while calls < MOST_CALLS and not stop.is_set():
            calls += 1
            try:
                client.ask(SNAPSHOT, CapacitySnapshot, timeout=0)
            except NodeTimeout as err:
                if _not_sent(err):
                    break
        began = time.monotonic()
        try:
            client.ask(SNAPSHOT, CapacitySnapshot, timeout=BOUNDED_S)
        except NodeTimeout as err:
            seen.append((calls, err, time.monotonic() - began))

    caller = threading.Thread(target=fill_then_call, daemon=True)
    with _stopped(pid):
        caller.start()
        caller.join(30)
        stop.set()  # a caller blocked in its send goes on once its owner runs again: stop it
        blocked = caller.is_alive()
    caller.join(30)
    assert not blocked, "a call blocked in its send until the owner read again"
    [(calls, err, took)] = seen
    assert calls < MOST_CALLS, "no call ever found the send queue full"
    assert _not_sent(err), err.details
    assert "nothing was sent" in err.message and "\n" not in err.message
    assert took < BOUNDED_S + 1.0, f"the call with timeout {BOUNDED_S} s took {took:.2f} s"
    # The owner reads again: the client goes on, each reply to its own call.
    assert client.ask(SNAPSHOT, CapacitySnapshot, timeout=30) == CapacitySnapshot(used=0, limit=1)
    assert client.ping().pid == node.pid


def test_an_async_call_to_an_owner_that_stopped_reading_times_out_in_its_send(
    node: NodeProcess,
) -> None:
    pid = _owner_pid(node.client(), "capacity")

    async def fill_then_call(client: AsyncClient) -> tuple[int, NodeTimeout, float]:
        calls = 0
        while calls < MOST_CALLS:
            calls += 1
            try:
                await client.ask(SNAPSHOT, CapacitySnapshot, timeout=0)
            except NodeTimeout as err:
                if _not_sent(err):
                    break
        began = time.monotonic()
        try:
            await client.ask(SNAPSHOT, CapacitySnapshot, timeout=BOUNDED_S)
        except NodeTimeout as err:
            return calls, err, time.monotonic() - began
        raise AssertionError("a stopped owner answered")

    async def go() -> None:
        async with AsyncClient(node.address, timeout=10) as client:
            await client.ping()
            with _stopped(pid):
                try:
                    calls, err, took = await asyncio.wait_for(fill_then_call(client), 30)
                except TimeoutError:
                    raise AssertionError("a call waited in its send past its timeout") from None
            assert calls < MOST_CALLS, "no call ever found the send queue full"
            assert _not_sent(err), err.details
            assert took < BOUNDED_S + 1.0, f"the call with timeout {BOUNDED_S} s took {took:.2f}"
            assert client.transport.outstanding == 0
            answer = await client.ask(SNAPSHOT, CapacitySnapshot, timeout=30)
            assert answer == CapacitySnapshot(used=0, limit=1)

    asyncio.run(go())
