"""A flood of unauthenticated tcp connections that send nothing, past the process's limit on
open files, aborts neither a home node nor its ledger owner (docs/operations.md).

libzmq holds a descriptor for each tcp connection before any key is checked; its tcp accept
survives EMFILE, its ipc accept asserts on it. Before the TcpBudget (actors/tcpbudget.py), the
first ipc connection after such a flood (any CLI command) aborted the node, and an owner whose
own tcp port was flooded was SIGABRTed. The home runs under `prlimit --nofile=256:256` (its
owners inherit it); the flood comes from this process, which keeps its own limit.

An operator sees each shed outside node.log too: `status --json` lists every tcp listener (the
gateway, each ledger owner's own port) with its budget, connections open, sheds and the time
of the last one, `status` adds one line once a listener shed, and `doctor` warns with the
remedy docs/operations.md gives.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest

from subagents_node.actors.tcpbudget import budget_for
from subagents_node.client.client import Client
from subagents_node.client.keys import (
    CLIENT_KEY,
    ClientCredentials,
    Keypair,
    keys_dir,
    read_keypair,
)
from subagents_node.client.paths import ADDRESS_BOOK_NAME, OWNER_SOCKETS
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.node import Ping, Pong
from tests.support.fleet import Fleet, fleet
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow

#: The home's limit on open files (soft and hard), and how many connections the flood tries:
#: well past it, so that without a budget every descriptor is taken.
LIMIT = 256
FLOOD = 3 * LIMIT
#: The tcp connections the node and each owner hold at most under that limit.
BUDGET = budget_for(LIMIT)


def _low_limit_home(name: str) -> tuple[str, ...]:
    return ("prlimit", f"--nofile={LIMIT}:{LIMIT}") if name == "home" else ()


@pytest.fixture(scope="module")
def crew() -> Iterator[Fleet]:
    with fleet(("w1",), place=_low_limit_home) as started:
        yield started


@contextlib.contextmanager
def _flood(endpoint: str) -> Iterator[int]:
    """FLOOD raw tcp connections to `endpoint` that send nothing, held open while in the
    block; yields how many were accepted by the kernel (the rest were refused)."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    held: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            with contextlib.suppress(OSError):  # refused while the listener is unbound
                held.append(socket.create_connection((host, int(port)), timeout=2))
        yield len(held)
    finally:
        for sock in held:
            sock.close()


def _w1(crew: Fleet) -> ClientCredentials:
    pair = read_keypair(keys_dir(crew.workers["w1"].state_dir) / CLIENT_KEY)
    return ClientCredentials(Keypair(pair.public, pair.secret), crew.home_key)


def _pids(crew: Fleet) -> dict[str, int | None]:
    with Client(ZmqTransport(crew.home.address), timeout=10.0) as client:
        return {a.name: a.pid for a in client.status().actors}


def _served_over_ipc(crew: Fleet, times: int = 5) -> None:
    """`times` new ipc connections, each answered (one of them is the CLI's)."""
    for _ in range(times):
        with Client(ZmqTransport(crew.home.address), timeout=10.0) as client:
            client.ask(Ping(), Pong)
    code, out, err = crew.cli(crew.home, "status", "--json")
    assert code == 0 and json.loads(out), err


def _listener(crew: Fleet, name: str) -> dict[str, object] | None:
    """The listener `name` as `status --json` shows it (None: not listed)."""
    code, out, err = crew.cli(crew.home, "status", "--json")
    assert code == 0, err
    return next((t for t in json.loads(out)["tcp"] if t["name"] == name), None)


def _shed_is_shown(crew: Fleet, name: str, flooded: float) -> None:
    """`status --json`, `status` and `doctor` show that listener `name` shed since `flooded`."""
    shown = wait_until(
        lambda: (t := _listener(crew, name)) is not None and int(str(t["sheds"])) > 0 and t,
        what=f"status --json to show the sheds of {name}",
    )
    assert shown["budget"] == BUDGET, shown
    assert 0 <= int(str(shown["open"])) < BUDGET, shown
    assert flooded <= float(str(shown["last_shed"])) <= time.time(), shown
    code, out, err = crew.cli(crew.home, "status")
    assert code == 0, err
    said = [line for line in out.splitlines() if line.startswith("tcp floods shed:")]
    assert len(said) == 1 and f"{name} shed " in said[0], out
    code, out, err = crew.cli(crew.home, "doctor")
    warning = next(
        (line for line in out.splitlines() if line.startswith(f"[warn] tcp flood {name}:")), ""
    )
    assert f"{name} shed " in warning, out
    assert "connlimit" in out and "hard limit on open files" in out, out


def test_a_flood_of_idle_tcp_connections_does_not_abort_the_node_and_its_peers_are_served_after(
    crew: Fleet,
) -> None:
    before = _pids(crew)
    began = time.time()
    with _flood(crew.endpoint) as held:
        assert held > 0
        _served_over_ipc(crew)
        assert crew.home.alive(), crew.home.log()[-2000:]
    assert _pids(crew) == before, "an owner was restarted (its pid changed)"
    assert f"gateway: {BUDGET} tcp connections open at once" in crew.home.log()
    with Client(ZmqTransport(crew.endpoint, credentials=_w1(crew)), timeout=15.0) as peer:
        peer.ask(Ping(), Pong)
    # The worker's own link, closed by the shed, reconnected by itself: it heartbeats again.
    flooded = time.time()
    wait_until(
        lambda: (crew.nodes()["w1"].last_heartbeat or 0.0) > flooded, what="w1 heartbeats again"
    )
    _served_over_ipc(crew, times=1)
    _shed_is_shown(crew, "gateway", began)


def test_a_flood_of_a_ledger_owners_own_tcp_port_does_not_abort_the_owner(crew: Fleet) -> None:
    book = json.loads((crew.home.state_dir / ADDRESS_BOOK_NAME).read_text())
    capacity = str(book["home"]["owners"]["capacity"])
    before = _pids(crew)
    flooded = time.time()
    with _flood(capacity) as held:
        assert held > 0
        _served_over_ipc(crew)
        # New ipc connections straight to the owner's socket: the owner's own accepts (a
        # client of the node reaches it over the node's one connection).
        own = f"ipc://{crew.home.state_dir / OWNER_SOCKETS['capacity']}"
        for _ in range(5):
            with Client(ZmqTransport(own), timeout=10.0) as client:
                client.capacity.snapshot("s-flood", 1)
    assert _pids(crew) == before, "the capacity owner was restarted (its pid changed)"
    assert f"capacity: {BUDGET} tcp connections open at once" in crew.home.log()
    with Client(ZmqTransport(capacity, credentials=_w1(crew)), timeout=15.0) as peer:
        peer.capacity.snapshot("s-flood-w1", 1)
    _shed_is_shown(crew, "capacity", flooded)


def test_status_json_lists_the_gateway_and_each_ledger_owners_tcp_listener_with_its_budget(
    crew: Fleet,
) -> None:
    """The gateway and each ledger owner's own port, whether they shed or not."""
    book = json.loads((crew.home.state_dir / ADDRESS_BOOK_NAME).read_text())
    assert "capacity" in book["home"]["owners"], book
    for name in ("gateway", *book["home"]["owners"]):
        shown = wait_until(lambda n=name: _listener(crew, n), what=f"{name} listed")
        assert shown["budget"] == BUDGET, shown
