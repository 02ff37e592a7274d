"""The active async capacity ledger, rule by rule (SPEC §4 R-CAP-*, §0.4, A-2, A-14, A-17).

Every test talks to a real CapacityLedger inside an embedded node through the client API
(in-process transport unless it says zmq). A refused request must change nothing: `_state`
captures the pool before and after.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
import zmq

from subagents_node import Client, Node, connect
from subagents_node.actors.capacity.ledger import CapacityLedger
from subagents_node.actors.capacity.rules import NO_SLOT
from subagents_node.actors.context import ActorContext
from subagents_node.actors.inbox import Job
from subagents_node.client.capacity import CapacityHandle
from subagents_node.messages.capacity import (
    Acquire,
    AcquireResult,
    CapacitySnapshot,
    MarkStarted,
    Rollback,
    RollbackResult,
    RunnerProof,
    SlotHandle,
    Snapshot,
)
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import (
    BadRequest,
    CapacityExhausted,
    CapacityNotTransferable,
    CapacityOwnershipChanged,
    CapacityRunAlreadyHeld,
)
from subagents_node.node.store import Store
from subagents_node.node.timers import Timers
from tests.support.nodes import short_dir

# -- fixtures -------------------------------------------------------------------------------


def _state_dir() -> Path:
    return short_dir()


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    directory = _state_dir()
    try:
        with Node.embedded(state_dir=directory) as running:
            yield running
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def client(node: Node) -> Client:
    return node.client()


@pytest.fixture
def sid() -> str:
    """A fresh session: pools of different sessions never interact (R-CAP-1)."""
    return f"session-{uuid.uuid4().hex[:8]}"


def _state(client: Client, session_id: str, *runs: str) -> tuple[Any, ...]:
    """Everything observable about a pool: used, and each run's inspection."""
    used = client.capacity.snapshot(session_id).used
    return (used, *(client.capacity.inspect(r, session_id).model_dump() for r in runs))


def _acquire(client: Client, session_id: str, run_id: str, limit: int = 4, **kw: Any) -> Any:
    handle = client.capacity.acquire(session_id=session_id, limit=limit, run_id=run_id, **kw)
    assert handle is not None
    return handle


def _observed(runner_id: str, **kw: Any) -> RunnerProof:
    return RunnerProof(state="observed", runner_id=runner_id, exit_code=0, **kw)


def _raw_call(address: str, type_: str, body: dict[str, Any]) -> Envelope:
    """One hand-made frame to the node's socket, bypassing the client's validation."""
    with zmq.Context() as zctx, zctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sock.send(encode(Envelope(type=type_, body={**body, "run_id": "b"}, target="capacity")))
        assert sock.poll(5000), "no reply from the node"
        return decode(sock.recv())


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until `condition()` holds (the node's timers act on their own schedule)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        pause.wait(0.02)


def _finished_source(client: Client, session_id: str, run_id: str = "a") -> CapacityHandle:
    """A started run that ended without proof: terminal, so transferable, and still held."""
    handle = _acquire(client, session_id, run_id)
    handle.mark_started(runner_id=f"runner-{run_id}", pid=4242, process_start_time=17.5)
    verdict = client.capacity.report_terminal(session_id, run_id, "failed")
    assert verdict.verdict == "retained"
    return handle


# -- acquire --------------------------------------------------------------------------------


def test_r_cap_8_inv_cap_6_unlimited_acquire_records_nothing(client: Client, sid: str) -> None:
    for _ in range(3):
        assert client.capacity.acquire(session_id=sid, limit=0, run_id="a") is None
    assert client.capacity.snapshot(sid) == CapacitySnapshot(used=0, limit=0)
    assert client.capacity.inspect("a", sid).relation == "none"


def test_r_cap_10_acquire_takes_the_lowest_free_index(client: Client, sid: str) -> None:
    handles = {run: _acquire(client, sid, run) for run in "abc"}
    assert [h.slot for h in handles.values()] == [0, 1, 2]
    assert handles["b"].rollback()
    assert _acquire(client, sid, "d").slot == 1
    assert _acquire(client, sid, "e").slot == 3


def test_r_cap_2_acquire_creates_a_complete_owner_record(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a", kind="workflow", async_dir="/runs/a", ttl_s=30)
    owner = client.capacity.inspect("a", sid).owner
    assert owner is not None
    assert owner.session_key == hashlib.sha256(sid.encode()).hexdigest()
    assert (owner.slot, owner.token, owner.generation) == (0, handle.token, 0)
    assert (owner.kind, owner.async_dir, owner.source_run_id) == ("workflow", "/runs/a", None)
    assert owner.expires_at == pytest.approx(owner.reserved_at + 30)
    assert not owner.started
    assert handle.snapshot == CapacitySnapshot(used=1, limit=4)


def test_r_cap_9_r_cap_12_exhausted_error_carries_the_snapshot_and_changes_nothing(
    client: Client, sid: str
) -> None:
    _acquire(client, sid, "a", limit=2)
    _acquire(client, sid, "b", limit=2)
    before = _state(client, sid, "a", "b", "c")
    with pytest.raises(CapacityExhausted) as caught:
        client.capacity.acquire(session_id=sid, limit=2, run_id="c")
    assert caught.value.message == "Active async run capacity exhausted: 2/2 used."
    assert caught.value.snapshot == CapacitySnapshot(used=2, limit=2)
    assert caught.value.details == {"used": 2, "limit": 2}
    assert _state(client, sid, "a", "b", "c") == before


def test_r_cap_12_exhausted_error_crosses_the_wire_with_its_snapshot(
    node: Node, client: Client, sid: str
) -> None:
    _acquire(client, sid, "a", limit=1)
    remote = node.client("zmq")
    with pytest.raises(CapacityExhausted) as caught:
        remote.capacity.acquire(session_id=sid, limit=1, run_id="b")
    assert caught.value.snapshot == CapacitySnapshot(used=1, limit=1)
    assert str(caught.value) == "Active async run capacity exhausted: 1/1 used."


def test_r_cap_3_a_17_slots_above_a_lowered_limit_still_count(client: Client, sid: str) -> None:
    handles = [_acquire(client, sid, run, limit=3) for run in "abc"]
    with pytest.raises(CapacityExhausted, match=r"3/2 used"):
        client.capacity.acquire(session_id=sid, limit=2, run_id="d")
    assert handles[0].rollback()
    with pytest.raises(CapacityExhausted, match=r"2/2 used"):
        client.capacity.acquire(session_id=sid, limit=2, run_id="d")
    assert handles[1].rollback()
    assert _acquire(client, sid, "d", limit=2).slot == 0
    assert client.capacity.snapshot(sid, 2) == CapacitySnapshot(used=2, limit=2)


def test_r_cap_1_pools_of_different_sessions_never_interact(client: Client, sid: str) -> None:
    other = f"{sid}-other"
    _acquire(client, sid, "a", limit=1)
    assert _acquire(client, other, "a", limit=1).slot == 0
    assert client.capacity.snapshot(sid).used == 1
    assert client.capacity.snapshot(other).used == 1


def test_acquire_refuses_a_run_that_already_holds_a_slot(client: Client, sid: str) -> None:
    _acquire(client, sid, "a")
    before = _state(client, sid, "a")
    with pytest.raises(CapacityRunAlreadyHeld) as caught:
        client.capacity.acquire(session_id=sid, limit=4, run_id="a")
    assert (caught.value.run_id, caught.value.slot) == ("a", 0)
    assert _state(client, sid, "a") == before


def test_r_cap_10_an_acquire_sent_again_under_its_id_answers_the_slot_it_took(
    client: Client, sid: str
) -> None:
    """What the run supervisor sends again after its capacity owner died with the answer
    (actors/pipelines.py): the same acquire id names the slot it took, whose token it is; a
    second slot is never taken, and another id for the same run is still refused."""
    first = client.capacity.acquire(session_id=sid, limit=2, run_id="a", acquire_id="acq-1")
    assert first is not None and first.token == "acq-1"
    again = client.capacity.acquire(session_id=sid, limit=2, run_id="a", acquire_id="acq-1")
    assert again is not None and again.wire == first.wire
    assert client.capacity.snapshot(sid, 2).used == 1
    with pytest.raises(CapacityRunAlreadyHeld):
        client.capacity.acquire(session_id=sid, limit=2, run_id="a", acquire_id="acq-2")
    with pytest.raises(CapacityRunAlreadyHeld):
        client.capacity.acquire(session_id=sid, limit=2, run_id="a")
    assert client.capacity.snapshot(sid, 2).used == 1


def test_r_cap_10_an_acquire_id_that_names_another_runs_slot_is_refused_and_takes_nothing(
    client: Client, sid: str
) -> None:
    """An acquire id is one acquire's: reused for another run of the session while the first
    run's slot carries it, it is a BadRequest naming the field, and no slot is taken (it took a
    second slot under the same token, so the id named two grants). Once that slot is gone the
    id names nothing, and another run may use it."""
    first = client.capacity.acquire(session_id=sid, limit=3, run_id="a", acquire_id="acq-r")
    assert first is not None
    with pytest.raises(BadRequest) as caught:
        client.capacity.acquire(session_id=sid, limit=3, run_id="b", acquire_id="acq-r")
    assert caught.value.details["field"] == "acquire_id"
    assert caught.value.details["run_id"] == "a"
    assert client.capacity.snapshot(sid, 3).used == 1
    assert client.capacity.inspect("b", sid).relation == "none"
    first.rollback()
    again = client.capacity.acquire(session_id=sid, limit=3, run_id="b", acquire_id="acq-r")
    assert again is not None and again.token == "acq-r"
    assert client.capacity.snapshot(sid, 3).used == 1


def test_r_cap_18_a_transfer_sent_again_under_its_id_answers_the_slot_it_lent(
    client: Client, sid: str
) -> None:
    """The same transfer sent again (the run supervisor's, after its capacity owner died with
    the answer) answers the slot it lent to the resume, one generation as before; a source
    that held no slot is acquired under the transfer's id, and answered the same way."""
    _finished_source(client, sid, "src")
    moved = client.capacity.transfer(sid, 2, "src", "res", transfer_id="t-1")
    again = client.capacity.transfer(sid, 2, "src", "res", transfer_id="t-1")
    assert moved is not None and again is not None and again.wire == moved.wire
    assert client.capacity.snapshot(sid, 2).used == 1
    fresh = client.capacity.transfer(sid, 2, "none", "new", transfer_id="t-2")
    twice = client.capacity.transfer(sid, 2, "none", "new", transfer_id="t-2")
    assert fresh is not None and twice is not None and twice.wire == fresh.wire
    assert client.capacity.snapshot(sid, 2).used == 2


@pytest.mark.parametrize("limit", [-1, 2.5, "4", True, None])
@pytest.mark.parametrize("transport", ["inproc", "zmq"])
def test_r_cfg_1_bad_limit_is_a_schema_error_not_unlimited(
    node: Node, client: Client, sid: str, limit: Any, transport: str
) -> None:
    caller = client if transport == "inproc" else node.client("zmq")
    _acquire(client, sid, "a")
    before = _state(client, sid, "a", "b")
    with pytest.raises(BadRequest) as caught:
        caller.capacity.acquire(session_id=sid, limit=limit, run_id="b")
    assert caught.value.details["reason"] == "schema"
    if transport == "zmq":  # the gateway refuses the same body from a client that skips the check
        reply = _raw_call(node.address, "capacity.acquire", {"session_id": sid, "limit": limit})
        assert (reply.type, reply.body["code"]) == (ERROR, "bad_request")
        assert "limit" in reply.body["message"]
    assert _state(client, sid, "a", "b") == before


# -- mark started ---------------------------------------------------------------------------


def test_r_cap_13_mark_started_records_the_runner_identity(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a", ttl_s=30)
    handle.mark_started(runner_id="runner-1", pid=99, process_start_time=12.25)
    owner = client.capacity.inspect("a", sid).owner
    assert owner is not None and owner.started
    assert (owner.runner_id, owner.pid, owner.process_start_time) == ("runner-1", 99, 12.25)
    assert owner.runner_started_at is not None and owner.expires_at is None
    assert handle.started


def test_r_cap_13_mark_started_is_idempotent_for_the_same_runner(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-1")
    before = _state(client, sid, "a")
    client.capacity.handle(handle.wire).mark_started(runner_id="runner-1")
    assert _state(client, sid, "a") == before


def test_r_cap_13_a_second_runner_identity_is_refused(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-1")
    before = _state(client, sid, "a")
    with pytest.raises(CapacityOwnershipChanged) as caught:
        client.capacity.handle(handle.wire).mark_started(runner_id="runner-2")
    assert caught.value.reason == "runner_conflict"
    assert _state(client, sid, "a") == before


_FORGERIES: dict[str, Callable[[SlotHandle], SlotHandle]] = {
    "token_mismatch": lambda h: h.model_copy(update={"token": uuid.uuid4().hex}),
    "generation_mismatch": lambda h: h.model_copy(update={"generation": h.generation + 1}),
    "run_mismatch": lambda h: h.model_copy(update={"run_id": "intruder"}),
    "kind_mismatch": lambda h: h.model_copy(update={"kind": "workflow"}),
    "slot_gone": lambda h: h.model_copy(update={"slot": 7}),
}


@pytest.mark.parametrize("reason", sorted(_FORGERIES))
def test_r_cap_4_stale_or_forged_handles_are_refused_and_change_nothing(
    client: Client, sid: str, reason: str
) -> None:
    handle = _acquire(client, sid, "a")
    forged = client.capacity.handle(_FORGERIES[reason](handle.wire))
    before = _state(client, sid, "a", "intruder")
    with pytest.raises(CapacityOwnershipChanged) as caught:
        forged.mark_started(runner_id="runner-x")
    assert caught.value.reason == reason
    assert caught.value.message == (
        f"Active async capacity ownership changed for run '{forged.run_id}'."
    )
    assert not client.capacity.handle(_FORGERIES[reason](handle.wire)).rollback()
    assert _state(client, sid, "a", "intruder") == before


def test_a_14_mark_started_cannot_fail_for_the_current_handle(client: Client, sid: str) -> None:
    handles = [_acquire(client, sid, run) for run in "abcd"]
    for index, handle in enumerate(handles):
        handle.mark_started(runner_id=f"runner-{index}")
    assert all(client.capacity.inspect(h.run_id, sid).owner.started for h in handles)  # type: ignore[union-attr]


def test_r_cap_14_mark_workflow_started_sets_only_the_start_time(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "wf", kind="workflow")
    handle.mark_workflow_started()
    owner = client.capacity.inspect("wf", sid).owner
    assert owner is not None and owner.started
    assert owner.runner_id is None and owner.runner_started_at is not None


def test_r_cap_14_workflow_start_of_a_runner_slot_is_refused(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a")
    before = _state(client, sid, "a")
    with pytest.raises(CapacityOwnershipChanged) as caught:
        client.capacity.handle(handle.wire).mark_workflow_started()
    assert caught.value.message == "Active async capacity ownership changed for workflow 'a'."
    assert _state(client, sid, "a") == before


def test_r_cap_6_a_workflow_slot_with_only_a_start_time_is_started(
    client: Client, sid: str
) -> None:
    """No runner id, only `runner_started_at`: still started, so never rolled back, never
    expired by its TTL, and counted as started (not reserved) per host."""
    before = {h.host: (h.reserved, h.started) for h in client.capacity.hosts().hosts}
    handle = _acquire(client, sid, "wf", kind="workflow", ttl_s=1.0)
    handle.mark_workflow_started()
    # The TTL's witness: acquired later with the same TTL, it expires after wf's would have.
    lapsing = _acquire(client, sid, "lapsing", ttl_s=1.0)
    owner = client.capacity.inspect("wf", sid).owner
    assert owner is not None and owner.runner_id is None and owner.started

    _wait_for(lambda: client.capacity.inspect(lapsing.run_id, sid).relation == "none")
    assert client.capacity.handle(handle.wire).rollback() is False  # the ledger's copy
    assert handle.rollback() is False  # and the caller's
    assert client.capacity.inspect("wf", sid).owner == owner
    reserved, started = before.get("", (0, 0))
    after = {h.host: (h.reserved, h.started) for h in client.capacity.hosts().hosts}
    assert after[""] == (reserved, started + 1)


# -- rollback -------------------------------------------------------------------------------


def test_r_cap_15_rollback_removes_a_fresh_unstarted_slot(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a")
    assert handle.rollback() is True
    assert client.capacity.snapshot(sid).used == 0
    assert client.capacity.inspect("a", sid).relation == "none"


def test_r_cap_17_rollback_is_idempotent(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a")
    assert handle.rollback() is True
    assert handle.rollback() is False
    assert client.capacity.snapshot(sid).used == 0


def test_r_cap_17_inv_cap_3_rollback_after_start_is_refused_and_changes_nothing(
    client: Client, sid: str
) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-1")
    before = _state(client, sid, "a")
    assert handle.rollback() is False  # the caller's copy knows it started
    assert client.capacity.handle(handle.wire).rollback() is False  # so does the ledger
    assert _state(client, sid, "a") == before


def test_r_cap_17_rollback_of_a_slot_now_owned_by_another_run_returns_false(
    client: Client, sid: str
) -> None:
    stale = _acquire(client, sid, "a")
    assert stale.rollback()
    _acquire(client, sid, "b")
    before = _state(client, sid, "a", "b")
    assert client.capacity.handle(stale.wire).rollback() is False
    assert _state(client, sid, "a", "b") == before


def test_r_adm_3_handle_context_rolls_back_unless_started(client: Client, sid: str) -> None:
    with pytest.raises(RuntimeError), _acquire(client, sid, "a"):
        raise RuntimeError("spawn failed")
    with _acquire(client, sid, "b") as handle:
        handle.mark_started(runner_id="runner-b")
    assert client.capacity.inspect("a", sid).relation == "none"
    assert client.capacity.inspect("b", sid).relation == "current"


def _start_racing_rollback(starter: Client, roller: Client, wire: SlotHandle) -> tuple[bool, bool]:
    """mark_started from `starter` and rollback from `roller`, released at one instant:
    (whether the start was accepted, whether the rollback was)."""
    barrier = threading.Barrier(2)
    seen: dict[str, bool] = {}

    def start() -> None:
        barrier.wait()
        try:
            starter.capacity.handle(wire).mark_started(runner_id="runner")
            seen["started"] = True
        except CapacityOwnershipChanged:
            seen["started"] = False

    def roll() -> None:
        barrier.wait()
        seen["rolled_back"] = roller.capacity.handle(wire).rollback()

    threads = [threading.Thread(target=start), threading.Thread(target=roll)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    return seen["started"], seen["rolled_back"]


def test_r_cap_5_a_start_racing_a_rollback_of_one_slot_from_two_processes_is_all_or_nothing(
    node: Node, sid: str
) -> None:
    """Two clients (two sockets, as two processes would have) send mark_started and rollback
    for the same slot at the same instant. Exactly one wins: started and held, or rolled back
    and free; never both, never neither (the original's claim file made mere contention fail)."""
    with connect(node.address, timeout=10) as starter, connect(node.address, timeout=10) as roller:
        for round_ in range(40):
            run_id = f"race-{round_}"
            wire = _acquire(starter, sid, run_id, limit=1).wire
            started, rolled_back = _start_racing_rollback(starter, roller, wire)
            assert started is not rolled_back, (started, rolled_back)
            inspection = starter.capacity.inspect(run_id, sid)
            if started:
                assert inspection.owner is not None and inspection.owner.runner_id == "runner"
                proof = _observed("runner")
                verdict = starter.capacity.report_terminal(sid, run_id, "complete", proof=proof)
                assert verdict.verdict == "releasable"
            else:
                assert inspection.relation == "none"
            assert starter.capacity.snapshot(sid).used == 0


# -- transfer -------------------------------------------------------------------------------


def test_r_cap_18_transfer_replaces_the_record_and_keeps_token_and_slot(
    client: Client, sid: str
) -> None:
    source = _finished_source(client, sid)
    moved = client.capacity.transfer(
        session_id=sid, limit=4, source_run_id="a", run_id="b", async_dir="/runs/b"
    )
    assert moved is not None
    owner = client.capacity.inspect("b", sid).owner
    assert owner is not None
    assert (owner.slot, owner.token, owner.generation) == (source.slot, source.token, 1)
    assert (owner.run_id, owner.source_run_id, owner.kind) == ("b", "a", "runner")
    assert owner.async_dir == "/runs/b" and not owner.started and owner.terminal is None
    assert owner.expires_at is not None
    assert (moved.run_id, moved.generation) == ("b", 1)
    seen = client.capacity.inspect("a", sid)
    assert seen.relation == "source"
    assert seen.verdict.reason == "slot was transferred to b"


def test_r_cap_16_inv_cap_4_transfer_then_rollback_restores_the_exact_source_record(
    client: Client, sid: str
) -> None:
    _finished_source(client, sid)
    before = _state(client, sid, "a", "b")
    moved = client.capacity.transfer(session_id=sid, limit=4, source_run_id="a", run_id="b")
    assert moved is not None and moved.rollback() is True
    assert _state(client, sid, "a", "b") == before
    assert (moved.run_id, moved.generation) == ("a", 0)  # the handle names the source again
    assert moved.rollback() is False  # the restored source is started


def test_r_cap_19_inv_cap_4_transfer_ignores_the_limit_and_keeps_used(
    client: Client, sid: str
) -> None:
    _finished_source(client, sid)
    _acquire(client, sid, "x")
    moved = client.capacity.transfer(session_id=sid, limit=1, source_run_id="a", run_id="b")
    assert moved is not None and moved.snapshot == CapacitySnapshot(used=2, limit=1)
    assert client.capacity.snapshot(sid).used == 2


def test_r_cap_20_transfer_without_a_source_slot_acquires(client: Client, sid: str) -> None:
    assert client.capacity.transfer(session_id=sid, limit=0, source_run_id="a", run_id="b") is None
    moved = client.capacity.transfer(session_id=sid, limit=1, source_run_id="a", run_id="b")
    assert moved is not None and (moved.slot, moved.generation, moved.kind) == (0, 0, "runner")
    with pytest.raises(CapacityExhausted, match=r"1/1 used"):
        client.capacity.transfer(session_id=sid, limit=1, source_run_id="a", run_id="c")


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        (None, "run is still running"),
        ({"state": "paused", "live_process": True}, "run is paused but its process is still live"),
        ({"state": "failed", "live_process": True}, "run is failed but its process is still live"),
    ],
)
def test_r_cap_18_a_2_transfer_from_a_source_that_may_run_is_refused(
    client: Client, sid: str, report: dict[str, Any] | None, reason: str
) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-a")
    if report is not None:
        client.capacity.report_terminal(sid, "a", **report)
    before = _state(client, sid, "a", "b")
    with pytest.raises(CapacityNotTransferable) as caught:
        client.capacity.transfer(session_id=sid, limit=4, source_run_id="a", run_id="b")
    assert caught.value.message == "Active async capacity source 'a' is not transferable."
    assert caught.value.reason == reason
    assert _state(client, sid, "a", "b") == before


def test_a_2_a_paused_source_without_a_live_process_is_transferable(
    client: Client, sid: str
) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-a")
    assert client.capacity.report_terminal(sid, "a", "paused").reason == "run is still paused"
    moved = client.capacity.transfer(session_id=sid, limit=4, source_run_id="a", run_id="b")
    assert moved is not None and moved.slot == handle.slot


def test_transfer_to_a_run_that_already_holds_a_slot_is_refused(client: Client, sid: str) -> None:
    _finished_source(client, sid)
    _acquire(client, sid, "b")
    before = _state(client, sid, "a", "b")
    for new_run in ("b", "a"):
        with pytest.raises(CapacityRunAlreadyHeld):
            client.capacity.transfer(session_id=sid, limit=4, source_run_id="a", run_id=new_run)
    assert _state(client, sid, "a", "b") == before


def test_r_cap_27_only_the_immediate_transfer_source_is_remembered(
    client: Client, sid: str
) -> None:
    a, b, c = (f"{sid}-{name}" for name in "abc")  # unique everywhere: inspected in all pools
    _finished_source(client, sid, a)
    moved = client.capacity.transfer(session_id=sid, limit=4, source_run_id=a, run_id=b)
    assert moved is not None
    moved.mark_started(runner_id="runner-b")
    client.capacity.report_terminal(sid, b, "stopped")
    assert client.capacity.transfer(session_id=sid, limit=4, source_run_id=b, run_id=c)
    assert client.capacity.inspect(a).relation == "none"
    assert client.capacity.inspect(b).verdict.reason == f"slot was transferred to {c}"
    assert client.capacity.inspect(c).relation == "current"


# -- release verdicts -----------------------------------------------------------------------


def test_r_cap_21_matching_observed_proof_releases_the_slot(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-a", pid=10, process_start_time=1.5)
    verdict = client.capacity.report_terminal(
        sid, "a", "complete", proof=_observed("runner-a", pid=10, process_start_time=1.5)
    )
    assert (verdict.verdict, verdict.reason) == (
        "releasable",
        "matching observed process-terminal proof is present",
    )
    assert client.capacity.snapshot(sid).used == 0
    assert client.capacity.inspect("a", sid).relation == "none"


def test_r_cap_21_rule_6_startup_failure_with_an_error_releases(client: Client, sid: str) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-a")
    proof = RunnerProof(state="not-started", runner_id="runner-a", error="handshake failed")
    verdict = client.capacity.report_terminal(sid, "a", "failed", proof=proof)
    assert verdict.reason == "run failed before child startup completed"
    assert client.capacity.snapshot(sid).used == 0


_RETAINED: dict[str, tuple[bool, dict[str, Any]]] = {
    "runner process identity has not been recorded": (
        False,
        {"state": "failed", "proof": _observed("runner-a")},
    ),
    "run is still paused": (True, {"state": "paused"}),
    "process-terminal proof is missing": (True, {"state": "complete"}),
    "process-terminal proof is unknown": (
        True,
        {"state": "failed", "proof": RunnerProof(state="unknown", runner_id="runner-a")},
    ),
    "process-terminal proof is not-started": (
        True,
        {"state": "failed", "proof": RunnerProof(state="not-started", runner_id="runner-a")},
    ),
    "runner process is still live": (
        True,
        {"state": "complete", "live_process": True, "proof": _observed("runner-a")},
    ),
}


@pytest.mark.parametrize("reason", sorted(_RETAINED))
def test_r_cap_21_inv_cap_8_runner_slot_is_retained_without_matching_proof(
    client: Client, sid: str, reason: str
) -> None:
    started, report = _RETAINED[reason]
    handle = _acquire(client, sid, "a")
    if started:
        handle.mark_started(runner_id="runner-a")
    verdict = client.capacity.report_terminal(sid, "a", **report)
    assert (verdict.verdict, verdict.reason) == ("retained", reason)
    seen = client.capacity.inspect("a", sid)
    assert seen.verdict == verdict
    assert seen.owner is not None and seen.owner.terminal_state == report["state"]
    assert client.capacity.snapshot(sid).used == 1


@pytest.mark.parametrize(
    "proof",
    [
        _observed("runner-other"),
        _observed("runner-a", pid=11),
        _observed("runner-a", process_start_time=2.0),
    ],
    ids=["other-runner", "other-pid", "reused-pid"],
)
def test_r_cap_21_proof_of_another_process_reads_as_unknown(
    client: Client, sid: str, proof: RunnerProof
) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-a", pid=10, process_start_time=1.5)
    verdict = client.capacity.report_terminal(sid, "a", "complete", proof=proof)
    assert verdict.reason == "process-terminal proof is unknown"
    assert client.capacity.inspect("a", sid).owner.proof_state == "unknown"  # type: ignore[union-attr]


def test_r_cap_24_a_later_report_releases_what_an_earlier_one_retained(
    client: Client, sid: str
) -> None:
    handle = _acquire(client, sid, "a")
    handle.mark_started(runner_id="runner-a")
    unknown = RunnerProof(state="unknown", runner_id="runner-a", reason="stale-repair")
    assert client.capacity.report_terminal(sid, "a", "failed", proof=unknown).verdict == "retained"
    verdict = client.capacity.report_terminal(sid, "a", "failed", proof=_observed("runner-a"))
    assert verdict.verdict == "releasable"
    assert client.capacity.snapshot(sid).used == 0


def test_r_cap_21_a_replayed_report_that_retained_a_slot_changes_nothing(
    client: Client, sid: str
) -> None:
    """The run supervisor's outbox resends a report whose answer it did not see: the second
    copy finds the same facts and leaves the record exactly as it was (its time included)."""
    run = f"{sid}-a"  # run ids of their own: other tests' runs still hold slots in this ledger
    handle = _acquire(client, sid, run)
    handle.mark_started(runner_id="runner-a")
    unknown = RunnerProof(state="unknown", runner_id="runner-a", reason="process-tree-unverified")
    first = client.capacity.report_terminal(sid, run, "failed", proof=unknown)
    before = _state(client, sid, run)
    assert client.capacity.report_terminal(sid, run, "failed", proof=unknown) == first
    assert _state(client, sid, run) == before


def test_r_cap_21_a_replayed_report_that_released_a_slot_changes_nothing(
    client: Client, sid: str
) -> None:
    """A replay after the slot was freed, and after the freed index went to another run
    (R-CAP-23: releasing is idempotent)."""
    run, other_run = f"{sid}-a", f"{sid}-b"
    handle = _acquire(client, sid, run, limit=1)
    handle.mark_started(runner_id="runner-a")
    proof = _observed("runner-a")
    released = client.capacity.report_terminal(sid, run, "complete", proof=proof)
    assert released.verdict == "releasable"
    other = _acquire(client, sid, other_run, limit=1)
    other.mark_started(runner_id="runner-b")
    before = _state(client, sid, run, other_run)
    again = client.capacity.report_terminal(sid, run, "complete", proof=proof)
    assert (again.verdict, again.reason) == ("not-owned", NO_SLOT)
    assert _state(client, sid, run, other_run) == before


@pytest.mark.parametrize(
    ("report", "verdict", "reason"),
    [
        (None, "retained", "workflow is still running"),
        ({"state": "paused"}, "retained", "workflow is still paused"),
        (
            {"state": "complete", "live_process": True, "workflow_children_proven": True},
            "retained",
            "workflow controller is still live",
        ),
        (
            {"state": "failed", "reason": "async workflow child scan is still running"},
            "retained",
            "async workflow child scan is still running",
        ),
        (
            {"state": "complete", "workflow_children_proven": True},
            "releasable",
            "workflow is terminal, controller is gone, and async children have observed proof",
        ),
    ],
)
def test_r_cap_22_inv_cap_8_workflow_verdict(
    client: Client, sid: str, report: dict[str, Any] | None, verdict: str, reason: str
) -> None:
    handle = _acquire(client, sid, "wf", kind="workflow")
    handle.mark_workflow_started()
    if report is None:
        seen = client.capacity.inspect("wf", sid).verdict
    else:
        seen = client.capacity.report_terminal(sid, "wf", **report)
    assert (seen.verdict, seen.reason) == (verdict, reason)
    assert client.capacity.snapshot(sid).used == (0 if verdict == "releasable" else 1)


def test_r_cap_23_reports_about_runs_without_a_slot_change_nothing(
    client: Client, sid: str
) -> None:
    """R-CAP-23 (reconcile, done here when a report arrives): only a slot of the reporting
    session whose identity still matches is released; a transferred source, another
    session's slot and a stale generation are left exactly as they were (the transferred
    source's report is kept for its slot's rollback: the next test)."""
    _finished_source(client, sid, "a")
    moved = client.capacity.transfer(session_id=sid, limit=4, source_run_id="a", run_id="b")
    assert moved is not None
    moved.mark_started(runner_id="runner-b")
    _acquire(client, f"{sid}-other", "z").mark_started(runner_id="runner-z")
    before = _state(client, sid, "a", "b", "z")
    cases = {
        "a": ("not-owned", "slot was transferred to b"),
        "nobody": ("not-owned", "no active-capacity slot records this run"),
        "z": ("retained", f"status session {sid} does not match owner session {sid}-other"),
    }
    for run_id, expected in cases.items():
        seen = client.capacity.report_terminal(sid, run_id, "complete", proof=_observed("r"))
        assert (seen.verdict, seen.reason) == expected
    stale = client.capacity.report_terminal(sid, "b", "complete", generation=0)
    assert stale.verdict == "not-owned"
    assert _state(client, sid, "a", "b", "z") == before


@pytest.mark.parametrize(("state", "freed"), [("stopped", True), ("paused", False)])
def test_r_cap_16_a_report_about_a_source_whose_transfer_is_unstarted_is_what_its_rollback_restores(
    client: Client, sid: str, state: str, freed: bool
) -> None:
    """A paused source's slot is lent to its resume until that resume starts. A stop of the
    source meanwhile was answered "transferred" and dropped, and the rollback (or TTL) then
    restored the source as paused: a stopped run held the slot for good. The report is now
    stored on the lent record, so the rollback frees a slot whose run has ended."""
    paused = _acquire(client, sid, "a")
    paused.mark_started(runner_id="runner-a")
    assert client.capacity.report_terminal(sid, "a", "paused").verdict == "retained"
    moved = client.capacity.transfer(session_id=sid, limit=4, source_run_id="a", run_id="b")
    assert moved is not None
    seen = client.capacity.report_terminal(sid, "a", state, proof=_observed("runner-a"))
    assert (seen.verdict, seen.reason) == ("not-owned", "slot was transferred to b")
    assert client.capacity.snapshot(sid).used == 1
    assert moved.rollback() is True
    held = client.capacity.inspect("a", sid)
    assert client.capacity.snapshot(sid).used == (0 if freed else 1)
    assert held.relation == ("none" if freed else "current")


def test_r_cap_18_a_transfer_sent_again_takes_over_the_unstarted_one_it_replaces(
    client: Client, sid: str
) -> None:
    """A resume sent again after its first transfer's answer was lost (that run was never
    recorded) used to acquire a second slot for the same source; it takes the lent slot over,
    one generation up, so the lost transfer's handle is fenced (R-CAP-4)."""
    _finished_source(client, sid, "a")
    lost = client.capacity.transfer(session_id=sid, limit=4, source_run_id="a", run_id="b")
    again = client.capacity.transfer(session_id=sid, limit=4, source_run_id="a", run_id="c")
    assert lost is not None and again is not None
    assert (again.slot, again.generation) == (lost.slot, lost.generation + 1)
    assert client.capacity.snapshot(sid).used == 1
    assert client.capacity.inspect("b", sid).relation == "none"
    assert lost.rollback() is False
    assert again.rollback() is True  # the source's own record comes back
    restored = client.capacity.inspect("a", sid)
    assert restored.relation == "current" and restored.owner is not None
    assert restored.owner.generation == 0


def test_r_cap_25_inspect_and_snapshot_never_free_capacity(client: Client, sid: str) -> None:
    _finished_source(client, sid)
    for _ in range(3):
        client.capacity.inspect("a")
        client.capacity.snapshot(sid, 1)
    assert client.capacity.snapshot(sid).used == 1


def test_r_cap_26_snapshot_reports_an_unlimited_cap_as_0(client: Client, sid: str) -> None:
    _acquire(client, sid, "a")
    assert client.capacity.snapshot(sid, 0) == CapacitySnapshot(used=1, limit=0)
    assert client.capacity.snapshot(sid, 3) == CapacitySnapshot(used=1, limit=3)


def test_r_cap_27_inspect_of_an_unknown_run_is_none(client: Client) -> None:
    seen = client.capacity.inspect(f"never-{uuid.uuid4().hex}")
    assert (seen.relation, seen.owner) == ("none", None)
    assert seen.verdict.reason == "no active-capacity slot records this run"


# -- reservation TTL (§0.4) and durability (R-CAP-7) -----------------------------------------


def test_unstarted_slot_is_freed_after_its_ttl_and_started_one_is_kept(
    client: Client, sid: str
) -> None:
    lapsed = _acquire(client, sid, "a", ttl_s=0.2)
    kept = _acquire(client, sid, "b", ttl_s=0.2)
    kept.mark_started(runner_id="runner-b")
    _wait_for(lambda: client.capacity.snapshot(sid).used == 1)
    assert client.capacity.inspect("a", sid).relation == "none"
    assert client.capacity.inspect("b", sid).relation == "current"
    with pytest.raises(CapacityOwnershipChanged, match="for run 'a'"):
        lapsed.mark_started(runner_id="too-late")


def test_ttl_expiry_of_an_unstarted_transfer_restores_the_source(client: Client, sid: str) -> None:
    _finished_source(client, sid)
    before = _state(client, sid, "a", "b")
    assert client.capacity.transfer(
        session_id=sid, limit=4, source_run_id="a", run_id="b", ttl_s=0.2
    )
    _wait_for(lambda: client.capacity.inspect("a", sid).relation == "current")
    assert _state(client, sid, "a", "b") == before


def test_reservation_ttl_defaults_to_the_node_setting() -> None:
    directory = _state_dir()
    try:
        with Node.embedded(state_dir=directory, settings={"reservation_ttl_s": 0.3}) as node:
            client = node.client()
            _acquire(client, "s", "a")
            owner = client.capacity.inspect("a").owner
            assert owner is not None and owner.expires_at is not None
            assert owner.expires_at - owner.reserved_at == pytest.approx(0.3)
            _wait_for(lambda: client.capacity.snapshot("s").used == 0)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _ledger_with_timers(
    directory: Path, quarantined: list[str] | None = None, ttl_s: float | None = None
) -> tuple[pykka.ActorRef[Any], Timers]:
    """A CapacityLedger on its own store, whose deadlines go to a real timer thread that the
    test can look into (`Timers.held`); the keys it quarantines go to `quarantined`."""
    store = Store(directory / "capacity.db")
    store.migrate({CapacityLedger.name: CapacityLedger.MIGRATIONS})
    timers = Timers()
    seen = quarantined if quarantined is not None else []
    ctx = ActorContext(
        open_db=store.connect,
        schedule=timers.schedule,
        report_quarantine=lambda name, records: seen.extend(r.key for r in records),
        settings={} if ttl_s is None else {"reservation_ttl_s": ttl_s},
    )
    return CapacityLedger.start(ctx), timers


def _ask(ref: pykka.ActorRef[Any], request: Any) -> Any:
    future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    ref.tell(Job(request, future.set))
    return future.get(timeout=10)


def test_section_0_4_deadlines_hold_one_timer_however_many_grants_were_rolled_back(
    tmp_path: Path,
) -> None:
    """A timer per acquire kept every grant of the last TTL (60 s by default) in the owner's
    memory, rolled back or not, and fired a tick for each: under an admission storm the
    capacity owner grew by megabytes a second. One timer, for the earliest deadline, is all
    the owner needs."""
    ref, timers = _ledger_with_timers(tmp_path)
    try:
        for i in range(300):
            grant = _ask(ref, Acquire(session_id="s", limit=4, run_id=f"r{i}", ttl_s=600))
            assert isinstance(grant, AcquireResult) and grant.handle is not None
            undone = _ask(ref, Rollback(handle=grant.handle))
            assert isinstance(undone, RollbackResult) and undone.rolled_back
        held = [
            _ask(ref, Acquire(session_id="s", limit=4, run_id=f"h{i}", ttl_s=600 + i))
            for i in range(3)
        ]
        assert all(isinstance(h, AcquireResult) for h in held)
        assert timers.held <= 2  # one timer: its heap entry and its live id
        # An earlier deadline re-arms the one timer; the later ones still expire after it.
        _ask(ref, Acquire(session_id="s", limit=4, run_id="soon", ttl_s=0.2))
        _wait_for(lambda: _ask(ref, Snapshot(session_id="s", limit=4)).used == 3)
        # One live timer again, plus the entry its re-arm cancelled (Timers drops cancelled
        # entries in bulk, once they are half of its heap).
        assert timers.held <= 3
    finally:
        ref.stop()
        timers.stop()


def test_section_0_4_every_slot_due_at_once_expires_on_one_tick(tmp_path: Path) -> None:
    ref, timers = _ledger_with_timers(tmp_path)
    try:
        for i in range(50):
            _ask(ref, Acquire(session_id=f"s{i % 5}", limit=10, run_id=f"r{i}", ttl_s=0.3))
        kept = _ask(ref, Acquire(session_id="s0", limit=11, run_id="kept", ttl_s=600))
        assert isinstance(kept, AcquireResult) and kept.handle is not None
        _ask(ref, MarkStarted(handle=kept.handle, runner_id="runner-kept"))
        _wait_for(
            lambda: (
                [_ask(ref, Snapshot(session_id=f"s{i}", limit=11)).used for i in range(5)]
                == [1, 0, 0, 0, 0]
            )
        )
        assert timers.held == 0  # nothing left to wait for: no timer armed
    finally:
        ref.stop()
        timers.stop()


def test_section_0_4_an_unreadable_slot_past_its_deadline_stays_occupied_and_is_not_retried(
    tmp_path: Path,
) -> None:
    """DESIGN §2: a record that does not parse is never freed by a timer (fail closed); the
    tick quarantines it and arms for nothing, so it does not come round again and again."""
    ref, timers = _ledger_with_timers(tmp_path)
    _ask(ref, Acquire(session_id="bad", limit=2, run_id="r", ttl_s=600))
    ref.stop()
    timers.stop()
    # Spoilt while its owner is down, with a deadline just ahead: the next owner arms for it.
    with sqlite3.connect(tmp_path / "capacity.db") as other:
        other.execute(
            "UPDATE capacity_slots SET terminal = 'not json', expires_at = ? WHERE run_id = 'r'",
            (time.time() + 1.0,),
        )
    quarantined: list[str] = []
    ref, timers = _ledger_with_timers(tmp_path, quarantined)
    try:
        assert _ask(ref, Snapshot(session_id="bad", limit=2)).used == 1  # recovered by now
        assert quarantined == ["bad/0"]  # found by recover()
        assert timers.held == 2  # armed for its deadline: the heap entry and its live id
        _wait_for(lambda: timers.held == 0)  # the tick went off and armed nothing again
        assert quarantined == ["bad/0"]
        assert _ask(ref, Snapshot(session_id="bad", limit=2)).used == 1
        fresh = _ask(ref, Acquire(session_id="good", limit=2, run_id="g", ttl_s=600))
        assert isinstance(fresh, AcquireResult) and fresh.handle is not None
    finally:
        ref.stop()
        timers.stop()


def test_r_cap_7_a_deadline_that_passed_while_the_owner_was_down_expires_one_ttl_after_its_start(
    tmp_path: Path,
) -> None:
    """Not at once: the restarted node may owe the start of a run it began before the crash
    (runs/restart.py sends it again); a launcher that really died loses its slot one TTL on."""
    ref, timers = _ledger_with_timers(tmp_path)
    asked = time.time()
    grant = _ask(ref, Acquire(session_id="s", limit=2, run_id="lapsing", ttl_s=0.3))
    kept = _ask(ref, Acquire(session_id="s", limit=2, run_id="kept", ttl_s=600))
    assert isinstance(grant, AcquireResult) and isinstance(kept, AcquireResult)
    ref.stop()
    timers.stop()
    deadline = time.time() + 0.35 + (time.time() - asked)
    pause = threading.Event()
    while time.time() < deadline:  # the owner is down past the deadline
        pause.wait(deadline - time.time())
    ref, timers = _ledger_with_timers(tmp_path, ttl_s=0.5)
    restarted = time.time()
    try:
        assert _ask(ref, Snapshot(session_id="s", limit=2)).used == 2
        _wait_for(lambda: _ask(ref, Snapshot(session_id="s", limit=2)).used == 1)
        assert time.time() - restarted >= 0.5  # a full TTL after the owner's start
        assert timers.held <= 2  # armed for the one deadline left ("kept")
    finally:
        ref.stop()
        timers.stop()


def test_r_cap_7_slots_and_deadlines_survive_a_node_restart() -> None:
    directory = _state_dir()
    try:
        with Node.embedded(state_dir=directory) as node:
            client = node.client()
            running = _acquire(client, "s", "running")
            running.mark_started(runner_id="runner-1")
            short = _acquire(client, "s", "short", ttl_s=0.5)
            long = _acquire(client, "s", "long", ttl_s=300)
            wires = (running.wire, short.wire, long.wire)
        with Node.embedded(state_dir=directory, settings={"reservation_ttl_s": 0.5}) as node:
            client = node.client()
            _wait_for(lambda: client.capacity.inspect("short").relation == "none")
            assert client.capacity.snapshot("s").used == 2
            assert client.capacity.handle(wires[2]).rollback() is True
            verdict = client.capacity.report_terminal(
                "s", "running", "complete", proof=_observed("runner-1")
            )
            assert verdict.verdict == "releasable"
            assert client.capacity.handle(wires[1]).rollback() is False
            assert client.capacity.snapshot("s").used == 0
    finally:
        shutil.rmtree(directory, ignore_errors=True)
