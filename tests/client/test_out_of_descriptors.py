"""A client process out of file descriptors is told so, as one typed error (OutOfDescriptors),
never that its node is gone and never with libzmq's own error; it works again once it has
closed some (runtime/client/exhaustion.py).

Each case runs in a process of its own with a limit of 64 open files, against a real node."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.nodes import REPO, NodeProcess

PROBE = r"""
import asyncio, json, os, resource, sys
from subagents_node import AsyncClient
from subagents_node.client.client import connect
from subagents_node.messages.errors import SubagentsError

address, case = sys.argv[1], sys.argv[2]
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
said = []

def outcome(call):
    try:
        said.append(["ok", repr(call())])
    except SubagentsError as exc:
        said.append([type(exc).__name__, exc.message, exc.details])
    except Exception as exc:
        said.append(["raw " + type(exc).__name__, str(exc), {}])

def exhaust():
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        return held

if case in ("connected", "first_use"):
    client = connect(address)
    client.ping()
    if case == "connected":
        # Talking to the node already, it opens a channel to an owner it has not used yet.
        import subagents_node.client.capacity, subagents_node.messages.capacity
        client.capacity
    # (first_use: the ledger API's module is imported on its first use: a file to open.)
    held = exhaust()
    outcome(lambda: client.capacity.snapshot("s").used)
    for fd in held[:16]:
        os.close(fd)
    outcome(lambda: client.capacity.snapshot("s").used)
elif case == "async_first_use":
    async def snapshot():
        async with AsyncClient(address) as client:
            await client.ping()
            held = exhaust()
            try:
                return (await client.session.spawn_snapshot("s")).used
            finally:
                for fd in held:
                    os.close(fd)
    outcome(lambda: asyncio.run(snapshot()))
elif case == "new":
    held = exhaust()
    outcome(lambda: connect(address).ping().pid)
    for fd in held[:16]:
        os.close(fd)
    import gc; gc.collect()  # the contexts the refused clients began
    outcome(lambda: connect(address).ping().pid)
elif case == "async":
    async def ping():  # the event loop's own descriptors are open before the exhaustion
        held = exhaust()
        try:
            async with AsyncClient(address) as client:
                return (await client.ping()).pid
        finally:
            for fd in held:
                os.close(fd)
    outcome(lambda: asyncio.run(ping()))
print(json.dumps(said))
"""


def probe(node: NodeProcess, case: str) -> list[list[object]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, node.address, case],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    said: list[list[object]] = json.loads(done.stdout.splitlines()[-1])
    return said


def assert_out_of_descriptors(said: list[object]) -> None:
    kind, message, details = said
    assert kind == "OutOfDescriptors", said
    assert details == {"limit": 64}
    assert "out of file descriptors (its limit is 64 open files)" in str(message)
    assert "ulimit -n" in str(message) and "\n" not in str(message)


@pytest.mark.parametrize("case", ["connected", "first_use"])
def test_a_connected_client_out_of_descriptors_is_never_told_its_node_is_gone(
    node: NodeProcess, case: str
) -> None:
    """`connected`: its channel to a new owner read the node's pid record, could not open it,
    and said "the node that served it is gone (stale socket)" of a node that was running.
    `first_use`: `client.capacity` imports its module on first use, which opens a file; that
    was Python's own OSError ("Too many open files: .../capacity.py"), from outside the error
    tree, with no word that nothing was sent. Both work again once some are closed."""
    first, after = probe(node, case)
    assert_out_of_descriptors(first)
    assert after == ["ok", "0"]


def test_a_new_client_out_of_descriptors_gets_the_typed_error_and_works_once_some_are_closed(
    node: NodeProcess,
) -> None:
    """It raised libzmq's ZMQError("Too many open files"), from outside the error tree."""
    first, after = probe(node, "new")
    assert_out_of_descriptors(first)
    assert after == ["ok", str(node.pid)]


def test_an_async_client_out_of_descriptors_gets_the_same_typed_error(node: NodeProcess) -> None:
    (first,) = probe(node, "async")
    assert_out_of_descriptors(first)


def test_an_async_client_out_of_descriptors_at_an_apis_first_use_gets_the_typed_error(
    node: NodeProcess,
) -> None:
    (first,) = probe(node, "async_first_use")
    assert_out_of_descriptors(first)
