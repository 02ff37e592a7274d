"""The shim's ZMTP 3.0 DEALER (actors/child/zmtp.py) against a real libzmq ROUTER, the kind the
run supervisor binds: the handshake, a report sent before the peer's greeting, answers, a
peer that goes away and one that comes back. Real sockets; every wait is a poll with a
deadline.
"""

from __future__ import annotations

import select
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from subagents_node.actors.child.zmtp import ReportLink

WAIT_MS = 5000


@pytest.fixture
def endpoint() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="sa-", dir="/tmp") as directory:
        yield f"ipc://{Path(directory) / 'runs.sock'}"


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def router(zctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sock = zctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.bind(endpoint)
    return sock


def receive(link: ReportLink) -> list[bytes]:
    """What the link reads once its socket is readable (within the deadline)."""
    poller = select.poll()
    poller.register(link.fileno(), select.POLLIN)
    assert poller.poll(WAIT_MS), "nothing arrived"
    return link.receive()


def delivered(link: ReportLink, peer: zmq.Socket[bytes]) -> list[bytes]:
    """The next message the ROUTER gets from the link, the link reading what comes its way
    meanwhile, as the shim's loop does: libzmq sends its greeting in parts (signature, version,
    the rest), each as the peer's arrives, so the handshake may take several reads."""
    poller = zmq.Poller()
    poller.register(peer, zmq.POLLIN)
    poller.register(link.fileno(), zmq.POLLIN)
    deadline = time.monotonic() + WAIT_MS / 1000
    while (left := deadline - time.monotonic()) > 0:
        events = dict(poller.poll(max(1, int(left * 1000))))
        if events.get(link.fileno()):
            assert link.receive() == []  # nothing but the handshake is sent to the link here
        if events.get(peer):
            return peer.recv_multipart()
    raise AssertionError("the ROUTER got nothing from the link in time")


def test_a_report_sent_before_the_routers_greeting_arrives_once_and_is_answered(
    zctx: zmq.Context[zmq.Socket[bytes]], endpoint: str
) -> None:
    peer = router(zctx, endpoint)
    link = ReportLink(endpoint)
    assert link.send(b"started") and link.connected
    identity, frame = delivered(link, peer)  # the greeting and READY, then the report
    assert frame == b"started"
    peer.send_multipart([identity, b"ack-1"])
    assert receive(link) == [b"ack-1"]
    big = b"x" * 70_000  # a long frame each way
    assert link.send(big)
    assert peer.poll(WAIT_MS) and peer.recv_multipart()[1] == big
    peer.send_multipart([identity, big])
    got: list[bytes] = []
    while not got:
        got = receive(link)
    assert got == [big]
    link.close()
    peer.close(0)


def test_no_listener_is_a_failed_send_and_a_router_that_goes_and_comes_back_is_reached_again(
    zctx: zmq.Context[zmq.Socket[bytes]], endpoint: str
) -> None:
    link = ReportLink(endpoint)
    assert not link.send(b"report") and not link.connected  # nobody listens yet
    first = router(zctx, endpoint)
    assert link.send(b"report")
    assert delivered(link, first)[1] == b"report"
    first.close(0)  # the supervisor dies: the link sees the end of its connection
    receive(link)
    assert not link.connected
    second = router(zctx, endpoint)
    assert link.send(b"resent")
    assert delivered(link, second)[1] == b"resent"
    link.close()
    second.close(0)


def test_only_ipc_and_tcp_endpoints_are_taken() -> None:
    with pytest.raises(ValueError, match="ipc:// or tcp://"):
        ReportLink("inproc://runs")
