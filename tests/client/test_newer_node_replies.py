"""A client one release older than its node (docs/api.md, "Compatibility"): every reply it
decodes, results and errors alike, tolerates fields it does not know at any nesting level
(dropped, never an error), on the sync and the asyncio client, while a node keeps refusing a
request that carries a field it does not know.

The newer node is a real node behind a ROUTER in this test (tests/support/nodeproxy.py) that
passes every request on as it is and adds fields to every map of every reply (`grown`): the
replies are the current models' real replies plus what a later release might add. Real ZeroMQ
sockets and node processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from subagents_node import AsyncClient
from subagents_node.client.client import Client, connect
from subagents_node.messages.envelope import ERROR, PROTOCOL_VERSION, Envelope
from subagents_node.messages.errors import (
    BadRequest,
    FanoutLimitExceeded,
    FanoutReservationCommitted,
    UnsupportedProtocol,
)
from subagents_node.messages.fanout import FanoutSnapshot
from subagents_node.messages.node import NodeStatusResult
from tests.support.nodeproxy import ProxyNode, Rewrite
from tests.support.nodes import NodeProcess, RawPeer, error_of

#: The field a later release adds to every map of every reply.
ADDED = "added_in_a_later_release"


def grown(value: Any) -> Any:
    """`value` with ADDED in every map, at every depth (a reply as a newer node sends it)."""
    if isinstance(value, dict):
        return {**{k: grown(v) for k, v in value.items()}, ADDED: {"nested": [1, "two"]}}
    if isinstance(value, list):
        return [grown(item) for item in value]
    return value


def newer(type_: str, body: dict[str, Any]) -> dict[str, Any]:
    del type_
    grown_body: dict[str, Any] = grown(body)
    return grown_body


@pytest.fixture
def newer_node(node: NodeProcess) -> Iterator[Callable[..., ProxyNode]]:
    """Factory: `newer_node(rewrite=newer, v=None)` -> the next release's node (a ProxyNode)."""
    made: list[ProxyNode] = []

    def make(rewrite: Rewrite = newer, v: int | None = None) -> ProxyNode:
        made.append(ProxyNode(node, rewrite, v))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


@pytest.fixture
def older_client(newer_node: Callable[..., ProxyNode]) -> Iterator[Client]:
    """This release's sync client, talking to a node of the next release."""
    with connect(newer_node().address, timeout=10) as client:
        yield client


def test_an_older_client_reads_a_newer_nodes_status_with_fields_it_does_not_know(
    node: NodeProcess, older_client: Client
) -> None:
    status = older_client.status()
    assert isinstance(status, NodeStatusResult)
    direct = node.status()
    assert (status.node_id, status.pid, status.endpoints) == (
        direct.node_id,
        direct.pid,
        direct.endpoints,
    )
    assert [a.name for a in status.actors] == [a.name for a in direct.actors]
    assert status.containment == direct.containment and status.tcp == direct.tcp
    assert ADDED not in status.model_dump_json()  # dropped, at every level


def test_r_fan_14_an_older_client_gets_the_snapshot_after_its_claims_from_a_newer_node(
    older_client: Client,
) -> None:
    budget = older_client.fanout.create(root_run_id="newer-claims", limit=3)
    first = older_client.fanout.claim(budget, ["tasks[0]"])
    second = older_client.fanout.claim(budget, ["tasks[1]", "tasks[2]"])
    assert first == FanoutSnapshot.of(1, 3)
    assert second == FanoutSnapshot.of(3, 3)


def test_r_fan_16_a_newer_nodes_refusal_with_details_it_does_not_know_is_the_exact_error(
    older_client: Client,
) -> None:
    budget = older_client.fanout.create(root_run_id="newer-refusal", limit=1)
    older_client.fanout.claim(budget, ["tasks[0]"])
    with pytest.raises(FanoutLimitExceeded) as refused:
        older_client.fanout.claim(budget, ["tasks[1]"])
    assert ADDED in refused.value.details  # rebuilt as sent; its models drop what they do not know
    assert refused.value.rejection.path == "tasks[1]"
    assert (refused.value.rejection.used, refused.value.rejection.remaining) == (1, 0)
    assert refused.value.snapshot == FanoutSnapshot.of(1, 1)


def test_a_newer_nodes_error_whose_snapshot_holds_a_field_it_does_not_know_still_decodes(
    older_client: Client,
) -> None:
    budget = older_client.fanout.create(root_run_id="newer-snapshot", limit=2)
    held = older_client.fanout.reserve(budget, ["tasks[0]"], ttl_s=60)
    assert held.commit() == FanoutSnapshot.of(1, 2)
    with pytest.raises(FanoutReservationCommitted) as committed:
        held.abort()
    assert ADDED in committed.value.details["snapshot"]
    assert committed.value.snapshot == FanoutSnapshot.of(1, 2)


def test_the_asyncio_client_reads_a_newer_nodes_replies_and_errors_alike(
    newer_node: Callable[..., ProxyNode],
) -> None:
    proxy = newer_node()

    async def go() -> tuple[NodeStatusResult, FanoutSnapshot, FanoutLimitExceeded]:
        async with AsyncClient(proxy.address, timeout=10) as client:
            status = await client.status()
            budget = await client.fanout.create(root_run_id="newer-aio", limit=1)
            snap = await client.fanout.claim(budget, ["tasks[0]"])
            try:
                await client.fanout.claim(budget, ["tasks[1]"])
            except FanoutLimitExceeded as err:
                return status, snap, err
            raise AssertionError("a claim past the limit was not refused")

    status, snap, refused = asyncio.run(go())
    assert isinstance(status, NodeStatusResult) and status.actors
    assert snap == FanoutSnapshot.of(1, 1)
    assert refused.rejection.path == "tasks[1]" and refused.snapshot == FanoutSnapshot.of(1, 1)


def test_a_node_of_another_protocol_version_is_unsupported_protocol_at_once_not_a_timeout(
    newer_node: Callable[..., ProxyNode],
) -> None:
    """A node whose release changed the protocol version answers in it: the sync and the
    asyncio client each raise UnsupportedProtocol for the request it answers, naming both
    versions. They used to drop such a reply as garbled and wait out their timeout
    (NodeTimeout: "did not answer in time", which sent the user looking for a busy node)."""
    later = PROTOCOL_VERSION + 1
    proxy = newer_node(v=later)
    with connect(proxy.address, timeout=5) as client, pytest.raises(UnsupportedProtocol) as sync:
        client.status()

    async def go() -> None:
        async with AsyncClient(proxy.address, timeout=5) as client:
            await client.status()

    with pytest.raises(UnsupportedProtocol) as aio:
        asyncio.run(go())
    for raised in (sync.value, aio.value):
        assert raised.details == {"got": later, "supported": PROTOCOL_VERSION}
        assert f"answered in protocol version {later}" in raised.message
        assert f"this client speaks {PROTOCOL_VERSION}" in raised.message


def _grown_without_pid(type_: str, body: dict[str, Any]) -> dict[str, Any]:
    body = newer(type_, body)
    if type_ != ERROR:
        body.pop("pid", None)
    return body


def test_a_newer_reply_that_is_malformed_otherwise_is_the_same_clear_bad_request(
    newer_node: Callable[..., ProxyNode],
) -> None:
    """Unknown fields are forgiven, nothing else: a status without its `pid` is today's
    BadRequest naming `pid`, and only `pid` (the fields it does not know are no fault)."""
    proxy = newer_node(_grown_without_pid)
    with connect(proxy.address, timeout=10) as client, pytest.raises(BadRequest) as bad:
        client.status()
    assert bad.value.message == "invalid reply to node.status request: pid: Field required"
    assert bad.value.details["reason"] == "reply"
    assert (bad.value.details["field"], bad.value.details["error_count"]) == ("pid", 1)


@pytest.mark.parametrize(
    ("target", "type_", "body", "field"),
    [
        ("", "node.status", {"verbose": True}, "verbose"),
        ("fanout", "fanout.create", {"root_run_id": "r", "limit": 1, "priority": 9}, "priority"),
    ],
)
def test_a_node_still_refuses_a_request_with_a_field_it_does_not_know(
    node: NodeProcess,
    raw_dealer: Callable[[str], RawPeer],
    target: str,
    type_: str,
    body: dict[str, Any],
    field: str,
) -> None:
    """Tolerance is for the replies a client reads only: a request is still validated
    strictly, with a clear one-line BadRequest naming the field."""
    peer = raw_dealer(node.address)
    refused = error_of(peer.request_once(Envelope(type=type_, body=body, target=target)))
    assert isinstance(refused, BadRequest)
    assert refused.details["field"] == field
    assert refused.message == f"invalid {type_} request: {field}: Extra inputs are not permitted"


def test_a_node_still_refuses_a_field_it_does_not_know_nested_in_a_request(
    node: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    budget = node.client().fanout.create(root_run_id="strict-nested", limit=2)
    descriptor = {**budget.model_dump(), ADDED: 1}
    peer = raw_dealer(node.address)
    claim = Envelope(
        type="fanout.claim", body={"descriptor": descriptor, "paths": ["a"]}, target="fanout"
    )
    refused = error_of(peer.request_once(claim))
    assert isinstance(refused, BadRequest)
    assert refused.details["field"] == f"descriptor.{ADDED}"
    assert node.client().fanout.snapshot(budget) == FanoutSnapshot.of(0, 2)  # nothing claimed
