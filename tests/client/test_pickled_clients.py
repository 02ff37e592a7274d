"""A client handed to a multiprocessing worker started by spawn or forkserver (Python 3.14's
default on Linux) is pickled: it arrives as a client of the same node, with connections of its
own. Before, every client failed to pickle with an error about zmq handles or thread locks,
and an AsyncClient pickled after its first call did too. Real node, real worker processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

from subagents_node import AsyncClient
from subagents_node.client.client import Client, connect
from subagents_node.messages.fanout import encode_descriptor
from subagents_node.node.node import Node
from tests.support.nodes import NodeProcess


def _claims_once(client: Client, budget: str) -> tuple[int, int]:
    """In the worker: one claim through the client it was handed, and its node's pid."""
    with client:
        return client.fanout.claim(budget, [f"worker[{id(client)}]"]).used, client.ping().pid


def _pings_async(client: AsyncClient) -> int:
    async def go() -> int:
        async with client:
            return (await client.ping()).pid

    return asyncio.run(go())


def _spawned() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))


def test_a_client_handed_to_a_spawned_worker_reaches_the_same_node(node: NodeProcess) -> None:
    with connect(node.address) as client:
        budget = client.fanout.create(root_run_id="pickled", limit=4)
        client.ping()  # a client in use: sockets, a thread's channels, a lock
        with _spawned() as pool:
            used, pid = pool.submit(_claims_once, client, encode_descriptor(budget)).result(60)
        assert (used, pid) == (1, node.pid)
        assert client.fanout.snapshot(budget).used == 1  # and this one goes on


def test_an_in_process_client_handed_to_a_spawned_worker_goes_over_the_nodes_socket(
    embedded_node: Node,
) -> None:
    client = embedded_node.client()
    budget = client.fanout.create(root_run_id="pickled-inproc", limit=4)
    with _spawned() as pool:
        used, pid = pool.submit(_claims_once, client, encode_descriptor(budget)).result(60)
    assert used == 1 and pid == client.ping().pid


def test_an_async_client_in_use_pickles_to_a_client_of_the_same_node(node: NodeProcess) -> None:
    async def used() -> AsyncClient:
        client = AsyncClient(node.address)
        await client.ping()  # its sockets and reader task exist now
        return client

    client = asyncio.run(used())
    copy = pickle.loads(pickle.dumps(client))
    assert copy.address == client.address and copy.timeout == client.timeout
    with _spawned() as pool:
        assert pool.submit(_pings_async, client).result(60) == node.pid
    asyncio.run(client.aclose())
