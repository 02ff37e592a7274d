"""Bounds on what grows with use (issue 12 item 7): waiting watchers and node.log.

Against real node processes: `max_watchers` long-poll watchers wait, the next one is refused
with `Busy` at once (and a watcher that can be answered at once still is); refused frames from
many peers rotate `node.log` at `node_log_max_bytes`, keeping `node_log_backups` old files.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack
import pytest
import zmq

from subagents_node.client.paths import LOG_NAME
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.envelope import PROTOCOL_VERSION
from subagents_node.messages.errors import Busy
from subagents_node.messages.supervisor import FleetEvents, WatchAll
from tests.support.nodes import NodeProcess, RawPeer

BOUND = 4
#: Peers that each send one refused frame: about 230 KB of log lines, past two 64 KiB caps.
PEERS = 700


def _unknown_type(type_: str) -> bytes:
    """A well-formed envelope of a request type no owner serves (refused, and logged)."""
    envelope = {"v": PROTOCOL_VERSION, "id": "r-1", "type": type_, "body": {}}
    packed: bytes = msgpack.packb(envelope, use_bin_type=True)
    return packed


def test_issue_12_watchers_past_max_watchers_get_busy_at_once(
    start_node: Callable[..., NodeProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUBAGENTS_MAX_WATCHERS", str(BOUND))
    node = start_node()
    transport: ZmqTransport = node.transport()
    waiting = [transport.submit(WatchAll(after_seq=0, wait_s=60)) for _ in range(BOUND)]
    started = time.monotonic()
    with pytest.raises(Busy) as info:
        transport.submit(WatchAll(after_seq=0, wait_s=60)).result(timeout=10)
    assert time.monotonic() - started < 5  # refused at once, not after its 60 s wait
    assert info.value.details["limit"] == BOUND
    assert "max_watchers" in info.value.message
    # One that needs no waiting is still answered, and the node still serves.
    answered = transport.call(WatchAll(after_seq=0, wait_s=0), timeout=10)
    assert isinstance(answered, FleetEvents)
    assert node.client().ping().pid == node.pid
    assert len(waiting) == BOUND


def test_issue_12_watcher_slots_are_freed_when_watchers_are_answered(
    start_node: Callable[..., NodeProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUBAGENTS_MAX_WATCHERS", "1")
    node = start_node()
    transport: ZmqTransport = node.transport()
    first = transport.submit(WatchAll(after_seq=0, wait_s=0.2))
    assert isinstance(first.result(timeout=10), FleetEvents)  # its wait ended: slot free
    second = transport.submit(WatchAll(after_seq=0, wait_s=0.2))
    assert isinstance(second.result(timeout=10), FleetEvents)


def test_issue_12_node_log_rotates_at_its_size_cap(
    start_node: Callable[..., NodeProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    cap = 64 << 10
    monkeypatch.setenv("SUBAGENTS_NODE_LOG_MAX_BYTES", str(cap))
    monkeypatch.setenv("SUBAGENTS_NODE_LOG_BACKUPS", "2")
    node = start_node()
    # One refused frame from each of many peers: each is one warning line (~330 bytes), several
    # caps' worth in all. (From one peer, a flood is one line a second: actors/loglimit.py.)
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        for i in range(PEERS):
            peer = RawPeer(zctx, node.address)
            try:
                peer.send_frames(_unknown_type(f"peer-{i}." + "x" * 150))
                assert peer.recv_env(10) is not None
            finally:
                peer.close()
    finally:
        zctx.term()
    logs = sorted(p.name for p in node.state_dir.iterdir() if p.name.startswith(LOG_NAME))
    assert logs == [LOG_NAME, f"{LOG_NAME}.1", f"{LOG_NAME}.2"]
    for name in logs:
        size = (node.state_dir / name).stat().st_size
        assert size <= cap + 4096, (name, size)
        assert (node.state_dir / name).stat().st_mode & 0o777 == 0o600
    assert node.client().ping().pid == node.pid
