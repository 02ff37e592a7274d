"""`capacity.holders`: who holds a session pool's slots, each with the host its run executes on
(R-CAP-26, R-CAP-27; DESIGN §1 "Multi-host").

The ledger alone names every holder of a pool, a home's workers' runs included, so the
`capacity` view needs no worker's answer. Each page is in slot order, after the slot the last
page ended on; `client.capacity.holders` walks every page. A slot that does not parse is
quarantined, counted and left out of the page, never a failure of the listing; bad input is a
typed one-line error that changes nothing. The CapacityLedger is hosted alone on its owner
loop (tests/support/owners.py), on a store of its own, and asked over its real socket.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from subagents_node.actors.capacity.ledger import CapacityLedger
from subagents_node.actors.context import ActorContext
from subagents_node.messages.capacity_holders import Holders, SessionSlots
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import BadRequest, SubagentsError
from subagents_node.node.store import Store
from tests.support.nodes import short_dir
from tests.support.owners import LoopHost

HOSTS = ("", "w1", "w2")


@pytest.fixture
def ledger() -> Iterator[LoopHost]:
    directory = short_dir()
    store = Store(directory / "capacity.db")
    store.migrate({CapacityLedger.name: CapacityLedger.MIGRATIONS})
    host = LoopHost(CapacityLedger, ActorContext(open_db=store.connect), directory).start()
    try:
        yield host
    finally:
        host.close()
        shutil.rmtree(directory, ignore_errors=True)


def _fill(ledger: LoopHost, session_id: str, count: int, limit: int) -> dict[str, str]:
    """`count` slots of `session_id`, their runs on the hosts in turn: run id -> host."""
    held: dict[str, str] = {}
    for n in range(count):
        run_id, host = f"{session_id}-r{n:04d}", HOSTS[n % len(HOSTS)]
        ledger.client.capacity.acquire(session_id, limit, run_id, host=host)
        held[run_id] = host
    return held


def _page(ledger: LoopHost, **fields: Any) -> SessionSlots:
    return ledger.client.ask(Holders(**fields), SessionSlots)


def test_r_cap_27_holders_pages_a_sessions_slots_in_order_each_with_its_host(
    ledger: LoopHost,
) -> None:
    held = _fill(ledger, "s", 5, limit=8)
    _fill(ledger, "other", 2, limit=8)  # another session's slots are not its holders
    first = _page(ledger, session_id="s", limit=2)
    assert [(i.owner.slot, i.relation) for i in first.holders if i.owner] == [
        (0, "current"),
        (1, "current"),
    ]
    assert first.next_after == 1
    seen = list(first.holders)
    after = first.next_after
    while after is not None:
        page = _page(ledger, session_id="s", after_slot=after, limit=2)
        seen += page.holders
        after = page.next_after
    assert {i.owner.run_id: i.owner.host for i in seen if i.owner} == held
    assert all(i.verdict.verdict == "retained" for i in seen)  # reserved: never started
    assert _page(ledger, session_id="empty").holders == []


def test_r_cap_26_the_clients_holders_walk_every_page_past_the_first_thousand_slots(
    ledger: LoopHost,
) -> None:
    held = _fill(ledger, "s", 1_003, limit=2_000)
    whole = ledger.client.capacity.holders("s")
    assert {i.owner.run_id: i.owner.host for i in whole.holders if i.owner} == held
    assert (len(whole.holders), whole.unreadable, whole.cut) == (1_003, 0, False)
    cut = ledger.client.capacity.holders("s", bound=1_001)
    assert (len(cut.holders), cut.cut) == (1_001, True)


def test_a_slot_that_does_not_parse_is_counted_and_left_out_never_a_failed_listing(
    ledger: LoopHost,
) -> None:
    _fill(ledger, "s", 3, limit=8)
    endpoint = ledger.endpoint.removeprefix("ipc://")
    db = sqlite3.connect(Path(endpoint).parent / "capacity.db")
    with db:
        db.execute("UPDATE capacity_slots SET terminal = '{not json' WHERE slot = 1")
    db.close()
    page = ledger.client.capacity.holders("s")
    assert [i.owner.slot for i in page.holders if i.owner] == [0, 2]
    assert page.unreadable == 1
    assert ledger.client.capacity.snapshot("s").used == 3  # still occupied (fail closed)


@pytest.mark.parametrize(
    "fields",
    [
        {"session_id": ""},
        {"session_id": "s", "limit": 0},
        {"session_id": "s", "limit": 1_001},
        {"session_id": "s", "after_slot": -1},
        {"session_id": "s", "after_slot": "0"},
    ],
)
def test_bad_holders_input_is_a_one_line_typed_error_that_changes_nothing(
    ledger: LoopHost, fields: dict[str, Any]
) -> None:
    _fill(ledger, "s", 2, limit=8)
    before = ledger.client.capacity.holders("s")
    # A hand-made frame: the client would refuse it before sending (the same check).
    with zmq.Context() as zctx, zctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(ledger.endpoint)
        sock.send(encode(Envelope(type="capacity.holders", body=fields, target="capacity")))
        assert sock.poll(5000), "no answer from the ledger"
        answer = decode(sock.recv())
    assert answer.type == ERROR
    refused = SubagentsError.from_wire(answer.body)
    assert isinstance(refused, BadRequest) and "\n" not in refused.message, refused
    assert ledger.client.capacity.holders("s") == before


def test_the_async_client_names_the_same_holders(ledger: LoopHost) -> None:
    import asyncio

    from subagents_node import AsyncClient

    held = _fill(ledger, "s", 4, limit=8)

    async def go() -> dict[str, str]:
        async with AsyncClient(ledger.endpoint) as aio:
            pool = await aio.capacity.holders("s")
            return {i.owner.run_id: i.owner.host for i in pool.holders if i.owner}

    assert asyncio.run(go()) == held
