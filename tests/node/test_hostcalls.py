"""A home's requests to its workers in flight (runtime/node/hostcalls.py, DESIGN §1
"Multi-host"): each is carried under a fresh id on the worker's own connection, answered to its
client under the client's id, answered `unavailable` when its deadline passes, and an answer
from any other peer changes nothing; a late answer to a request that changes something (a
launch: its outcome was unknown) is settled at the home, never sent on. HostCalls is the
gateway thread's bookkeeping (no socket of its own), so it is driven here directly; the fleet
tests carry real requests (test_multihost_late_answer.py: a worker answering late)."""

from __future__ import annotations

from collections.abc import Callable

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


def _member_in(state: str) -> Callable[[str], SubagentsError | None]:
    """A home's check where every worker is a member in `state` (`unreachable`: its heartbeats
    stopped; `lost`: forgotten)."""

    def check(name: str) -> SubagentsError | None:
        return OwnerUnavailable(
            f"worker {name!r} is {state}",
            owner="runs",
            state=state,
            reason="host_unreachable",
            host=name,
        )

    return check


_away = _member_in("unreachable")
_lost = _member_in("lost")


def _watch(host: str = "w1", wait_s: object = 5.0) -> Envelope:
    body = {"run_id": "abc", "after_seq": 0, "wait_s": wait_s}
    return Envelope(type="runs.watch", body=body, target="supervisor", sender="cli", host=host)


def test_a_watch_for_an_unreachable_worker_is_held_and_sent_when_the_worker_is_linked_again() -> (
    None
):
    reachable = {"w1": False}
    calls = HostCalls("home-node", lambda n: None if reachable[n] else _away(n))
    request = _watch(wait_s=5.0)
    assert calls.send(request, 0, b"client-1") is None  # held: nothing sent, nothing answered
    assert calls.expire() == []
    assert 4.0 < (calls.next_deadline() or 0.0) <= 5.0  # answered by the watch's own wait
    reachable["w1"] = True
    ((via, peer, frame),) = calls.linked("w1", b"conn-w1")
    onward = decode(frame)
    assert (via, peer, onward.type) == (1, b"conn-w1", "runs.watch")
    # The worker waits only what is left of what the client was promised.
    assert 4.0 < onward.body["wait_s"] <= 5.0 and onward.body["run_id"] == "abc"
    assert calls.linked("w1", b"conn-w1") == []  # sent once
    answer = Envelope(type=REPLY, body={"events": []}, corr=onward.id, sender="w1-node")
    via, client, back = calls.answer(answer, "w1") or (0, b"", b"")
    assert (client, decode(back).corr) == (b"client-1", request.id)


def test_a_held_watch_whose_worker_stays_away_is_answered_host_unreachable_once() -> None:
    calls = HostCalls("home-node", _away)
    request = _watch(wait_s=0.0)  # due at once
    assert calls.send(request, 0, b"client-1") is None
    ((_via, client, frame),) = calls.expire()
    err = decode(frame)
    assert (client, err.type, err.corr) == (b"client-1", ERROR, request.id)
    assert err.body["details"]["reason"] == "host_unreachable"
    assert calls.expire() == [] and calls.next_deadline() is None
    assert calls.linked("w1", b"conn-w1") == []  # nothing is left to send


def test_an_answer_to_a_held_watch_that_was_never_sent_changes_nothing() -> None:
    calls = HostCalls("home-node", _away)
    calls.send(_watch(), 0, b"client-1")
    (call_id,) = list(calls._calls)
    assert calls.answer(Envelope(type=REPLY, body={}, corr=call_id), "w1") is None
    assert calls.next_deadline() is not None  # still held


@pytest.mark.parametrize("wait_s", [61.0, -1.0, float("nan"), "5", True, None])
def test_a_watch_for_a_lost_worker_or_with_a_wait_it_may_not_have_is_refused_at_once(
    wait_s: object,
) -> None:
    with pytest.raises(OwnerUnavailable):
        HostCalls("home-node", _lost).send(_watch(), 0, b"c")
    with pytest.raises(OwnerUnavailable):
        HostCalls("home-node", _away).send(_watch(wait_s=wait_s), 0, b"c")


def test_only_long_polls_are_held_and_held_ones_count_toward_the_bound() -> None:
    calls = HostCalls("home-node", _away, limit=1)
    with pytest.raises(OwnerUnavailable):
        calls.send(_request(), 0, b"a")  # runs.list: answered now
    calls.send(_watch(), 0, b"b")
    with pytest.raises(Busy):
        calls.send(_watch(), 0, b"c")


def _launch(session: str = "s1") -> Envelope:
    return Envelope(
        type="runs.launch", body={"session_id": session}, target="supervisor", host="w1"
    )


def test_a_launch_given_up_on_says_its_outcome_is_unknown_and_its_late_answer_is_settled() -> None:
    settled: list[tuple[str, object]] = []
    calls = HostCalls("home-node", _up, timeout_s=0.0)
    calls.linked("w1", b"conn-w1")
    _, _, frame = calls.send(
        _launch(), 0, b"client-1", lambda kind, body: settled.append((kind, body))
    )
    ((_, _, answer),) = calls.expire()
    details = decode(answer).body["details"]
    assert (details["reason"], details["outcome"], details["session_id"]) == (
        "host_timeout",
        "unknown",
        "s1",
    )
    assert "runs --session s1" in decode(answer).body["message"]
    late = Envelope(type=REPLY, body={"run": {"run_id": "r1"}}, corr=decode(frame).id)
    assert calls.answer(late, "w2") is None and settled == []  # not w2's to answer
    assert calls.answer(late, "w1") is None  # nobody waits for it: nothing goes out
    assert settled == [(REPLY, {"run": {"run_id": "r1"}})]  # but the home settled it
    assert calls.answer(late, "w1") is None and len(settled) == 1  # once


def test_a_read_only_request_given_up_on_is_not_kept_and_says_nothing_of_an_outcome() -> None:
    settled: list[str] = []
    calls = HostCalls("home-node", _up, timeout_s=0.0)
    calls.linked("w1", b"conn-w1")
    _, _, frame = calls.send(_request(), 0, b"c", lambda kind, body: settled.append(kind))
    ((_, _, answer),) = calls.expire()
    assert "outcome" not in decode(answer).body["details"]
    assert calls.answer(Envelope(type=REPLY, body={}, corr=decode(frame).id), "w1") is None
    assert settled == []


def test_launches_kept_for_a_late_answer_are_bounded_oldest_first() -> None:
    settled: list[str] = []
    calls = HostCalls("home-node", _up, timeout_s=0.0, late_limit=1)
    calls.linked("w1", b"conn-w1")
    ids = []
    for session in ("old", "new"):
        _, _, frame = calls.send(
            _launch(session), 0, b"c", lambda kind, body, s=session: settled.append(s)
        )
        ids.append(decode(frame).id)
        calls.expire()
    for corr in ids:
        calls.answer(Envelope(type=REPLY, body={}, corr=corr), "w1")
    assert settled == ["new"]


def test_any_request_for_a_worker_not_heard_from_since_the_home_started_waits_for_its_beat() -> (
    None
):
    """A home just restarted has not heard from its workers yet: a launch for one used to be
    refused at once ("nothing was sent"), even the launch a client sent again after the home
    it first went to was killed, whose first send that worker may hold. It waits for the
    worker's first heartbeat instead, and goes out unchanged (no long poll's `wait_s`)."""
    calls = HostCalls("home-node", _away, awaited=lambda name: 3.0)
    request = _launch()
    assert calls.send(request, 0, b"client-1") is None  # held: nothing sent, nothing answered
    assert 2.0 < (calls.next_deadline() or 0.0) <= 3.0
    ((via, peer, frame),) = calls.linked("w1", b"conn-w1")
    onward = decode(frame)
    assert (via, peer, onward.type, onward.body) == (1, b"conn-w1", "runs.launch", request.body)
    assert (calls.next_deadline() or 0.0) > 3.0  # now the worker's own answer is awaited
    answer = Envelope(type=REPLY, body={"run_id": "r1"}, corr=onward.id, sender="w1-node")
    assert calls.answer(answer, "w1") is not None


def test_a_worker_joined_but_not_linked_yet_is_awaited_and_one_that_stays_silent_refused() -> None:
    calls = HostCalls("home-node", _up, awaited=lambda name: 2.0)
    assert calls.send(_request(), 0, b"c") is None  # up (it joined), its link comes next
    late = HostCalls("home-node", _away, awaited=lambda name: 1e-9)  # its first beat is due
    request = _launch()
    assert late.send(request, 0, b"client-1") is None
    ((_via, client, frame),) = late.expire()
    err = decode(frame)
    assert (client, err.type, err.corr) == (b"client-1", ERROR, request.id)
    assert err.body["details"]["reason"] == "host_unreachable"  # nothing was sent
    assert late.linked("w1", b"conn-w1") == []
