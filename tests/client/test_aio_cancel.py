"""Cancelling an `AsyncClient` call always cancels it, whenever the cancel lands: even in the
instant its reply has arrived but its coroutine has not yet resumed. Python 3.11's
`asyncio.wait_for` returns the finished result there and swallows the cancel, so a
`runs.wait` cancelled at that moment (by `task.cancel()`, `asyncio.wait_for`, a TaskGroup)
went on following the run to its end. Real node, real sockets; the cancel is timed
deterministically by a callback on the call's own reply future (no sleeps)."""

from __future__ import annotations

import asyncio

from subagents_node import AsyncClient, LaunchContext
from tests.support.nodes import REPO, NodeProcess

AGENTS = REPO / "examples" / "agents"


async def _cancel_when_answered(client: AsyncClient, task: asyncio.Task[object]) -> None:
    """Cancel `task` from the callback that sees its waiting call's reply arrive: after the
    reply is there, before the task resumes."""
    while client.transport.outstanding == 0:  # sent, and waiting for its reply
        await asyncio.sleep(0)
    (reply,) = client.transport._waiting.values()  # the call's own future: white box, no mock
    reply.add_done_callback(lambda _: task.cancel())


def test_a_call_cancelled_as_its_reply_arrives_raises_cancelled_and_the_client_goes_on(
    node: NodeProcess,
) -> None:
    async def go() -> None:
        async with AsyncClient(node.address) as client:
            await client.ping()
            for _ in range(5):
                call = asyncio.ensure_future(client.ping())
                await _cancel_when_answered(client, call)
                done, _ = await asyncio.wait([call], timeout=10)
                assert call in done and call.cancelled(), "the cancel was swallowed"
                assert client.transport.outstanding == 0
            assert (await client.ping()).pid == node.pid

    asyncio.run(go())


def test_r_run_3_a_run_wait_cancelled_as_a_watch_answers_ends_at_once_not_with_the_run(
    node: NodeProcess,
) -> None:
    ctx = LaunchContext.from_environment(cwd=REPO, agents_dirs=[AGENTS], session_id="aio-cancel")
    launch = ctx.single("sleeper", "seconds=60", background=True, timeout_ms=None)

    async def go() -> None:
        async with AsyncClient(node.address) as client:
            run = await client.runs.launch(launch)
            try:
                # Its first watch answers at once (the run's first events are there).
                waiting = asyncio.ensure_future(client.runs.wait(run.run_id))
                await _cancel_when_answered(client, waiting)
                done, _ = await asyncio.wait([waiting], timeout=15)
                assert waiting in done and waiting.cancelled(), "the wait went on"
                assert client.transport.outstanding == 0
            finally:
                await client.runs.stop(run.run_id)
            assert (await client.runs.wait(run.run_id, timeout=30)).state == "stopped"

    asyncio.run(go())
