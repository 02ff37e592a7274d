"""The stand-in bound where a failed owner listened (runtime/node/tombstone.py; DESIGN §1).

A real ZeroMQ context, socket file and DEALER peer: once `start` returns, the failed owner's
endpoint answers, so the OwnerSupervisor can show the owner `failed` only after it (R-NODE:
its callers learn it at once, never that no node runs).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from subagents_node.messages.codec import decode, encode
from subagents_node.messages.envelope import Envelope
from subagents_node.messages.errors import OwnerUnavailable
from subagents_node.node.tombstone import Tombstone
from tests.support.nodes import error_of


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.term()


def test_a_stand_in_is_bound_and_answers_once_start_returns(
    zctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path
) -> None:
    """The race CI met: `failed` was shown while the stand-in's thread had not bound yet, and a
    caller that read it found no socket file (NodeNotRunning instead of OwnerUnavailable)."""
    path = tmp_path / "fanout.sock"
    stand_in = Tombstone(zctx, f"ipc://{path}", "fanout", "crashed 4 times within 5s (limit 3)")
    assert stand_in.start()
    try:
        assert path.exists(), "start returned before the stand-in was bound"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        peer = zctx.socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        try:
            peer.connect(f"ipc://{path}")
            ask = Envelope(type="fanout.claim", body={}, target="fanout", sender="c-1")
            peer.send_multipart([encode(ask)])
            assert peer.poll(5000), "the stand-in did not answer in 5 s"
            answer = decode(peer.recv_multipart()[0])
        finally:
            peer.close()
        assert answer.corr == ask.id
        error = error_of(answer)
        assert isinstance(error, OwnerUnavailable)
        assert error.details["owner"] == "fanout"
        assert error.details["state"] == "failed"
        assert "crashed 4 times" in str(error)
    finally:
        stand_in.stop()


def test_a_stand_in_that_cannot_bind_says_so(
    zctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bind that fails (here: a directory that does not exist) is logged and reported."""
    stand_in = Tombstone(zctx, f"ipc://{tmp_path}/gone/fanout.sock", "fanout", "crashed")
    assert stand_in.start() is False
    stand_in.stop()
    assert "cannot stand in for failed owner fanout" in caplog.text
