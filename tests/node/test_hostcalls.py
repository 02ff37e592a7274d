"""A home's requests to its workers in flight (runtime/node/hostcalls.py, DESIGN §1
"Multi-host"): each is carried under a fresh id on the worker's own connection, answered to its
client under the client's id, answered `unavailable` when its deadline passes, and an answer
from any other peer, or late, changes nothing. HostCalls is the gateway thread's bookkeeping
(no socket of its own), so it is driven here directly; the fleet tests carry real requests."""

from __future__ import annotations

import pytest

from subagents_node.messages.codec import decode
from subagents_node.messages.envelope import ERROR, REPLY, Envelope
from subagents_node.messages.errors import Busy, OwnerUnavailable, SubagentsError, UnknownTarget
from subagents_node.node.hostcalls import HostCalls


def _up(name: str) -> SubagentsError | None:
    return None if name.startswith("w") else UnknownTarget(f"no worker {name}", target=name)


def _request(host: str = "w1") -> Envelope:
    return Envelope(type="runs.list", body={"limit": 1}, target="runs", sender="cli", host=host)


def test_a_request_goes_to_the_workers_connection_under_a_fresh_id_and_back_under_its_own() -> None:
    calls = HostCalls("home-node", _up)
    calls.linked("w1", b"conn-w1")
    request = _request()
    via, peer, frame = calls.send(request, 0, b"client-1")
    onward = decode(frame)
    assert (via, peer) == (1, b"conn-w1")
    assert onward.id != request.id and onward.host == "" and onward.body == request.body

    answer = Envelope(type=REPLY, body={"runs": []}, corr=onward.id, sender="w1-node")
    assert calls.answer(answer, "w2") is None  # another worker cannot answer for w1
    via, client, frame = calls.answer(answer, "w1") or (0, b"", b"")
    back = decode(frame)
    assert (via, client, back.corr, back.body) == (0, b"client-1", request.id, {"runs": []})
    assert calls.answer(answer, "w1") is None  # answered once; a repeat changes nothing
    assert calls.next_deadline() is None


def test_a_worker_not_linked_here_or_unknown_is_refused_before_anything_is_sent() -> None:
    calls = HostCalls("home-node", _up)
    with pytest.raises(OwnerUnavailable) as unlinked:
        calls.send(_request("w1"), 0, b"c")
    assert unlinked.value.details["reason"] == "host_unreachable"
    with pytest.raises(UnknownTarget):
        calls.send(_request("x1"), 0, b"c")
    assert calls.next_deadline() is None


def test_a_call_the_worker_does_not_answer_in_time_is_answered_unavailable_once() -> None:
    calls = HostCalls("home-node", _up, timeout_s=0.0)  # due the moment it is sent
    calls.linked("w1", b"conn-w1")
    request = _request()
    _, _, frame = calls.send(request, 0, b"client-1")
    assert calls.next_deadline() == 0.0
    (via, client, answer), *more = calls.expire()
    assert not more and (via, client) == (0, b"client-1")
    err = decode(answer)
    assert (err.type, err.corr) == (ERROR, request.id)
    assert err.body["details"]["reason"] == "host_timeout"
    late = Envelope(type=REPLY, body={}, corr=decode(frame).id)
    assert calls.answer(late, "w1") is None and calls.expire() == []


def test_in_flight_calls_are_bounded() -> None:
    calls = HostCalls("home-node", _up, limit=2)
    calls.linked("w1", b"conn-w1")
    calls.send(_request(), 0, b"a")
    calls.send(_request(), 0, b"b")
    with pytest.raises(Busy):
        calls.send(_request(), 0, b"c")
