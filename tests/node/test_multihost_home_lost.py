"""A worker's request in flight to its home when the home is killed (DESIGN §1 "Multi-host";
actors/links.py `other_host_lost`): it is answered as soon as the worker's home link finds the
home lost (silent for the membership's heartbeat timeout), once, with `unavailable` (reason
`home_unreachable_in_flight`, outcome unknown). A home that only misses a beat or two (busy,
or stopped a moment) is not lost: what is in flight to it is answered by the home.

It used to wait out the worker's whole remote timeout (5 s) and then be answered `timeout`,
although the link had said seconds before that the home was gone.

Real nodes on loopback: a home and one worker, each a process with its own state dir and
keys; the home's fan-out owner is held (SIGSTOP) so that a claim stays in flight, and the home
is then killed with SIGKILL. Nothing is mocked.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress

import pytest
import zmq

from subagents_node.messages.envelope import Envelope
from subagents_node.messages.errors import OwnerUnavailable
from subagents_node.messages.fanout import ClaimPaths
from tests.support.fleet import Fleet, fleet
from tests.support.nodes import RawPeer, error_of
from tests.support.runs import stop_process, stopped, wait_until

pytestmark = pytest.mark.slow

#: The worker's own deadline for a request to its home (runtime/node/options.py default).
REMOTE_TIMEOUT_S = 5.0


@pytest.fixture
def crew() -> Iterator[Fleet]:
    # A short beat: the worker sees its home gone within a fraction of a second.
    with fleet(("w1",), heartbeat=(0.2, 1.5)) as started:
        yield started


def _owner_pid(crew: Fleet, name: str) -> int:
    actor = next(a for a in crew.home.status().actors if a.name == name)
    assert actor.pid is not None, f"the home's {name} owner has no pid"
    return actor.pid


def test_a_claim_in_flight_when_the_home_is_killed_is_answered_once_as_soon_as_the_link_says_so(
    crew: Fleet,
) -> None:
    w1 = crew.workers["w1"]
    descriptor = crew.client(w1).fanout.create(f"lost-{uuid.uuid4().hex}", 10)
    assert crew.client(w1).fanout.claim(descriptor, ["a"]).used == 1
    fanout_pid = _owner_pid(crew, "fanout")
    stop_process(fanout_pid)  # the claim below reaches it and waits there, unanswered
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    peer = RawPeer(zctx, w1.address)
    try:
        claim = ClaimPaths(descriptor=descriptor, paths=["b"])
        sent = peer.send_env(Envelope(type=claim.type, body=claim.to_body(), target="fanout"))
        # The worker's gateway relays in the order it reads: once the ping after the claim is
        # answered, the claim is in flight to the home.
        assert peer.ping().type != "error"
        crew.close_client(crew.home)
        crew.home.kill()
        killed = time.monotonic()
        reply = peer.recv_env(timeout=3 * REMOTE_TIMEOUT_S)
        took = time.monotonic() - killed
        assert reply is not None and reply.corr == sent, "the claim in flight went unanswered"
        err = error_of(reply)
        assert isinstance(err, OwnerUnavailable), err
        assert err.details.get("reason") == "home_unreachable_in_flight", err.to_wire()
        assert err.details.get("outcome") == "unknown", err.to_wire()
        assert "outcome is unknown" in err.message
        # Answered when the link said the home was gone, before the deadline would have fired.
        assert took < REMOTE_TIMEOUT_S, f"answered after {took:.1f}s"
        cluster = w1.status().cluster
        assert cluster is not None and cluster.state == "unreachable"
        # Once: the next frame on this socket is the next request's answer, not a second one.
        pong = peer.ping()
        assert pong.type != "error"
    finally:
        peer.close()
        zctx.term()
        with suppress(ProcessLookupError):  # died with its node, or is killed here
            os.kill(fanout_pid, signal.SIGKILL)
    # The home back: the worker joins again and claims are admitted (the held one never was).
    crew.home.start()
    wait_until(
        lambda: (c := w1.status().cluster) is not None and c.state == "joined",
        what="w1 sees its home back",
    )
    assert crew.client(w1).fanout.claim(descriptor, ["c"]).used == 2


def test_a_home_that_misses_a_beat_but_comes_back_still_answers_what_was_in_flight() -> None:
    # A timeout far above the beat: the worker sees its home unreachable (one missed beat)
    # long before it would call it lost.
    with fleet(("w1",), heartbeat=(0.2, 4.0)) as crew:
        w1 = crew.workers["w1"]
        descriptor = crew.client(w1).fanout.create(f"slow-{uuid.uuid4().hex}", 10)
        fanout_pid = _owner_pid(crew, "fanout")
        zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        peer = RawPeer(zctx, w1.address)
        try:
            with stopped(fanout_pid):
                claim = ClaimPaths(descriptor=descriptor, paths=["a"])
                sent = peer.send_env(
                    Envelope(type=claim.type, body=claim.to_body(), target="fanout")
                )
                assert peer.ping().type != "error"  # the claim is in flight
                with stopped(crew.home.pid):
                    wait_until(
                        lambda: (c := w1.status().cluster) is not None and c.state == "unreachable",
                        what="w1 sees its home miss a beat",
                    )
                wait_until(
                    lambda: (c := w1.status().cluster) is not None and c.state == "joined",
                    what="w1 sees its home answer again",
                )
            reply = peer.recv_env(timeout=3 * REMOTE_TIMEOUT_S)
            assert reply is not None and reply.corr == sent, "the claim went unanswered"
            assert reply.type != "error", reply.body
            assert crew.client(w1).fanout.snapshot(descriptor).used == 1
        finally:
            peer.close()
            zctx.term()
