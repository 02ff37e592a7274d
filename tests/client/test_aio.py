"""`subagents_node.AsyncClient` against real node processes: concurrency from one event loop,
cancellation safety (a cancelled call's late reply goes to nobody), the same typed results
and errors as the sync `Client`, and runs followed without blocking the loop. Its multi-host
views (`on`, `hosts`) run against a real home and workers (tests/support/fleet.py), on
loopback and on one network namespace per node, as the sync client's do."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

import subagents_node
from subagents_node import AsyncClient, LaunchContext
from subagents_node.client.aio_hosts import AsyncHosts
from subagents_node.client.hosts import HostRuns
from subagents_node.messages.base import Ack
from subagents_node.messages.errors import (
    BadRequest,
    CapacityExhausted,
    FanoutLimitExceeded,
    NodeNotRunning,
    NodeTimeout,
    OwnerUnavailable,
    RunNotFound,
)
from subagents_node.messages.fanout import FanoutDescriptor
from subagents_node.messages.node import DebugSleep
from subagents_node.messages.session import GrantResult
from tests.support.fleet import PLACES, Fleet, fleet_on
from tests.support.nodes import REPO, NodeProcess
from tests.support.runs import stop_process, wait_until

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


def test_r_fan_13_an_async_claim_sent_again_with_its_claim_id_is_charged_once_even_when_full(
    node: NodeProcess,
) -> None:
    """As with the sync client: the batch sent again with its id claims nothing more and
    answers the budget as it stands, though the budget is full; a new batch is still refused
    (R-FAN-16), and the id used again with other paths is BadRequest and changes nothing."""

    async def go() -> None:
        async with AsyncClient(node.address) as client:
            budget = await client.fanout.create(root_run_id="aio-claim-id", limit=2)
            admission = uuid.uuid4().hex
            first = await client.fanout.claim(budget, ["w[a]", "w[b]"], claim_id=admission)
            assert (first.used, first.remaining) == (2, 0)
            again = await client.fanout.claim(budget, ["w[a]", "w[b]"], claim_id=admission)
            assert again == first
            with pytest.raises(FanoutLimitExceeded):
                await client.fanout.claim(budget, ["w[c]"], claim_id=uuid.uuid4().hex)
            with pytest.raises(BadRequest, match=f"claim id {admission} was used for another"):
                await client.fanout.claim(budget, ["w[a]"], claim_id=admission)
            assert (await client.fanout.snapshot(budget)).used == 2

    asyncio.run(go())


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


# -- multi-host: on() and hosts -------------------------------------------------------------------

WORKERS = ("w1", "w2")
#: Workers a test stops or silences (it adds them itself).
SPARE = ("wd", "ws", "wt")


@pytest.fixture(scope="module", params=PLACES)
def crew(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """A home and two workers, on loopback or each in its own network namespace."""
    with fleet_on(request.param, WORKERS, SPARE) as started:
        yield started


def _up(crew: Fleet, *names: str) -> None:
    wait_until(lambda: all(crew.nodes()[n].state == "up" for n in names), what=f"{names} up")


def _parts(parts: list[HostRuns]) -> dict[str, HostRuns]:
    return {part.host: part for part in parts}


@pytest.mark.slow
def test_a_run_placed_with_on_a_worker_is_listed_and_found_by_hosts_labelled_with_that_host(
    crew: Fleet,
) -> None:
    session = f"aio-mh-{uuid.uuid4().hex[:8]}"
    ctx = LaunchContext.from_environment(cwd=REPO, agents_dirs=[AGENTS], session_id=session)
    launch = ctx.single("sleeper", "seconds=30", background=True, timeout_ms=None)
    _up(crew, *WORKERS)

    async def go() -> list[HostRuns]:
        async with AsyncClient(crew.home.address, timeout=20) as client:
            async with client.on("w2") as w2:
                placed = await w2.runs.launch(launch)
            # The worker itself holds it: the home carried the launch there.
            assert crew.client(crew.workers["w2"]).runs.show(placed.run_id).state == "running"

            listing = await client.hosts.listing()
            assert listing is not None and {"home", *WORKERS} <= {n.name for n in listing.nodes}
            parts = _parts(await client.hosts.runs(session))
            assert [(r.run_id, r.host) for r in parts["w2"].runs] == [(placed.run_id, "w2")]
            assert parts["w1"].runs == [] and parts["home"].runs == []
            assert all(part.error == "" for part in parts.values() if part.host in WORKERS)

            found_on, found = await client.hosts.find(placed.run_id[:12])
            assert (found.run_id, found.host) == (placed.run_id, "w2")
            assert found_on is client.hosts.on("w2")  # the client to act on it with
            stopped = await found_on.runs.stop(placed.run_id)
            assert stopped.run_id == placed.run_id
            with pytest.raises(RunNotFound, match="no run 'no-such-run' on any host of this home"):
                await client.hosts.find("no-such-run")
            return await client.hosts.runs(session)

    listed = asyncio.run(go())
    synced = crew.client(crew.home).hosts.runs(session)  # the sync client's view is the same
    assert [(p.host, [r.run_id for r in p.runs]) for p in synced] == [
        (p.host, [r.run_id for r in p.runs]) for p in listed
    ]


@pytest.mark.slow
def test_workers_that_do_not_answer_are_reported_after_one_per_host_timeout_asked_at_once(
    crew: Fleet,
) -> None:
    """Two workers silenced (SIGSTOP: the home still lists them `up` until their heartbeats
    are missed) are asked concurrently: the view answers after about one per-host timeout,
    not two, each reported with why, and the workers that answer are listed."""
    silent = [crew.workers.get(n) or crew.add_worker(n) for n in ("ws", "wt")]
    _up(crew, *WORKERS, "ws", "wt")
    timeout_s = 1.0

    async def go() -> tuple[float, dict[str, HostRuns], str]:
        async with AsyncClient(crew.home.address, timeout=20) as client:
            hosts = AsyncHosts(client, timeout_s=timeout_s)
            try:
                for node in silent:
                    stop_process(node.pid)
                began = time.monotonic()
                parts = _parts(await hosts.runs())
                elapsed = time.monotonic() - began
                with pytest.raises(RunNotFound) as missing:
                    await hosts.find("no-such-run")
            finally:
                for node in silent:
                    os.kill(node.pid, signal.SIGCONT)
                await hosts.aclose()
            return elapsed, parts, missing.value.message

    elapsed, parts, missing = asyncio.run(go())
    for name in ("ws", "wt"):
        assert parts[name].runs == [] and parts[name].error, parts[name]
        assert name in missing
    assert all(parts[name].error == "" for name in WORKERS)
    assert elapsed < 2 * timeout_s, elapsed  # asked at once, each bounded by its own timeout


@pytest.mark.slow
def test_a_worker_that_is_down_is_reported_by_hosts_and_refused_at_once_through_on(
    crew: Fleet,
) -> None:
    down = crew.workers.get("wd") or crew.add_worker("wd")
    _up(crew, "wd")
    code, _, err = crew.cli(down, "stop")
    assert code == 0, err
    wait_until(lambda: crew.nodes()["wd"].state == "unreachable", what="wd unreachable")

    async def go() -> None:
        async with AsyncClient(crew.home.address, timeout=20) as client:
            parts = _parts(await client.hosts.runs())
            assert parts["wd"] == HostRuns("wd", "unreachable", [], "unreachable: not asked")
            with pytest.raises(RunNotFound) as missing:
                await client.hosts.find("no-such-run")
            assert "wd (unreachable)" in missing.value.details["hosts"]
            began = time.monotonic()
            async with client.on("wd") as wd:
                with pytest.raises(OwnerUnavailable) as refused:
                    await wd.ping()
            assert refused.value.details["reason"] == "host_unreachable"
            assert time.monotonic() - began < 5.0  # at once, not after a timeout

    asyncio.run(go())


def test_on_from_a_node_that_is_no_home_is_refused_with_bad_request_not_home_as_sync(
    node: NodeProcess,
) -> None:
    async def go() -> None:
        async with AsyncClient(node.address) as client:
            async with client.on("w2") as elsewhere:
                with pytest.raises(BadRequest) as refused:
                    await elsewhere.runs.list(limit=1)
            assert refused.value.details["reason"] == "not_home"
            # Its views are the node's own: one host, named "".
            assert await client.hosts.listing() is None
            assert [(p.host, p.state, p.error) for p in await client.hosts.runs()] == [
                ("", "up", "")
            ]

    asyncio.run(go())
    with node.client() as sync, sync.on("w2") as elsewhere, pytest.raises(BadRequest) as refused:
        elsewhere.runs.list(limit=1)
    assert refused.value.details["reason"] == "not_home"


def test_hosts_runs_takes_session_id_as_runs_list_and_docs_api_say(node: NodeProcess) -> None:
    """docs/api.md: `hosts.runs(session_id=None, active_only=False, limit=50)`, the keyword
    `runs.list` uses too, for the sync and the async client alike."""
    with node.client() as sync:
        ctx = LaunchContext.from_environment(agents_dirs=[AGENTS], session_id="hosts-kw")
        launch = ctx.single("sleeper", "seconds=0", background=False, timeout_ms=None)
        run = sync.runs.launch(launch)
        sync.runs.wait(run.run_id, timeout=30)
        (part,) = sync.hosts.runs(session_id="hosts-kw", limit=5)
        assert [r.run_id for r in part.runs] == [run.run_id]
        assert sync.hosts.runs(session_id="no-such-session")[0].runs == []

    async def go() -> list[HostRuns]:
        async with AsyncClient(node.address) as client:
            return await client.hosts.runs(session_id="hosts-kw", limit=5)

    assert [r.run_id for r in asyncio.run(go())[0].runs] == [run.run_id]
