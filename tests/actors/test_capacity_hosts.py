"""Capacity slots know the host their run executes on (issue 13; DESIGN §1 multi-host).

Most tests talk to the CapacityLedger of an embedded node (real owner processes) over its zmq
socket with the real client; the node is shared by the module, so every test uses hosts and
sessions of its own. The test that needs a store prepared by hand (records written before
hosts existed) hosts the ledger alone on its owner loop, on a store it migrates itself. A
refused request must change nothing: `_state` captures the ledger before and after.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from subagents_node import Client, Node
from subagents_node.actors.capacity.ledger import CapacityLedger
from subagents_node.actors.owner import ActorContext
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import BadRequest
from subagents_node.node.store import Store
from tests.support.owners import LoopHost

# -- fixtures -------------------------------------------------------------------------------


def _new_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="sa-", dir="/tmp"))


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


def _state(client: Client, session_id: str, *runs: str) -> Any:
    """Everything observable: the pool's used and each run's inspection."""
    return (
        client.capacity.snapshot(session_id).used,
        *(client.capacity.inspect(r, session_id).model_dump() for r in runs),
    )


def _raw_call(address: str, type_: str, body: dict[str, Any]) -> Envelope:
    """One hand-made frame to the node's socket, bypassing the client's own validation."""
    with zmq.Context() as zctx, zctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sock.send(encode(Envelope(type=type_, body=body, target="capacity")))
        assert sock.poll(5000), "no reply from the node"
        return decode(sock.recv())


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
        assert capacity.snapshot("s").used == 2
        wire = capacity.inspect("resumed", "s").owner
        assert wire is not None and wire.prev_record is not None and wire.prev_record.host == ""
        assert capacity.handle(wire.handle()).rollback()
        restored = capacity.inspect("src", "s").owner
        assert restored is not None and (restored.host, restored.slot) == ("", 1)
    finally:
        host.close()
