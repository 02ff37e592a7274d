"""Owner links (actors/links.py) read the replies of another host the way a client reads a
node's (docs/api.md, "Compatibility"): a worker one release older than its home drops the
fields its models do not know, at the top and nested, for the targets its home answers
(`other_host`), while a reply from an owner of its own node stays strict. A reply in another
protocol version is its request's UnsupportedProtocol at once, parsed or relayed raw, instead
of a frame dropped as garbled while the request waits out its deadline.

The peer is a real ZeroMQ ROUTER in the test that answers each request with a reply body it
is given; the links are the real ones, polled by the test as an owner's loop polls them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from subagents_node.actors.links import OwnerLinks
from subagents_node.messages.capacity import (
    Acquire,
    AcquireResult,
    CapacitySnapshot,
    SlotHandle,
)
from subagents_node.messages.envelope import PROTOCOL_VERSION, REPLY, Envelope
from subagents_node.messages.errors import BadRequest, SubagentsError, UnsupportedProtocol

#: The field a later release adds, at the top of a reply and inside its nested models.
ADDED = "added_in_a_later_release"
#: Long: an answer that comes is never this deadline's doing.
CALL_TIMEOUT_S = 30.0

HANDLE = SlotHandle(
    session_id="s", slot=0, token="t" * 16, run_id="r1", generation=3, kind="runner"
)
ACQUIRED = AcquireResult(handle=HANDLE, snapshot=CapacitySnapshot(used=1, limit=2))


def grown_acquired() -> dict[str, Any]:
    body = ACQUIRED.model_dump(mode="python")
    body["handle"][ADDED] = {"nested": [1, "two"]}
    body["snapshot"][ADDED] = 7
    return {**body, ADDED: {"at": "top"}}


Linked = tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes], str]


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[Linked]:
    """A real ROUTER standing for the home's capacity owner (or an owner of this node)."""
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = zctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/capacity.sock"
    router.bind(endpoint)
    try:
        yield zctx, router, endpoint
    finally:
        router.close(linger=0)
        zctx.term()


def ask(
    linked: Linked, body: dict[str, Any], other_host: bool, v: int = PROTOCOL_VERSION
) -> tuple[object, float]:
    """Send an acquire through real links, have the peer answer `body` in version `v`, and
    return the outcome the links hand over and how long after the answer it came."""
    zctx, router, endpoint = linked
    # Links of this node's owners are made as they always were: no `other_host` at all.
    home = {"other_host": frozenset({"capacity"})} if other_host else {}
    links = OwnerLinks(zctx, "worker", lambda _: endpoint, CALL_TIMEOUT_S, **home)
    outcomes: list[object] = []
    try:
        links.send(Acquire(session_id="s", limit=2, run_id="r1"), "capacity", outcomes.append)
        assert router.poll(10_000), "the request never reached the peer"
        identity, frame = router.recv_multipart()
        request = msgpack.unpackb(frame)
        answer = {
            "v": v,
            "id": "a" * 24,
            "corr": request["id"],
            "sender": "capacity",
            "target": request["sender"],
            "type": REPLY,
            "body": body,
        }
        router.send_multipart([identity, msgpack.packb(answer)])
        answered = time.monotonic()
        (sock,) = links.sockets
        while not outcomes and sock.poll(10_000):
            links.receive(sock)
        assert outcomes, "the links handed over no outcome"
        return outcomes[0], time.monotonic() - answered
    finally:
        links.close()


def test_a_newer_homes_reply_with_fields_added_at_the_top_and_nested_is_read_by_its_worker(
    peer: Linked,
) -> None:
    outcome, _ = ask(peer, grown_acquired(), other_host=True)
    assert outcome == ACQUIRED


def test_a_reply_from_an_owner_of_this_node_with_a_field_it_does_not_know_stays_refused(
    peer: Linked,
) -> None:
    outcome, _ = ask(peer, grown_acquired(), other_host=False)
    assert isinstance(outcome, BadRequest)
    assert outcome.details["reason"] == "reply"


def test_a_reply_from_another_host_malformed_otherwise_is_the_same_bad_request(
    peer: Linked,
) -> None:
    body = grown_acquired()
    del body["snapshot"]["used"]
    outcome, _ = ask(peer, body, other_host=True)
    assert isinstance(outcome, BadRequest)
    assert (outcome.details["reason"], outcome.details["field"]) == ("reply", "snapshot.used")


@pytest.mark.parametrize("other_host", [True, False], ids=["home", "own-node"])
def test_a_reply_in_another_protocol_version_is_unsupported_protocol_at_once(
    peer: Linked, other_host: bool
) -> None:
    """It used to be dropped as garbled: the request waited out its whole deadline and was
    answered `unavailable`, as if the home were busy or gone."""
    later = PROTOCOL_VERSION + 1
    outcome, after = ask(peer, ACQUIRED.model_dump(), other_host=other_host, v=later)
    assert isinstance(outcome, UnsupportedProtocol)
    assert outcome.details == {"got": later, "supported": PROTOCOL_VERSION}
    assert f"capacity answered in protocol version {later}" in outcome.message
    assert after < CALL_TIMEOUT_S / 3


def test_a_relayed_request_answered_in_another_protocol_version_gets_the_typed_error(
    peer: Linked,
) -> None:
    """A relay (a worker's gateway passing its local client's request to the home) hands the
    error on in place of the reply: its client hears UnsupportedProtocol, not a timeout."""
    zctx, router, endpoint = peer
    links = OwnerLinks(zctx, "worker", lambda _: endpoint, CALL_TIMEOUT_S)
    delivered: list[Envelope | SubagentsError] = []
    try:
        links.send_raw(Acquire(session_id="s", limit=2, run_id="r1"), "capacity", delivered.append)
        assert router.poll(10_000)
        identity, frame = router.recv_multipart()
        request = msgpack.unpackb(frame)
        answer = {
            "v": PROTOCOL_VERSION + 1,
            "id": "b" * 24,
            "corr": request["id"],
            "type": REPLY,
            "body": {},
        }
        router.send_multipart([identity, msgpack.packb(answer)])
        (sock,) = links.sockets
        while not delivered and sock.poll(10_000):
            links.receive(sock)
    finally:
        links.close()
    assert len(delivered) == 1 and isinstance(delivered[0], UnsupportedProtocol)
