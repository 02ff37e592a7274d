"""An embedded node with no state dir of its own (`Node.embedded()`): its temporary directory
goes when the block ends, so the runs still going in it are stopped first. A shim outlives its
node by design, for the next node to adopt; with the directory gone there is none, and the
child used to run on unsupervised, reparented to init. A named state dir keeps its runs."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path

import pytest

from subagents_node.messages.base import Ack
from subagents_node.messages.errors import NodeAlreadyRunning, NodeNotRunning
from subagents_node.messages.node import DebugSleep
from subagents_node.messages.supervisor import AgentPlan, Launch, TaskItem
from subagents_node.node import embedding
from subagents_node.node.claim import PREVIOUS_OWNERS_EXIT_S
from subagents_node.node.node import Node
from tests.support.descriptors import run_python
from tests.support.nodes import new_state_dir
from tests.support.runs import wait_until


def _sleeper(session: str) -> Launch:
    agent = AgentPlan(name="sleep", command=["sleep", "300"], task_delivery="argv")
    return Launch(
        session_id=session,
        mode="single",
        background=True,
        items=[TaskItem(agent=agent, task="")],
        cwd="/",
    )


def _gone_within(pid: int, timeout: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def test_leaving_a_temporary_embedded_node_stops_its_runs_before_their_directory_goes() -> None:
    with Node.embedded() as node:
        directory = node.state_dir
        run = node.client().runs.launch(_sleeper("s-embedded"))
        pid = run.children[0].pid
        assert pid is not None
    try:
        assert _gone_within(pid, 5.0), "the child outlived its temporary node"
        assert not directory.exists()
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_an_embedded_node_on_a_named_state_dir_leaves_its_runs_to_the_next_node() -> None:
    state_dir = new_state_dir()
    pid = None
    try:
        with Node.embedded(state_dir=state_dir) as node:
            run = node.client().runs.launch(_sleeper("s-named"))
            pid = run.children[0].pid
            assert pid is not None
        os.kill(pid, 0)  # still running, under its shim
        with Node.embedded(state_dir=state_dir) as node:
            client = node.client()
            assert client.runs.show(run.run_id).state == "running"
            client.runs.stop(run.run_id)
            assert client.runs.wait(run.run_id, timeout=30).state == "stopped"
    finally:
        if pid is not None:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_a_second_embedded_node_on_a_served_dir_is_told_a_node_of_this_process_serves_it() -> None:
    """It used to be told that another node was starting or stopping, and to retry; then it
    was told the right thing only after waiting out the claim's wait for a dead node's owners
    (5 s) on the live node's own owners, which would never exit."""
    state_dir = new_state_dir()
    try:
        with Node.embedded(state_dir=state_dir) as node:
            began = time.monotonic()
            with pytest.raises(NodeAlreadyRunning) as refused, Node.embedded(state_dir=state_dir):
                pass
            assert time.monotonic() - began < PREVIOUS_OWNERS_EXIT_S / 2, "it waited on them"
            assert "a node of this process" in refused.value.message
            assert node.client().capacity.snapshot("s", 1).used == 0  # the first serves on
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def test_one_embedded_block_entered_twice_is_told_so_and_its_node_serves_on() -> None:
    """A `with` on the same `Node.embedded()` object, nested or after the first ended, raised
    contextlib's `AttributeError: args` (a generator's context manager runs once)."""
    block = Node.embedded()
    with block as node:
        with pytest.raises(NodeAlreadyRunning, match="entered already"), block:
            pass
        assert node.client().ping().pid == os.getpid()  # the first block's node serves on
    assert not node.state_dir.exists()  # and its end still removed the directory
    with pytest.raises(NodeAlreadyRunning, match="entered already"), block:
        pass


def test_a_temporary_embedded_node_stopped_inside_its_block_ends_the_block_quietly() -> None:
    with Node.embedded() as node:
        directory = node.state_dir
        node.stop()
    assert not directory.exists()


def test_a_second_interrupt_while_a_temporary_node_stops_its_runs_still_stops_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second Ctrl-C while the block's end waits for its runs used to skip the node's stop:
    its owners and sockets served on, in a directory being removed."""

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(embedding, "stop_running", interrupted)
    with pytest.raises(KeyboardInterrupt), Node.embedded() as node:
        owners = [actor.pid for actor in node.owner_statuses() if actor.pid]
        assert owners
    with pytest.raises(NodeNotRunning):
        node.client()
    for pid in owners:
        assert _gone_within(pid, 10.0), f"owner {pid} outlived its node"


def _blocked_by(native_id: int) -> set[int] | None:
    """The signals thread `native_id` of this process blocks (SigBlk); None once it ended."""
    try:
        status = Path(f"/proc/self/task/{native_id}/status").read_text()
    except FileNotFoundError:
        return None
    mask = int(
        next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16
    )
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_a_program_embedding_a_node_keeps_its_signals_for_its_own_threads() -> None:
    """A signal the kernel gave to one of the node's threads ran the program's handler only
    once its main thread ran Python again (never, while it waited in C). The node's threads
    block every asynchronous signal now, as libzmq's do, and the caller's mask is as before."""
    before_threads = {t.native_id for t in threading.enumerate()}
    main_before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    with Node.embedded() as node:
        node.client().ping()
        started = [
            t for t in threading.enumerate() if t.native_id not in before_threads and t.is_alive()
        ]
        assert started, "an embedded node runs threads of its own"
        for thread in started:
            assert thread.native_id is not None
            blocked = _blocked_by(thread.native_id)
            if blocked is None:  # ended meanwhile
                continue
            assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1} <= blocked, (
                thread.name
            )
        assert signal.pthread_sigmask(signal.SIG_BLOCK, ()) == main_before


NEVER_LEFT = """
from subagents_node.node.node import Node
from tests.node.test_embedded import _sleeper
block = Node.embedded()  # kept, entered, never left: the program just ends
node = block.__enter__()
run = node.client().runs.launch(_sleeper("s-never-left"))
print(node.state_dir, run.children[0].pid, flush=True)
"""


def test_a_program_that_ends_inside_a_temporary_embedded_block_exits_and_cleans_up() -> None:
    """`Node.embedded().__enter__()` kept in a global (or a `with` in a generator never
    finished), then the program ends: the block was left by the collector during the
    interpreter's finalization, when the node's threads no longer ran, and its end asked that
    node for its runs: the process never exited. It is left at exit now, as a `with` would."""
    began = time.monotonic()
    try:
        done = run_python(NEVER_LEFT, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the program never exited")
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - began < 30
    directory, pid = done.stdout.split()
    try:
        assert _gone_within(int(pid), 5.0), "the child outlived its temporary node"
        assert not Path(directory).exists()
    finally:
        with suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _waiting_in_event(thread: threading.Thread) -> bool:
    """Whether `thread` waits in a `threading` wait now (its call dispatched, its reply not in):
    nothing announces it, so its stack is read."""
    frame = sys._current_frames().get(thread.ident or 0)
    return (
        frame is not None
        and frame.f_code.co_name == "wait"
        and "threading" in frame.f_code.co_filename
    )


def test_a_call_in_flight_as_an_embedded_block_ends_says_its_client_is_closed() -> None:
    """The node closes the clients it gave out as it stops, and their calls raise
    NodeNotRunning ("this client is closed"); a call already waiting went on waiting for the
    owners' stop, then was answered as if nothing happened, or `OwnerUnavailable` "abandoned:
    the caller stopped" (it was the node that stopped). It ends at once now, as a socket
    client's call does when that client is closed."""
    outcome: list[object] = []
    with Node.embedded(faults=True) as node:
        client = node.client()

        def call() -> None:
            try:
                outcome.append(client.ask(DebugSleep(ms=3000), Ack, timeout=20, target="capacity"))
            except BaseException as err:
                outcome.append(err)

        caller = threading.Thread(target=call)
        caller.start()
        wait_until(lambda: _waiting_in_event(caller), 10, "the call to wait for its reply")
    caller.join(20)
    assert len(outcome) == 1 and isinstance(outcome[0], NodeNotRunning), outcome
    assert str(outcome[0]) == "this client is closed"
