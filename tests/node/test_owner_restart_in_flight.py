"""Issue 11 item 2: kill -9 of an owner costs only its in-flight requests, and the client
resends those that are safe to resend.

A request in flight when its owner died is lost with it. The client sees the owner's socket
file replaced (the restarted owner binds a new one) as soon as a reply is late: a read-only or
idempotent request is sent again on a fresh connection and answered within its deadline; any
other is a NodeTimeout at once, worded as an unknown outcome, instead of a wait for the whole
timeout. So does a request in flight when the whole node is killed, its socket file left as
it was: the node's pid record names a dead process. Real node, real owner processes, real
sockets.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from subagents_node import AsyncClient
from subagents_node.client.channel import PEER_CHECK_S
from subagents_node.messages.base import Ack, resendable
from subagents_node.messages.capacity import (
    Acquire,
    MarkStarted,
    Rollback,
    SlotHandle,
    Snapshot,
    Transfer,
)
from subagents_node.messages.errors import NodeNotRunning, NodeTimeout, OwnerUnavailable
from subagents_node.messages.fanout import (
    ClaimPaths,
    CreateBudget,
    FanoutDescriptor,
    ReadSnapshot,
    ValidateDescriptor,
)
from subagents_node.messages.node import DebugSleep, NodeStatus, Ping
from subagents_node.messages.session import SpawnReserve
from subagents_node.messages.supervisor import Launch, WatchAll
from subagents_node.node.node import Node
from tests.support.nodes import NodeProcess, free_tcp_port
from tests.support.runs import wait_until

pytestmark = pytest.mark.processes

#: Far longer than the client needs to notice the restart: a wait this long is the bug.
TIMEOUT_S = 30.0


def owner_pid(node: NodeProcess, name: str) -> int:
    return next(int(a.pid or 0) for a in node.status().actors if a.name == name)


def kill_and_wait_back(node: NodeProcess, name: str) -> None:
    before = owner_pid(node, name)
    os.kill(before, signal.SIGKILL)
    wait_until(
        lambda: (p := owner_pid(node, name)) not in (0, before) and p,
        timeout=15,
        what=f"{name} restarted",
    )


def test_only_read_only_or_idempotent_requests_are_resendable() -> None:
    assert all(resendable(r) for r in (Ping, NodeStatus, Snapshot, ReadSnapshot))
    assert resendable(ValidateDescriptor) and resendable(MarkStarted)
    assert not any(resendable(r) for r in (ClaimPaths, Launch, DebugSleep))


def test_a_write_under_an_id_that_counts_it_once_may_be_sent_again_between_owners() -> None:
    """What a pipeline sends again after its owner went with it in flight (actors/pipelines.py):
    the writes whose id makes a second send count nothing more, and no other."""
    budget = FanoutDescriptor(budget_id="b", limit=4, root_run_id="r")
    assert ClaimPaths(descriptor=budget, paths=["a"], claim_id="c1").resendable_as_sent()
    assert not ClaimPaths(descriptor=budget, paths=["a"]).resendable_as_sent()
    assert ClaimPaths(descriptor=budget, paths=[]).resendable_as_sent()  # writes nothing
    assert SpawnReserve(session_id="s", requested=1, reservation_id="r1").resendable_as_sent()
    assert not SpawnReserve(session_id="s", requested=1).resendable_as_sent()
    take = Acquire(session_id="s", limit=1, run_id="r", acquire_id="a1")
    assert take.resendable_as_sent()
    assert not take.model_copy(update={"acquire_id": None}).resendable_as_sent()
    move = Transfer(session_id="s", limit=1, source_run_id="a", run_id="b", transfer_id="t")
    assert move.resendable_as_sent()
    assert not move.model_copy(update={"transfer_id": None}).resendable_as_sent()
    assert CreateBudget(root_run_id="r", limit=4).resendable_as_sent()  # a second, empty one
    handle = SlotHandle(session_id="s", slot=0, token="t", run_id="r", generation=0, kind="runner")
    assert Rollback(handle=handle).resendable_as_sent()  # fenced by its handle
    assert Ping().resendable_as_sent() and not DebugSleep(ms=1).resendable_as_sent()


def test_a_read_in_flight_when_its_owner_is_killed_is_resent_and_answered(
    node: NodeProcess,
) -> None:
    transport = node.transport()
    client = node.client(timeout=TIMEOUT_S)
    budget = client.fanout.create(root_run_id="resend", limit=10)
    client.fanout.claim(budget, ["a", "b"])
    # The owner is busy with a sleep, so the snapshot queued behind it is in flight when the
    # owner is killed: it never reaches the handler of that process.
    busy = transport.submit(DebugSleep(ms=10_000), "fanout")  # asleep at the kill, loaded too
    read = transport.submit(ReadSnapshot(descriptor=budget))
    kill_and_wait_back(node, "fanout")
    started = time.monotonic()
    snapshot = read.result(timeout=TIMEOUT_S)
    assert snapshot == client.fanout.snapshot(budget)
    assert getattr(snapshot, "used", None) == 2
    assert read.resent >= 1
    assert time.monotonic() - started < TIMEOUT_S / 3
    with pytest.raises(NodeTimeout) as lost:
        busy.result(timeout=TIMEOUT_S)
    assert lost.value.details.get("reason") == "owner_restarted"


def test_a_write_in_flight_when_its_owner_is_killed_is_an_unknown_outcome_at_once(
    node: NodeProcess,
) -> None:
    transport = node.transport()
    client = node.client(timeout=TIMEOUT_S)
    budget = client.fanout.create(root_run_id="no-resend", limit=10)
    # Long enough that a loaded machine still kills the owner before the claim behind it runs.
    busy = transport.submit(DebugSleep(ms=10_000), "fanout")
    claim = transport.submit(ClaimPaths(descriptor=budget, paths=["x"]))
    kill_and_wait_back(node, "fanout")
    started = time.monotonic()
    with pytest.raises(NodeTimeout) as lost:
        claim.result(timeout=TIMEOUT_S)
    waited = time.monotonic() - started
    assert lost.value.details.get("reason") == "owner_restarted"
    assert "outcome is unknown" in lost.value.message
    assert waited < PEER_CHECK_S + 5, f"waited {waited:.1f} s for a reply that cannot come"
    assert claim.resent == 0, "a claim is never sent twice"
    # Applied at most once, which is why its outcome is unknown: it usually dies in the
    # killed owner's queue, but on a loaded host libzmq may not yet have written it to that
    # owner's connection, and then sends it on the one to the restarted owner (a connecting
    # socket keeps its queue across reconnects). The owner serves again either way.
    assert client.fanout.snapshot(budget).used in (0, 1)
    assert client.fanout.claim(budget, ["x"]).used == 1
    with pytest.raises(NodeTimeout):
        busy.result(timeout=TIMEOUT_S)


def test_after_an_owner_restart_the_next_request_goes_out_on_a_fresh_connection(
    node: NodeProcess,
) -> None:
    """No `reset()` needed: the client sees the new socket file before it writes."""
    client = node.client(timeout=5.0)
    budget = client.fanout.create(root_run_id="fresh", limit=100)
    assert client.fanout.claim(budget, ["before"]).used == 1
    kill_and_wait_back(node, "fanout")
    for i in range(20):  # each answered within its 5 s: none is written into the dead one
        assert client.fanout.claim(budget, [f"after-{i}"]).used == 2 + i


def test_the_async_client_resends_a_read_and_refuses_to_resend_a_write(
    node: NodeProcess,
) -> None:
    client = node.client(timeout=TIMEOUT_S)
    budget = client.fanout.create(root_run_id="aio-resend", limit=10)
    client.fanout.claim(budget, ["a"])

    async def go() -> tuple[object, BaseException | None, float]:
        async with AsyncClient(node.address, timeout=TIMEOUT_S) as aio:
            busy = asyncio.ensure_future(aio.ask(DebugSleep(ms=10_000), Ack, target="fanout"))
            await asyncio.sleep(0)  # let the sleep go out first
            read = asyncio.ensure_future(aio.fanout.snapshot(budget))
            claim = asyncio.ensure_future(aio.fanout.claim(budget, ["b"]))
            await asyncio.sleep(0.2)
            await asyncio.to_thread(kill_and_wait_back, node, "fanout")
            started = time.monotonic()
            snapshot = await read
            lost = (await asyncio.gather(claim, return_exceptions=True))[0]
            waited = time.monotonic() - started
            await asyncio.gather(busy, return_exceptions=True)
            return snapshot, lost if isinstance(lost, BaseException) else None, waited

    snapshot, lost, waited = asyncio.run(go())
    assert getattr(snapshot, "used", None) == 1
    assert isinstance(lost, NodeTimeout) and lost.details.get("reason") == "owner_restarted"
    assert waited < TIMEOUT_S / 3
    # The lost claim applied at most once (see the sync test: libzmq may carry it over).
    assert client.fanout.snapshot(budget).used in (1, 2)


#: A reply the client waits for this long after its node was killed was waited for in vain:
#: it looks at the node's pid record once a reply is a second late.
NOTICED_S = PEER_CHECK_S + 5


def test_a_read_in_flight_when_its_node_is_killed_is_told_no_node_runs_and_a_write_at_once(
    node: NodeProcess,
) -> None:
    """A node killed with -9 leaves its socket file and its pid record behind, the socket
    unchanged: a request in flight waited its whole timeout (a watch's long poll its wait on
    top) for a reply that could not come. A read loses nothing: it is told at once that no
    node runs (a foreground follow then takes the state dir over); a write may have been
    applied: an unknown outcome, at once."""
    transport = node.transport()
    watch = transport.submit(WatchAll(after_seq=1 << 40, wait_s=TIMEOUT_S))
    busy = transport.submit(DebugSleep(ms=10_000), "capacity")  # still asleep at the kill
    node.kill()
    started = time.monotonic()
    with pytest.raises(NodeNotRunning, match="the node that served it is gone"):
        watch.result(timeout=TIMEOUT_S * 2)
    with pytest.raises(NodeTimeout) as lost:
        busy.result(timeout=TIMEOUT_S)
    waited = time.monotonic() - started
    assert lost.value.details.get("reason") == "node_gone"
    assert "outcome is unknown" in lost.value.message
    assert waited < NOTICED_S, f"waited {waited:.1f} s for replies that cannot come"


def test_the_async_client_tells_a_read_in_flight_when_its_node_is_killed_no_node_runs(
    node: NodeProcess,
) -> None:
    async def go() -> tuple[BaseException | None, float]:
        async with AsyncClient(node.address, timeout=TIMEOUT_S) as aio:
            watch = asyncio.ensure_future(aio.runs.watch_all(1 << 40, wait_s=TIMEOUT_S))
            await asyncio.sleep(0.2)  # the watch is out, waiting at the node
            await asyncio.to_thread(node.kill)
            started = time.monotonic()
            lost = (await asyncio.gather(watch, return_exceptions=True))[0]
            return lost if isinstance(lost, BaseException) else None, time.monotonic() - started

    lost, waited = asyncio.run(go())
    assert isinstance(lost, NodeNotRunning), lost
    assert waited < NOTICED_S, f"waited {waited:.1f} s for a reply that cannot come"


#: The node's own links wait this long for an owner (actors/links.py DEFAULT_TIMEOUT_S, 15 s):
#: a client that gives up sooner saw its request wait out that deadline.
FORWARDED_TIMEOUT_S = 5.0


def fanout_restarts(node: Node) -> int:
    return next(a.restarts for a in node.owner_statuses() if a.name == "fanout")


@pytest.mark.parametrize("via", ["inproc", "tcp"])
def test_a_request_the_node_carries_to_an_owner_killed_with_it_is_answered_at_once(
    tmp_path: Path, via: str
) -> None:
    """What reaches the node's own sockets for an owner (an embedded node's in-process client,
    through its forwarder; a tcp peer, through its gateway's relay) is lost when that owner's
    process dies with it in flight. The node reaps the process and tells those links at once:
    the caller is answered `unavailable` (the claim's outcome is unknown: it may have been
    recorded), not after the links' 15 s deadline. The fan-out owner dies here right after
    it recorded the claim, before its answer."""
    settings = {"fault_kill_points": ["owner:claim_recorded"]}
    tcp = {"ipc": False, "listen": [f"tcp://127.0.0.1:{free_tcp_port()}"]}
    with Node.embedded(
        tmp_path, faults=True, settings=settings, **(tcp if via == "tcp" else {})
    ) as node:
        client = node.client("zmq" if via == "tcp" else "inproc", timeout=FORWARDED_TIMEOUT_S)
        with client:
            budget = client.fanout.create(root_run_id="r", limit=4)
            with pytest.raises(
                OwnerUnavailable, match=r"fanout ended with fanout\.claim in flight"
            ):
                client.fanout.claim(budget, ["tasks[0]"], claim_id="c1")
            assert fanout_restarts(node) == 1
            # The next request goes over a fresh link, to the restarted owner.
            assert client.fanout.snapshot(budget).used == 1


def test_a_write_that_times_out_says_its_outcome_is_unknown_and_how_to_look(
    node: NodeProcess,
) -> None:
    """A write the node took but did not answer within the call's timeout (an owner busy, or
    stuck behind another owner it waits on: a `resume` whose slot transfer waits on a stopped
    capacity owner) was told "did not answer runs.resume in time (is it running?)", exit 4:
    nothing said it may have been applied, so a user sent it again (a second resume is a
    second run, an append sent twice queues its steps twice). It now says its outcome is
    unknown and how to look first; a read that times out is told as before."""
    transport = node.transport()
    client = node.client(timeout=TIMEOUT_S)
    budget = client.fanout.create(root_run_id="slow-claim", limit=10)
    busy = transport.submit(DebugSleep(ms=3_000), "fanout")
    claim = transport.submit(ClaimPaths(descriptor=budget, paths=["x"]))
    read = transport.submit(ReadSnapshot(descriptor=budget))
    with pytest.raises(NodeTimeout) as late:
        claim.result(timeout=0.5)
    assert "did not answer fanout.claim in time" in late.value.message
    assert "outcome is unknown (it may have been applied)" in late.value.message
    assert "subagents-node show RUN" in late.value.message
    with pytest.raises(NodeTimeout) as slow:
        read.result(timeout=0.1)
    assert "outcome" not in slow.value.message
    with pytest.raises(NodeTimeout):
        busy.result(timeout=0.1)
    wait_until(lambda: client.fanout.snapshot(budget).used == 1, what="the late claim applied")


def test_an_async_write_that_times_out_says_its_outcome_is_unknown(node: NodeProcess) -> None:
    async def go() -> None:
        async with AsyncClient(node.address) as client:
            with pytest.raises(NodeTimeout) as late:
                await client.ask(DebugSleep(ms=500), Ack, target="session", timeout=0.05)
            assert "outcome is unknown (it may have been applied)" in late.value.message

    asyncio.run(go())
