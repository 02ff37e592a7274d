"""A program that forks while it embeds a node: the child may use the node's clients, and
whatever the child does, the node, its runs and its state dir stay the parent's.

Before: a child that left the `with Node.embedded()` block (sys.exit, an exception) ran the
block's end in the child: it stopped the parent's owner processes, removed the pid file and
deleted the parent's temporary state dir while the parent still served. An in-process client
(`node.client()`) in a child waited out its whole timeout on every call (the node's threads are
not in the child) and answered `ping` as if the child were the node; its `node.stop()`
stopped the parent's owners. Each scenario forks, so
it runs in a python process of its own, not in the test runner. Real node, processes, sockets.
"""

from __future__ import annotations

import os
import select
import signal

from subagents_node.messages.supervisor import AgentPlan, Launch, TaskItem
from subagents_node.node.node import Node
from tests.support.descriptors import run_python


class _Leave(Exception):
    """Raised in the forked child only: it leaves the block as an error would."""


def _exit_code_within(pid: int, timeout: float) -> int | None:
    """The child's exit code once it exits, None if it is still there after `timeout`."""
    fd = os.pidfd_open(pid)
    try:
        if not select.select([fd], [], [], timeout)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _sleeper() -> Launch:
    agent = AgentPlan(name="sleep", command=["sleep", "300"], task_delivery="argv")
    return Launch(
        session_id="s-fork",
        mode="single",
        background=True,
        items=[TaskItem(agent=agent, task="")],
        cwd="/",
    )


# -- scenarios run in a process of their own (`python -c`, from the repository root) ----------


def a_forked_child_leaves_the_block() -> None:
    pid = -1
    try:
        with Node.embedded() as node:
            client = node.client("zmq", timeout=5)
            budget = client.fanout.create(root_run_id="fork", limit=5)
            run = client.runs.launch(_sleeper())
            pid = os.fork()
            if pid == 0:
                raise _Leave  # the child unwinds the block, as sys.exit() would
            assert _exit_code_within(pid, 60) == 0, "the child did not leave the block"
            assert node.state_dir.is_dir(), "the child removed the parent's state dir"
            assert client.fanout.claim(budget, ["tasks[0]"]).used == 1
            assert client.runs.show(run.run_id).state == "running"
            restarts = {owner.name: owner.restarts for owner in client.status().actors}
            assert set(restarts.values()) == {0}, f"the child stopped owners: {restarts}"
            assert (node.state_dir / "node.pid").exists()
    except _Leave:
        pass  # the child only
    finally:
        if pid == 0:
            os._exit(0)
    print("ok")


def a_forked_child_calls_through_the_in_process_client() -> None:
    with Node.embedded() as node:
        client = node.client(timeout=5)  # in process
        budget = client.fanout.create(root_run_id="fork-inproc", limit=5)
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)  # a hang ends the child, never leaves it behind
            try:
                claimed = client.fanout.claim(budget, ["child[0]"])
                pong = client.ping()
                client.close()  # the child's own transport; the parent's client stays open
                node.stop()  # stops nothing of the parent's
            except BaseException as err:
                print(f"child: {type(err).__name__}: {err}", flush=True)
                os._exit(1)
            os._exit(0 if (claimed.used, pong.pid) == (1, os.getppid()) else 2)
        assert _exit_code_within(pid, 60) == 0, "the child's calls (or its stop) failed"
        assert client.fanout.snapshot(budget).used == 1  # the child's claim, on the node
        assert client.ping().pid == os.getpid()
        restarts = {owner.name: owner.restarts for owner in client.status().actors}
        assert set(restarts.values()) == {0}, f"the child stopped owners: {restarts}"
    print("ok")


def _scenario(name: str) -> None:
    done = run_python(
        f"from tests.node.test_embedded_fork import {name}; {name}()",
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    )


# -- the rules --------------------------------------------------------------------------------


def test_a_forked_child_leaving_the_embedded_block_leaves_the_parents_node_serving() -> None:
    _scenario("a_forked_child_leaves_the_block")


def test_a_forked_child_calling_through_an_in_process_client_is_answered_by_the_node() -> None:
    _scenario("a_forked_child_calls_through_the_in_process_client")
