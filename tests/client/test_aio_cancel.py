"""An `AsyncClient` and its event loops.

Cancelling a call always cancels it, whenever the cancel lands: even in the instant its reply
has arrived but its coroutine has not yet resumed. Python 3.11's `asyncio.wait_for` returns
the finished result there and swallows the cancel, so a `runs.wait` cancelled at that moment
(by `task.cancel()`, `asyncio.wait_for`, a TaskGroup) went on following the run to its end.
The cancel is timed deterministically by a callback on the call's own reply future.

A client belongs to one running loop at a time: another running loop is refused at once; a
new loop after the first one closed carries on. Real node, real sockets, no sleeps.
"""

from __future__ import annotations

import asyncio
import threading
import time

from subagents_node import AsyncClient, LaunchContext
from subagents_node.messages.errors import BadRequest
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


# -- which event loop: one at a time, and the next one once it is closed ----------------------


def test_an_async_client_goes_on_in_a_new_loop_once_its_first_was_closed_with_its_reader(
    node: NodeProcess,
) -> None:
    """`loop.run_until_complete(...)` then `loop.close()` leaves the reply reader task pending
    on the closed loop: the next loop's calls went unanswered until their timeout."""
    client = AsyncClient(node.address, timeout=5)
    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(client.ping()).pid == node.pid
    finally:
        first.close()  # its reader task stays pending on it, never done

    async def next_loop() -> None:
        began = time.monotonic()
        assert (await client.ping()).pid == node.pid
        assert time.monotonic() - began < 2, "answered only after a wait"
        await client.aclose()

    asyncio.run(next_loop())


def test_an_async_client_used_from_a_second_running_loop_is_refused_at_once(
    node: NodeProcess,
) -> None:
    """Its socket must not be used from two threads at once: a loop on another thread is told
    so at once (it used to wait out its timeout, its reply read by the first loop's reader)."""
    outcome: list[BaseException | float] = []

    async def go() -> None:
        async with AsyncClient(node.address, timeout=5) as client:
            await client.ping()

            def other_thread() -> None:
                try:
                    outcome.append(asyncio.run(client.ping()).uptime_s)
                except BaseException as err:
                    outcome.append(err)

            thread = threading.Thread(target=other_thread)
            thread.start()
            await asyncio.to_thread(thread.join, 30)
            assert (await client.ping()).pid == node.pid  # the first loop's client goes on

    asyncio.run(go())
    (refused,) = outcome
    assert isinstance(refused, BadRequest), refused
    assert refused.details["reason"] == "event_loop"
    assert "another event loop" in refused.message
