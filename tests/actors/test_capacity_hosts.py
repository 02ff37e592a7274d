"""Capacity slots know their host, and an operator can release a lost host's slots (issue 13;
DESIGN §1 multi-host, §2 "an explicit, audited operator release", §3 fencing).

Most tests talk to the CapacityLedger of an embedded node (real owner processes) over its zmq
socket with the real client; the node is shared by the module, so every test uses hosts and
sessions of its own. The tests that need a store prepared by hand (records written before
hosts existed, a row that does not parse, a failure injected half-way through a release) host
the ledger alone on its owner loop, on a store they migrate themselves. A refused or empty
request must change nothing: `_state` captures the ledger before and after.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from subagents_node import Client, Node
from subagents_node.actors.capacity.ledger import CapacityLedger
from subagents_node.actors.context import ActorContext
from subagents_node.messages.capacity import MAX_LISTED, RunnerProof
from subagents_node.messages.capacity_hosts import HostSlotCount
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import BadRequest, CapacityOwnershipChanged, Internal
from subagents_node.node.store import Store
from tests.support.nodes import short_dir
from tests.support.owners import LoopHost

# -- fixtures -------------------------------------------------------------------------------


def _new_dir() -> Path:
    return short_dir()


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    directory = _new_dir()
    try:
        with Node.embedded(state_dir=directory) as running:
            yield running
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def client(node: Node) -> Client:
    return node.client("zmq")


@pytest.fixture
def sid() -> str:
    return f"session-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def host() -> str:
    """A worker name no other test uses: a release frees a host's slots in every session."""
    return f"w-{uuid.uuid4().hex[:8]}"


def _acquire(client: Client, session_id: str, run_id: str, **kw: Any) -> Any:
    handle = client.capacity.acquire(session_id=session_id, limit=8, run_id=run_id, **kw)
    assert handle is not None
    return handle


def _state(client: Client, session_id: str, *runs: str, host: str | None = None) -> Any:
    """Everything observable: the pool's used, each run's inspection, the host counts and the
    audit rows (of `host`, when given)."""
    return (
        client.capacity.snapshot(session_id).used,
        *(client.capacity.inspect(r, session_id).model_dump() for r in runs),
        client.capacity.hosts().model_dump(),
        client.capacity.releases(host=host, limit=MAX_LISTED).model_dump(),
    )


def _raw_call(address: str, type_: str, body: dict[str, Any]) -> Envelope:
    """One hand-made frame to the node's socket, bypassing the client's own validation."""
    with zmq.Context() as zctx, zctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sock.send(encode(Envelope(type=type_, body=body, target="capacity")))
        assert sock.poll(5000), "no reply from the node"
        return decode(sock.recv())


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        pause.wait(0.02)


# -- host on a slot -------------------------------------------------------------------------


def test_acquire_records_the_host_and_inspect_shows_it(client: Client, sid: str, host: str) -> None:
    _acquire(client, sid, "remote", host=host)
    _acquire(client, sid, "local")
    remote = client.capacity.inspect("remote", sid).owner
    local = client.capacity.inspect("local", sid).owner
    assert remote is not None and remote.host == host
    assert local is not None and local.host == ""  # "" = the home node


def test_transfer_takes_the_resumes_host_and_its_rollback_restores_the_sources(
    client: Client, sid: str, host: str
) -> None:
    source = _acquire(client, sid, "a", host=host)
    source.mark_started(runner_id="runner-a")
    client.capacity.report_terminal(sid, "a", "failed")  # terminal, no proof: still held
    resume = client.capacity.transfer(
        session_id=sid, limit=8, source_run_id="a", run_id="b", host=f"{host}-2"
    )
    assert resume is not None and resume.slot == source.slot
    owner = client.capacity.inspect("b", sid).owner
    assert owner is not None and owner.host == f"{host}-2"
    assert owner.prev_record is not None and owner.prev_record.host == host
    assert resume.rollback()
    restored = client.capacity.inspect("a", sid).owner
    assert restored is not None and restored.host == host


def test_transfer_without_a_source_slot_acquires_on_the_resumes_host(
    client: Client, sid: str, host: str
) -> None:
    moved = client.capacity.transfer(
        session_id=sid, limit=8, source_run_id="gone", run_id="b", host=host
    )
    assert moved is not None
    owner = client.capacity.inspect("b", sid).owner
    assert owner is not None and owner.host == host


def test_hosts_counts_reserved_and_started_slots_per_host(
    client: Client, sid: str, host: str
) -> None:
    other = f"{host}-other"
    _acquire(client, sid, "a", host=host).mark_started(runner_id="runner-a")
    _acquire(client, sid, "b", host=host)
    _acquire(client, f"{sid}-2", "c", host=host, kind="workflow").mark_workflow_started()
    _acquire(client, sid, "d", host=other)
    counts = {c.host: c for c in client.capacity.hosts().hosts}
    assert counts[host] == HostSlotCount(host=host, reserved=1, started=2)
    assert counts[other] == HostSlotCount(host=other, reserved=1, started=0)
    assert client.capacity.hosts(host).hosts == [counts[host]]
    nobody = f"{host}-none"
    assert client.capacity.hosts(nobody).hosts == [
        HostSlotCount(host=nobody, reserved=0, started=0)
    ]


@pytest.mark.parametrize("bad", ["w 1", "-w1", "w1\n", "x" * 65, "w1\x00"])
def test_a_bad_host_on_acquire_is_a_schema_error_that_records_nothing(
    node: Node, client: Client, sid: str, bad: str
) -> None:
    before = _state(client, sid, "a")
    with pytest.raises(BadRequest) as caught:
        client.capacity.acquire(session_id=sid, limit=8, run_id="a", host=bad)
    assert caught.value.details["reason"] == "schema" and "host" in caught.value.message
    body = {"session_id": sid, "limit": 8, "run_id": "a", "host": bad}
    reply = _raw_call(node.address, "capacity.acquire", body)  # the node checks it too
    assert (reply.type, reply.body["code"]) == (ERROR, "bad_request")
    assert _state(client, sid, "a") == before


# -- release_host ---------------------------------------------------------------------------


def test_release_host_frees_only_that_hosts_slots_with_operator_proof(
    client: Client, sid: str, host: str
) -> None:
    other, sid2 = f"{host}-other", f"{sid}-2"
    started = _acquire(client, sid, "a", host=host)
    started.mark_started(runner_id="runner-a", pid=4242, process_start_time=17.5)
    reserved = _acquire(client, sid, "b", host=host)
    workflow = _acquire(client, sid2, "c", host=host, kind="workflow")
    workflow.mark_workflow_started()
    _acquire(client, sid, "elsewhere", host=other).mark_started(runner_id="runner-e")
    _acquire(client, sid, "home")
    kept = _state(client, sid, "elsewhere", "home", host=other)[1:3]

    freed = client.capacity.release_host(host, reason="disk died", operator="ana")

    assert (freed.host, freed.count, freed.more, freed.unreadable) == (host, 3, False, 0)
    assert sorted(freed.released, key=lambda h: h.run_id) == [
        started.wire,
        reserved.wire,
        workflow.wire,
    ]
    for session_id, run_id in ((sid, "a"), (sid, "b"), (sid2, "c")):
        assert client.capacity.inspect(run_id, session_id).relation == "none"
    assert client.capacity.snapshot(sid).used == 2 and client.capacity.snapshot(sid2).used == 0
    assert _state(client, sid, "elsewhere", "home", host=other)[1:3] == kept
    assert host not in {c.host for c in client.capacity.hosts().hosts}
    rows = {r.run_id: r for r in client.capacity.releases(host=host).releases}
    assert set(rows) == {"a", "b", "c"}
    assert {r.proof_state for r in rows.values()} == {"operator"}
    assert {(r.reason, r.operator, r.host) for r in rows.values()} == {("disk died", "ana", host)}
    assert len({r.at for r in rows.values()}) == 1  # one request, one transaction, one moment
    assert (rows["a"].state, rows["a"].runner_id, rows["a"].slot) == ("started", "runner-a", 0)
    assert (rows["b"].state, rows["b"].runner_id, rows["b"].slot) == ("reserved", None, 1)
    assert (rows["c"].state, rows["c"].kind, rows["c"].session_id) == ("started", "workflow", sid2)
    assert {r.generation for r in rows.values()} == {0}


def test_release_of_a_host_holding_no_slot_is_count_0_and_changes_nothing(
    client: Client, sid: str, host: str
) -> None:
    _acquire(client, sid, "a", host=f"{host}-other")
    before = _state(client, sid, "a")
    freed = client.capacity.release_host(host, reason="never seen")
    assert (freed.count, freed.released, freed.more) == (0, [], False)
    assert _state(client, sid, "a") == before
    assert client.capacity.releases(host=host).releases == []


_BAD_RELEASES: dict[str, dict[str, str]] = {
    # "" is the home node: not a host an operator may declare lost
    "empty host": {"host": "", "reason": "lost"},
    "host with a space": {"host": "w 1", "reason": "lost"},
    "over-long host": {"host": "w" * 65, "reason": "lost"},
    "empty reason": {"host": "HOST", "reason": ""},
    "blank reason": {"host": "HOST", "reason": "  \t "},
    "over-long reason": {"host": "HOST", "reason": "x" * 4001},
    "reason with NUL": {"host": "HOST", "reason": "lost\x00"},
    "over-long operator": {"host": "HOST", "reason": "lost", "operator": "o" * 129},
}


@pytest.mark.parametrize("case", sorted(_BAD_RELEASES))
def test_bad_release_input_is_a_one_line_typed_error_that_changes_nothing(
    node: Node, client: Client, sid: str, host: str, case: str
) -> None:
    body = {k: v.replace("HOST", host) for k, v in _BAD_RELEASES[case].items()}
    _acquire(client, sid, "a", host=host)
    before = _state(client, sid, "a", host=host)
    with pytest.raises(BadRequest) as caught:
        client.capacity.release_host(**body)
    assert caught.value.details["reason"] == "schema"
    assert "\n" not in caught.value.message and len(caught.value.message) < 300
    reply = _raw_call(node.address, "capacity.release_host", body)  # and the node refuses it
    assert (reply.type, reply.body["code"]) == (ERROR, "bad_request")
    assert "\n" not in reply.body["message"]
    assert _state(client, sid, "a", host=host) == before


# -- fencing after a release (DESIGN §3) ----------------------------------------------------


def test_reports_naming_a_released_slots_generation_change_nothing(
    client: Client, sid: str, host: str
) -> None:
    run = f"{sid}-a"  # unique in every pool: a report is also matched against other sessions
    handle = _acquire(client, sid, run, host=host)
    handle.mark_started(runner_id="runner-a")
    stale = client.capacity.handle(handle.wire)
    client.capacity.release_host(host, reason="lost")
    before = _state(client, sid, run, host=host)
    proof = RunnerProof(state="observed", runner_id="runner-a", exit_code=0)
    late = client.capacity.report_terminal(sid, run, "complete", generation=0, proof=proof)
    assert late.verdict == "not-owned"
    with pytest.raises(CapacityOwnershipChanged) as caught:
        stale.mark_started(runner_id="runner-a")
    assert caught.value.reason == "slot_gone"
    assert client.capacity.handle(handle.wire).rollback() is False
    assert _state(client, sid, run, host=host) == before  # nothing re-occupied, no new audit


def test_a_run_granted_again_after_a_release_starts_above_the_released_generation(
    client: Client, sid: str, host: str
) -> None:
    """The lost worker may come back and replay what it queued; the run may meanwhile hold a
    slot again. Its new grant has a higher generation, so the replayed report is fenced."""
    run = f"{sid}-a"
    old = _acquire(client, sid, run, host=host)
    old.mark_started(runner_id="runner-a")
    client.capacity.release_host(host, reason="lost")
    again = _acquire(client, sid, run)
    assert again.generation == 1 and again.slot == old.slot
    before = _state(client, sid, run)
    replayed = client.capacity.report_terminal(sid, run, "failed", generation=0)
    assert replayed.verdict == "not-owned" and "not the reported 0" in replayed.reason
    with pytest.raises(CapacityOwnershipChanged):
        client.capacity.handle(old.wire).mark_started(runner_id="runner-a")
    assert client.capacity.handle(old.wire).rollback() is False
    assert _state(client, sid, run) == before
    owner = client.capacity.inspect(run, sid).owner
    assert owner is not None and owner.terminal is None and not owner.started


def test_the_ttl_of_a_released_reservation_never_touches_the_slot_granted_after_it(
    client: Client, sid: str, host: str
) -> None:
    lapsing = _acquire(client, sid, "a", host=host, ttl_s=0.3)
    owner = client.capacity.inspect("a", sid).owner
    assert owner is not None and owner.expires_at is not None
    deadline = owner.expires_at
    client.capacity.release_host(host, reason="lost")
    successor = _acquire(client, sid, "b", ttl_s=600)
    assert successor.slot == lapsing.slot
    # Past the released reservation's deadline, so its tick has fired: the successor, on the
    # same slot index, is untouched (the tick names the released token and generation).
    _wait_for(lambda: time.time() > deadline + 0.5)
    assert client.capacity.inspect("b", sid).relation == "current"
    assert client.capacity.snapshot(sid).used == 1


# -- the audit listing ----------------------------------------------------------------------


def test_releases_are_listed_newest_first_bounded_and_by_host(
    client: Client, sid: str, host: str
) -> None:
    second = f"{host}-2"
    _acquire(client, sid, "a", host=host)
    client.capacity.release_host(host, reason="first")
    _acquire(client, sid, "b", host=second)
    client.capacity.release_host(second, reason="second")
    newest = client.capacity.releases(limit=2).releases
    assert [r.run_id for r in newest] == ["b", "a"]
    assert newest[0].seq > newest[1].seq
    assert [r.reason for r in client.capacity.releases(limit=1).releases] == ["second"]
    assert [r.run_id for r in client.capacity.releases(host=host).releases] == ["a"]
    for limit in (0, MAX_LISTED + 1):
        with pytest.raises(BadRequest):
            client.capacity.releases(limit=limit)


def test_the_async_client_has_the_same_three_calls(node: Node, sid: str, host: str) -> None:
    import asyncio

    from subagents_node import AsyncClient

    async def go() -> tuple[Any, ...]:
        async with AsyncClient(node.address) as aio:
            handle = await aio.capacity.acquire(session_id=sid, limit=2, run_id="a", host=host)
            assert handle is not None
            held = await aio.capacity.hosts(host)
            freed = await aio.capacity.release_host(host, reason="lost", operator="bo")
            audit = await aio.capacity.releases(host=host)
            return held, freed, audit

    held, freed, audit = asyncio.run(go())
    assert held.hosts == [HostSlotCount(host=host, reserved=1, started=0)]
    assert freed.count == 1 and [r.operator for r in audit.releases] == ["bo"]


# -- a ledger on a store prepared by hand ---------------------------------------------------


@pytest.fixture
def store_dir() -> Iterator[Path]:
    directory = _new_dir()
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _ledger(directory: Path) -> LoopHost:
    store = Store(directory / "capacity.db")
    store.migrate({CapacityLedger.name: CapacityLedger.MIGRATIONS})
    return LoopHost(CapacityLedger, ActorContext(open_db=store.connect), directory).start()


def _row(**fields: Any) -> dict[str, Any]:
    """A version-1 row of capacity_slots (no host column), started, transferred from `src`."""
    row: dict[str, Any] = {
        "session_id": "s",
        "slot": 0,
        "session_key": "k",
        "token": uuid.uuid4().hex,
        "run_id": "old",
        "source_run_id": None,
        "generation": 0,
        "kind": "runner",
        "async_dir": "",
        "reserved_at": 1.0,
        "expires_at": None,
        "runner_id": "runner-old",
        "runner_started_at": 2.0,
        "pid": None,
        "process_start_time": None,
        "terminal_state": None,
        "proof_state": None,
        "terminal": None,
        "prev_record": None,
    }
    row.update(fields)
    return row


def _insert(db: sqlite3.Connection, row: dict[str, Any]) -> None:
    columns = ", ".join(row)
    db.execute(
        f"INSERT INTO capacity_slots ({columns}) VALUES ({', '.join('?' for _ in row)})",
        tuple(row.values()),
    )


def test_records_written_before_hosts_read_as_the_home_node(store_dir: Path) -> None:
    store = Store(store_dir / "capacity.db")
    store.migrate({CapacityLedger.name: CapacityLedger.MIGRATIONS[:1]})  # as installed before
    db = sqlite3.connect(store_dir / "capacity.db")
    source = _row(slot=1, run_id="src")
    with db:
        _insert(db, _row())
        # a transfer whose pre-transfer record (JSON, written before hosts) has no host either
        resumed = _row(
            slot=1,
            run_id="resumed",
            source_run_id="src",
            generation=1,
            runner_id=None,
            runner_started_at=None,
            expires_at=4_000_000_000.0,
            prev_record=json.dumps(source),
        )
        _insert(db, resumed)
    db.close()
    host = _ledger(store_dir)  # migrates to the current version, then serves
    try:
        capacity = host.client.capacity
        old = capacity.inspect("old", "s").owner
        assert old is not None and old.host == "" and old.started
        assert capacity.hosts().hosts == [HostSlotCount(host="", reserved=1, started=1)]
        assert capacity.release_host("w1", reason="not these").count == 0
        assert capacity.snapshot("s").used == 2
        wire = capacity.inspect("resumed", "s").owner
        assert wire is not None and wire.prev_record is not None and wire.prev_record.host == ""
        assert capacity.handle(wire.handle()).rollback()
        restored = capacity.inspect("src", "s").owner
        assert restored is not None and (restored.host, restored.slot) == ("", 1)
    finally:
        host.close()


def test_release_host_never_frees_a_slot_it_cannot_read(store_dir: Path) -> None:
    _ledger(store_dir).close()  # the current schema, then an unreadable row of host w1
    db = sqlite3.connect(store_dir / "capacity.db")
    with db:
        _insert(db, {**_row(slot=0, run_id="fine"), "host": "w1"})
        _insert(db, {**_row(slot=1, run_id="bad", terminal="{not json"), "host": "w1"})
    db.close()
    host = _ledger(store_dir)
    try:
        freed = host.client.capacity.release_host("w1", reason="lost")
        assert (freed.count, freed.unreadable) == (1, 1)
        assert [h.run_id for h in freed.released] == ["fine"]
        assert host.client.capacity.snapshot("s").used == 1  # INV-CAP-7: counted, never freed
        assert host.client.capacity.hosts("w1").hosts[0].started == 1
    finally:
        host.close()


def test_release_host_is_one_transaction_a_failure_half_way_frees_nothing(
    store_dir: Path,
) -> None:
    host = _ledger(store_dir)
    try:
        capacity = host.client.capacity
        for run in "abc":
            handle = capacity.acquire(session_id="s", limit=4, run_id=run, host="w1")
            assert handle is not None
            handle.mark_started(runner_id=f"runner-{run}")
        before = (capacity.snapshot("s"), capacity.hosts().hosts, capacity.releases().releases)
        # The third audit row fails to insert, after two slots were deleted and two rows
        # written in the same request.
        db = sqlite3.connect(store_dir / "capacity.db")
        with db:
            db.execute(
                "CREATE TRIGGER fail_third BEFORE INSERT ON capacity_operator_releases "
                "WHEN (SELECT COUNT(*) FROM capacity_operator_releases) >= 2 "
                "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
        db.close()
        with pytest.raises(Internal):
            capacity.release_host("w1", reason="lost")
        after = (capacity.snapshot("s"), capacity.hosts().hosts, capacity.releases().releases)
        assert after == before
    finally:
        host.close()
