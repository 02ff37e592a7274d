"""An `AsyncClient` and its event loops.

Cancelling a call always cancels it, whenever the cancel lands: even in the instant its reply
has arrived but its coroutine has not yet resumed. Python 3.11's `asyncio.wait_for` returns
the finished result there and swallows the cancel, so a `runs.wait` cancelled at that moment
(by `task.cancel()`, `asyncio.wait_for`, a TaskGroup) went on following the run to its end.
The cancel is timed deterministically by a callback on the call's own reply future. So does a
cancel that lands while the client closes (`aclose`, an `async with` exit).

A client belongs to one running loop at a time: another running loop is refused at once; a
new loop after the first one closed carries on. Many clients share the process's zmq threads,
and a forked child's client opens connections of its own. Real node, real sockets, no sleeps.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from subagents_node import AsyncClient, LaunchContext
from subagents_node.messages.errors import BadRequest, NodeNotRunning
from tests.support.descriptors import run_python
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


def test_a_task_cancelled_while_its_async_client_closes_is_cancelled_and_the_client_closed(
    node: NodeProcess,
) -> None:
    """`aclose()` awaited its reader tasks under `suppress(CancelledError)`, which swallowed a
    cancel of the task closing the client as well (the same exception): a task cancelled in
    its `async with` exit (by `asyncio.wait_for`, a TaskGroup) went on running after the block,
    and a `wait_for` around it never returned."""

    async def go() -> None:
        client = AsyncClient(node.address, timeout=5)
        went_on: list[bool] = []

        async def worker() -> None:
            async with client:
                await client.ping()  # a socket and its reader task, for `aclose` to end
            went_on.append(True)

        task = asyncio.ensure_future(worker())
        while not client.transport._closed:  # in its `async with` exit, awaiting its readers
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=10)
        assert task in done and task.cancelled(), "the cancel was swallowed"
        assert went_on == [], "the task went on after its `async with` block"
        assert client.transport._socks == {} and client.transport.outstanding == 0
        with pytest.raises(NodeNotRunning, match="this client is closed"):
            await client.ping()

    asyncio.run(go())


def test_an_aclose_that_is_not_cancelled_waits_for_its_readers_and_returns(
    node: NodeProcess,
) -> None:
    async def go() -> None:
        client = AsyncClient(node.address, timeout=5)
        await client.ping()
        await client.capacity.snapshot("s")  # a second socket, a second reader
        readers = list(client.transport._readers.values())
        await client.aclose()
        assert readers and all(reader.done() for reader in readers)
        await client.aclose()  # twice: harmless

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


# -- many clients, and a forked child ------------------------------------------------------------


def _os_threads() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("Threads:")[1].split()[0])


def test_a_hundred_async_clients_at_once_share_the_process_zmq_threads(
    node: NodeProcess,
) -> None:
    """Each AsyncClient had a zmq context of its own: two OS threads and five descriptors
    each, so a program holding 200 ran 400 threads and, at the usual limit of 1024
    descriptors, failed from about the 140th client on."""

    async def go() -> tuple[int, int]:
        clients = [AsyncClient(node.address) for _ in range(100)]
        try:
            await clients[0].ping()  # the process's context exists from here on
            before = _os_threads()
            pongs = await asyncio.gather(*(client.ping() for client in clients))
            assert {pong.pid for pong in pongs} == {node.pid}
            return before, _os_threads()
        finally:
            await asyncio.gather(*(client.aclose() for client in clients))

    before, during = asyncio.run(go())
    assert during - before < 5, f"{during - before} more threads for 100 clients"


def ping_from_a_forked_child_with_an_async_client(address: str) -> None:
    """The parent uses an AsyncClient, forks; the child uses it in a loop of its own."""
    client = AsyncClient(address, timeout=10)
    parent_pid = asyncio.run(client.ping()).pid
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # a hang ends the child, never leaves it behind
        began = time.monotonic()
        try:
            pong = asyncio.run(client.ping())
            asyncio.run(client.aclose())
        except BaseException as err:
            print(f"child: {type(err).__name__}: {err}", flush=True)
            os._exit(1)
        os._exit(0 if pong.pid == parent_pid and time.monotonic() - began < 5 else 2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the child ended with {status:#x}"
    assert asyncio.run(client.ping()).pid == parent_pid  # the parent's client goes on
    asyncio.run(client.aclose())
    print("ok")


def test_a_forked_child_using_its_parents_async_client_gets_answers_of_its_own(
    node: NodeProcess,
) -> None:
    """Before: the child's calls went on the parent's sockets, whose context has no I/O
    thread in the child, and waited out their whole timeout."""
    script = (
        "from tests.client.test_aio_cancel import ping_from_a_forked_child_with_an_async_client"
        f" as scenario; scenario({node.address!r})"
    )
    done = run_python(script, timeout=90)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    )


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_async_clients_dropped_without_aclose_while_their_loop_runs_release_their_sockets(
    node: NodeProcess,
) -> None:
    """Each reader task held its transport, so an AsyncClient dropped without `aclose()`
    (`await AsyncClient(address).ping()` in a service that runs for days) was never collected
    while its loop ran: every one kept its DEALER (three descriptors) and a pending task for
    good, and a few hundred such one-liners ran the process out of descriptors. A sync
    `Client` dropped so releases its sockets when collected; so does an AsyncClient now."""

    async def go() -> tuple[int, int, int, int]:
        await AsyncClient(node.address).ping()  # the process's zmq context, once
        gc.collect()
        fds, tasks = _open_descriptors(), len(asyncio.all_tasks())
        for _ in range(60):
            await AsyncClient(node.address).ping()
        gc.collect()  # each client is in a reference cycle (its owner APIs): collect them
        deadline = time.monotonic() + 10
        # zmq_close is asynchronous (libzmq's reaper thread frees the descriptors a moment
        # later), and the close itself is a callback on this loop: let both happen, bounded.
        while _open_descriptors() - fds > 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return fds, _open_descriptors(), tasks, len(asyncio.all_tasks())

    fds_before, fds_after, tasks_before, tasks_after = asyncio.run(go())
    assert tasks_after == tasks_before, f"{tasks_after - tasks_before} reader tasks left"
    assert fds_after - fds_before <= 6, f"{fds_after - fds_before} descriptors kept"
