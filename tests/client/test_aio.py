"""`subagents_node.AsyncClient` against real node processes: concurrency from one event loop,
cancellation safety (a cancelled call's late reply goes to nobody), the same typed results
and errors as the sync `Client`, and runs followed without blocking the loop."""

from __future__ import annotations

import asyncio

import pytest

import subagents_node
from subagents_node import AsyncClient, LaunchContext
from subagents_node.messages.base import Ack
from subagents_node.messages.errors import (
    BadRequest,
    CapacityExhausted,
    FanoutLimitExceeded,
    NodeNotRunning,
    NodeTimeout,
    RunNotFound,
)
from subagents_node.messages.fanout import FanoutDescriptor
from subagents_node.messages.node import DebugSleep
from subagents_node.messages.session import GrantResult
from tests.support.nodes import REPO, NodeProcess

AGENTS = REPO / "examples" / "agents"


def test_async_client_is_exported_from_the_package() -> None:
    assert subagents_node.AsyncClient is AsyncClient
    assert "AsyncClient" in subagents_node.__all__


def test_r_fan_14_fifty_gathered_claims_from_one_loop_are_each_counted_once(
    node: NodeProcess,
) -> None:
    async def go() -> tuple[FanoutDescriptor, list[int], int, int]:
        async with AsyncClient(node.address) as client:
            budget = await client.fanout.create(root_run_id="aio-claims", limit=50)
            snaps = await asyncio.gather(
                *(client.fanout.claim(budget, [f"tasks[{i}]"]) for i in range(50))
            )
            with pytest.raises(FanoutLimitExceeded) as refused:
                await client.fanout.claim(budget, ["tasks[50]"])
            assert refused.value.rejection.path == "tasks[50]"
            final = await client.fanout.snapshot(budget)
            return budget, sorted(s.used for s in snaps), final.used, client.transport.outstanding

    budget, used_after_each, used, outstanding = asyncio.run(go())
    # Each claim saw its own count: the owner serialised them, none was lost or doubled.
    assert used_after_each == list(range(1, 51))
    assert used == 50
    assert outstanding == 0
    assert node.client().fanout.snapshot(budget).used == 50  # the sync client agrees


def test_a_cancelled_call_leaves_no_reply_behind_for_the_calls_after_it(
    node: NodeProcess,
) -> None:
    """A call the capacity owner answers late (debug.sleep) is cancelled while it waits; its
    Ack arrives while later calls wait for theirs. Each later call gets its own reply: the
    capacity snapshot queued behind the sleep, a ping, and a fan-out claim."""

    async def go() -> None:
        async with AsyncClient(node.address) as client:
            slow = client.ask(DebugSleep(ms=600), Ack, target="capacity", timeout=30)
            # wait_for cancels the call at its deadline: sent, its reply 0.5 s away.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(slow, 0.1)
            assert client.transport.outstanding == 0
            budget = await client.fanout.create(root_run_id="after-cancel", limit=5)
            snapshot, pong, claimed = await asyncio.gather(
                client.capacity.snapshot("s-cancel", limit=3),
                client.ping(),
                client.fanout.claim(budget, ["tasks[0]", "tasks[1]"]),
            )
            assert (snapshot.used, snapshot.limit) == (0, 3)
            assert pong.pid == node.pid
            assert claimed.used == 2
            # Twenty more rounds of mixed calls: every one answered with its own type.
            for round_ in range(20):
                snaps, limits = await asyncio.gather(
                    client.capacity.snapshot(f"s{round_}", limit=round_ + 1),
                    client.fanout.snapshot(budget),
                )
                assert snaps.limit == round_ + 1 and limits.limit == 5
            assert client.transport.outstanding == 0

    asyncio.run(go())


def test_a_call_that_times_out_raises_node_timeout_and_its_late_reply_is_dropped(
    node: NodeProcess,
) -> None:
    async def go() -> None:
        async with AsyncClient(node.address) as client:
            with pytest.raises(NodeTimeout, match=r"did not answer debug\.sleep in time"):
                await client.ask(DebugSleep(ms=500), Ack, target="session", timeout=0.05)
            status = await client.session.status("s-late")  # queued behind the sleep
            assert status.snapshot.session_id == "s-late"
            assert client.transport.outstanding == 0

    asyncio.run(go())


def test_r_cap_9_capacity_refusal_and_the_finally_rule_as_with_the_sync_client(
    node: NodeProcess,
) -> None:
    async def go() -> None:
        async with AsyncClient(node.address) as client:
            handle = await client.capacity.acquire(session_id="aio", limit=1, run_id="a")
            assert handle is not None
            async with handle:
                with pytest.raises(CapacityExhausted) as full:
                    await client.capacity.acquire(session_id="aio", limit=1, run_id="b")
                assert full.value.message == "Active async run capacity exhausted: 1/1 used."
            # R-ADM-3: the block ended without a start, so the slot was rolled back.
            assert (await client.capacity.snapshot("aio", limit=1)).used == 0

    asyncio.run(go())


def test_bad_arguments_raise_bad_request_before_anything_is_sent(node: NodeProcess) -> None:
    async def go() -> None:
        async with AsyncClient(node.address) as client:
            with pytest.raises(BadRequest):
                await client.capacity.acquire(session_id="", limit=1, run_id="a")
            with pytest.raises(BadRequest):
                await client.session.reserve("s", requested=-1)
            assert not client.transport._socks  # nothing ever connected

    asyncio.run(go())


def test_no_node_is_node_not_running(state_dir: object) -> None:
    async def go() -> None:
        async with AsyncClient(f"ipc://{state_dir}/node.sock", timeout=1) as client:
            with pytest.raises(NodeNotRunning):
                await client.ping()

    asyncio.run(go())


def test_r_run_3_a_run_is_launched_and_followed_while_the_loop_keeps_serving(
    node: NodeProcess,
) -> None:
    ctx = LaunchContext.from_environment(cwd=REPO, agents_dirs=[AGENTS], session_id="aio-runs")
    launch = ctx.single("sleeper", "seconds=0.3", background=True, timeout_ms=None)

    async def go() -> None:
        async with AsyncClient(node.address) as client:
            run = await client.runs.launch(launch)
            kinds: list[str] = []
            waiting = asyncio.ensure_future(
                client.runs.wait(run.run_id, timeout=30, on_event=lambda e, v: kinds.append(e.kind))
            )
            pings = 0
            while not waiting.done():  # the loop is free while the run is followed
                await client.ping()
                pings += 1
            final = await waiting
            assert final.state == "complete" and final.output.strip() == "slept 0.3"
            assert kinds[0] == "run.started" and kinds[-1] == "run.complete"
            assert pings > 1
            listed = await client.runs.list(session_id="aio-runs")
            assert [r.run_id for r in listed] == [run.run_id]
            with pytest.raises(RunNotFound):
                await client.runs.show("no-such-run")

    asyncio.run(go())


def test_importing_the_async_client_loads_no_node_code_pykka_sqlite_or_mcp() -> None:
    """What a child agent pays for an asyncio client: the client, its transport and schemas."""
    import subprocess
    import sys

    probe = (
        "import sys, subagents_node; subagents_node.AsyncClient('ipc:///nonexistent').runs;"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('subagents_node.node',"
        "'subagents_node.actors', 'subagents_node.mcp', 'pykka', 'sqlite3', 'mcp')))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [], out.stdout


def test_r_spn_6_a_confirmed_grant_is_two_requests_through_the_same_plan(
    node: NodeProcess,
) -> None:
    """The multi-request plan (preview, then the confirmed grant with the previewed basis) runs
    the same under the async driver; a declined preview changes nothing."""

    async def go() -> None:
        async with AsyncClient(node.address) as client:
            await client.session.open("g", configured_limit=4)
            await client.session.reserve("g", requested=3)
            previews: list[str] = []

            def approve(preview: GrantResult) -> bool:
                previews.append(preview.outcome)
                return True

            granted = await client.session.grant("g", 2, confirm=approve)
            assert previews == ["confirmation_required"]
            assert granted.outcome == "granted"
            declined = await client.session.grant("g", 1, confirm=lambda preview: False)
            assert declined.outcome == "cancelled"
            assert (await client.session.snapshot("g")).limit == 6

    asyncio.run(go())
    assert node.client().session.snapshot("g").limit == 6  # the sync client sees the same
