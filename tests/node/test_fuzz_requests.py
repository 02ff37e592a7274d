"""Property-based fuzzing of every request type against a real node (issue 12, "Tests": "a
property-based fuzz test over every request type ... against a real node"; DESIGN §4).

Bodies come from each request model's own schema (tests/support/fuzz.py), then get one hostile
change: integers at and past SQLite's range, 50,000-character strings, NUL bytes, nesting up to
300 levels, wrong types, unknown or missing fields. Each is sent as a raw frame on a DEALER.
For every one: exactly one reply (`RawPeer.request_once`), a typed result or a typed error
that is never `internal`; a refused request leaves the three ledgers exactly as they were.
After all of them: no owner restarted, RSS stayed bounded and the node answers `ping`.

Launches are made harmless before they are mutated (a command that does not exist, long-polls
that answer at once, long TTLs so no timer changes a ledger during a comparison).
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents_node.client.paths import OWNER_SOCKETS, owner_db
from subagents_node.messages.base import Request
from subagents_node.messages.envelope import ERROR, PROTOCOL_VERSION, REPLY, Envelope
from subagents_node.messages.errors import WIRE_CODES, SubagentsError
from subagents_node.messages.protocol import REQUEST_CLASSES
from tests.support.fuzz import body_strategy, hostile
from tests.support.nodes import NodeProcess, RawPeer, running_node

pytestmark = [pytest.mark.slow, pytest.mark.processes]

#: `node.shutdown` would end the node under test; everything else is fair game.
FUZZED = tuple(c for c in REQUEST_CLASSES if c.model_fields["type"].default != "node.shutdown")
LEDGER_TABLES = (
    "capacity_slots",
    "capacity_operator_releases",  # a refused release must leave no audit row either
    "fanout_budgets",
    "fanout_claims",
    "fanout_reservations",
    "session_budgets",
    "session_grants",
    "session_reservations",  # a refused reserve must leave no reservation behind
)
NO_SUCH_AGENT = "/nonexistent/subagents-fuzz-agent"


def harmless(value: Any) -> Any:
    """A valid body made safe to send: no process to start, no wait, no timer to fire soon."""
    if isinstance(value, list):
        return [harmless(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: harmless(v) for k, v in value.items()}
    if "command" in out:
        out["command"] = [NO_SUCH_AGENT]
    if "wait_s" in out:
        out["wait_s"] = 0
    if "ttl_s" in out and out["ttl_s"] is not None:
        out["ttl_s"] = 3600.0
    return out


def typed_request(kind: type[Request]) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    type_ = str(kind.model_fields["type"].default)
    long_poll = "wait_s" in kind.model_fields
    return (
        body_strategy(kind)
        .map(harmless)
        .flatmap(hostile)
        # a mutation that drops `wait_s` makes a valid 10 s long-poll: keep it at once
        .map(lambda body: {"wait_s": 0, **body} if long_poll else body)
        .map(lambda body: (type_, body))
    )


TYPE_NAMES = [str(c.model_fields["type"].default) for c in FUZZED]


class Target:
    """The node under fuzz, one DEALER to it, and a reader of its ledgers."""

    def __init__(self, node: NodeProcess) -> None:
        self.node = node
        self.zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.peer = RawPeer(self.zctx, node.address)
        self.rss_before = node.rss()
        self.sent: dict[str, int] = {}
        self.slowest: tuple[float, str] = (0.0, "")

    def ledgers(self) -> str:
        """A digest of every ledger row (read-only: the owner stays the only writer)."""
        digest = hashlib.sha256()
        for owner in OWNER_SOCKETS:  # one database per owner process
            path = owner_db(Path(self.node.state_dir), owner)
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
                for table in LEDGER_TABLES:
                    if table in have:
                        for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2"):
                            digest.update(repr(tuple(row)).encode())
            finally:
                conn.close()
        return digest.hexdigest()

    def close(self) -> None:
        self.peer.close()
        self.zctx.term()


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    # No --faults: debug.raise and debug.sleep are refused like any request they may not make.
    with running_node() as node:
        fuzz = Target(node)
        try:
            yield fuzz
        finally:
            fuzz.close()


@pytest.mark.parametrize("kind", FUZZED, ids=TYPE_NAMES)
def test_issue12_fuzz_every_request_type_gets_one_typed_reply_and_refusals_change_no_ledger(
    target: Target, kind: type[Request]
) -> None:
    @settings(
        max_examples=12,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=typed_request(kind))
    def fuzz(request: tuple[str, dict[str, Any]]) -> None:
        send_one(target, *request)

    fuzz()


def send_one(target: Target, type_: str, body: dict[str, Any]) -> None:
    target.sent[type_] = target.sent.get(type_, 0) + 1
    started = time.monotonic()
    frame: bytes = msgpack.packb(
        {"v": PROTOCOL_VERSION, "id": "fuzz", "type": type_, "body": body}, use_bin_type=True
    )
    before = target.ledgers()
    target.peer.send_frames(frame)
    reply = target.peer.recv_env(timeout=15)
    assert reply is not None, f"no reply to {type_}"
    assert reply.corr == "fuzz", f"{type_}: reply not correlated: {reply.type}"
    # exactly once: the next frame on this DEALER is the pong to a ping sent now
    ping = Envelope(type="node.ping", body={})
    assert target.peer.request_once(ping).corr == ping.id
    assert reply.type in (REPLY, ERROR)
    target.slowest = max(target.slowest, (time.monotonic() - started, type_))
    if reply.type == ERROR:
        err = SubagentsError.from_wire(reply.body)
        assert err.code in WIRE_CODES, err.code
        assert err.code not in ("internal", "error", "store_error"), f"{type_}: {err.message}"
        assert len(msgpack.packb(reply.body, use_bin_type=True)) <= max(4096, 2 * len(frame))
        assert target.ledgers() == before, f"refused {type_} ({err.code}) changed a ledger"


def test_issue12_after_the_fuzz_no_owner_restarted_rss_is_bounded_and_ping_answers(
    target: Target,
) -> None:
    """Runs after the fuzz in this module (pytest keeps file order)."""
    missing = set(TYPE_NAMES) - set(target.sent)
    assert not missing, f"request types never fuzzed: {sorted(missing)}"
    restarts = {a.name: a.restarts for a in target.node.status().actors}
    assert set(restarts.values()) == {0}, restarts
    grown = target.node.rss() - target.rss_before
    assert grown < 64 << 20, f"RSS grew by {grown >> 20} MiB over the fuzz"
    assert target.peer.ping().type == REPLY
    assert target.node.alive()
    print(f"fuzzed {sum(target.sent.values())} requests; slowest {target.slowest}")
