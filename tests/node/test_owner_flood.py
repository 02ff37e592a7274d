"""An owner's memory stays bounded under a flood of big frames (DESIGN §4 "Bad input").

A busy owner reads nothing; what its peers keep sending waits in libzmq's queues in the owner
process. Those queues are bounded per connection in messages (RCVHWM) and each message in
bytes (MAXMSGSIZE), so a flood must meet back-pressure (a blocked sender) long before the
owner holds hundreds of MiB. It used to take 10,000 messages of up to 4 MiB per connection.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import psutil
import pytest
import zmq

from subagents_node.messages.base import Ack
from subagents_node.messages.codec import MAX_FRAME_BYTES
from subagents_node.messages.node import DebugSleep
from subagents_node.node.ownerspecs import owner_endpoint
from tests.support.nodes import NodeProcess, running_node

CONNECTIONS = 4
#: Frames each connection tries to send: far more than a bounded owner may hold.
FRAMES_EACH = 150
#: Generous: the owner idles near 45 MiB and held ~1.7 GiB under such a flood before the bound.
RSS_BOUND = 400 << 20


@pytest.fixture
def busy_owner() -> Iterator[tuple[NodeProcess, psutil.Process]]:
    with running_node("--faults") as node:
        [status] = [a for a in node.status().actors if a.name == "capacity"]
        assert status.pid is not None
        client = node.client(timeout=60)
        asleep = threading.Thread(
            target=lambda: client.ask(DebugSleep(ms=6000), Ack, target="capacity")
        )
        asleep.start()
        try:
            yield node, psutil.Process(status.pid)
        finally:
            asleep.join()


def _flood(endpoint: str, frame: bytes, peak: list[int], owner: psutil.Process) -> None:
    """Send `frame` until the owner pushes back (a send blocked for 2 s) or FRAMES_EACH."""
    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 1)  # the flood waits in the owner, not in this process
    sock.setsockopt(zmq.SNDTIMEO, 2000)
    sock.connect(endpoint)
    try:
        for _ in range(FRAMES_EACH):
            try:
                sock.send(frame, copy=False)
            except zmq.Again:
                break  # back-pressure: the owner's queue for us is full
            peak.append(owner.memory_info().rss)
    except zmq.ZMQError:
        pass  # the owner cut an oversize sender: that is a bound too
    finally:
        sock.close(linger=0)
        zctx.term()


@pytest.mark.parametrize(
    "size",
    [MAX_FRAME_BYTES, 4_000_000],
    ids=["frames-at-the-cap", "oversize-frames"],
)
def test_a_flood_of_big_frames_at_a_busy_owner_leaves_its_memory_bounded(
    busy_owner: tuple[NodeProcess, psutil.Process], size: int
) -> None:
    node, owner = busy_owner
    endpoint = owner_endpoint(node.state_dir, "capacity")
    frame = os.urandom(size)
    peak = [owner.memory_info().rss]
    floods = [
        threading.Thread(target=_flood, args=(endpoint, frame, peak, owner))
        for _ in range(CONNECTIONS)
    ]
    for flood in floods:
        flood.start()
    for flood in floods:
        flood.join()
    peak.append(owner.memory_info().rss)
    print(f"owner rss: start {peak[0] >> 20} MiB, peak {max(peak) >> 20} MiB")
    assert max(peak) < RSS_BOUND, f"the owner grew to {max(peak) >> 20} MiB under the flood"
    assert owner.is_running()
