"""Multi-host peers the home must refuse (issue 13): a second process joining as a live worker,
a key joining under another key's name, an operator's request sent over tcp, a key the home
never allowed, and a peer with no CURVE at all. Probed from this process over the home's tcp
socket on loopback (the fleet tests in test_multihost.py run on namespaces as well)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator

import pytest
import zmq

from subagents_node.client.client import Client
from subagents_node.client.keys import (
    CLIENT_KEY,
    ClientCredentials,
    Keypair,
    keys_dir,
    read_allowed,
    read_keypair,
)
from subagents_node.client.paths import ADDRESS_BOOK_NAME
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Ack
from subagents_node.messages.capacity import (
    Acquire,
    AcquireResult,
    MarkStarted,
    ReportTerminal,
    Rollback,
    RollbackResult,
    RunnerProof,
    SlotHandle,
    Verdict,
)
from subagents_node.messages.capacity_hosts import HostReleased, ReleaseHost
from subagents_node.messages.errors import (
    BadRequest,
    CapacityOwnershipChanged,
    MembershipRefused,
    NodeTimeout,
    NotAuthenticated,
)
from subagents_node.messages.members import MemberForget, MemberForgotten, MemberJoin, Membership
from subagents_node.messages.node import Ping, Pong, Shutdown
from subagents_node.messages.peers import OwnerPeers
from subagents_node.messages.supervisor import (
    AgentPlan,
    Launch,
    LaunchResult,
    ListRuns,
    RunList,
    TaskItem,
)
from tests.support.fleet import Fleet, fleet
from tests.support.nodes import new_state_dir, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_crew() -> Iterator[Fleet]:
    with fleet(("w1", "w2")) as started:
        yield started


def _credentials(crew: Fleet, name: str) -> ClientCredentials:
    pair = read_keypair(keys_dir(crew.workers[name].state_dir) / CLIENT_KEY)
    return ClientCredentials(Keypair(pair.public, pair.secret), crew.home_key)


def test_a_second_process_cannot_join_as_a_live_worker_nor_as_another_name(
    local_crew: Fleet,
) -> None:
    crew = local_crew
    keys = _credentials(crew, "w1")
    with Client(ZmqTransport(crew.endpoint, credentials=keys)) as client:
        with pytest.raises(MembershipRefused) as refused:
            client.ask(MemberJoin(name="w1", instance="someone-else"), Membership)
        assert refused.value.details["reason"] == "name_in_use"
        with pytest.raises(MembershipRefused) as refused:
            client.ask(MemberJoin(name="w2", instance="x"), Membership)
        assert refused.value.details["reason"] == "name_mismatch"
        with pytest.raises(BadRequest) as local_only:
            client.ask(MemberForget(name="w2", reason="no"), MemberForgotten)
        assert local_only.value.details["reason"] == "local_only"


def test_an_unauthenticated_peer_and_a_peer_with_an_unknown_key_are_refused_by_the_home(
    local_crew: Fleet,
) -> None:
    crew = local_crew
    stranger = ClientCredentials(Keypair.generate(), crew.home_key)
    with (
        Client(ZmqTransport(crew.endpoint, credentials=stranger)) as client,
        pytest.raises(NotAuthenticated),
    ):
        client.ask(Ping(), Pong)
    # No CURVE at all: the home's tcp socket is a CURVE server and answers nothing.
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 1500)
        sock.connect(crew.endpoint)
        sock.send(b"\x93\x01\x02\x03")
        with pytest.raises(zmq.Again):
            sock.recv()
        sock.close()
    finally:
        ctx.term()


def test_a_worker_may_have_the_home_carry_only_a_nested_childs_run_to_another_worker(
    local_crew: Fleet,
) -> None:
    crew = local_crew
    w1 = _credentials(crew, "w1")  # a worker's own key: it may ask the ledgers, not other hosts
    top_level = Launch(
        session_id="s-place",
        mode="single",
        background=True,
        items=[TaskItem(agent=AgentPlan(name="t", command=["true"]), task="x")],
        cwd="/",
    )
    with Client(ZmqTransport(crew.endpoint, credentials=w1, host="w2")) as client:
        for request, result in ((ListRuns(limit=1), RunList), (top_level, LaunchResult)):
            with pytest.raises(BadRequest) as refused:
                client.ask(request, result)  # type: ignore[arg-type]
            assert refused.value.details["reason"] == "not_placeable"
    assert not crew.client(crew.workers["w2"]).runs.list(session_id="s-place")


def test_a_key_allowed_as_home_cannot_join_as_the_homes_own_name(local_crew: Fleet) -> None:
    crew = local_crew
    pair = Keypair.generate()
    allowed = run_cli(
        "keys", "allow", "--name", "home", "--", pair.public, state_dir=crew.home.state_dir
    )
    assert allowed.returncode == 0, allowed.stderr
    keys = ClientCredentials(pair, crew.home_key)
    with Client(ZmqTransport(crew.endpoint, credentials=keys)) as client:
        with pytest.raises(MembershipRefused) as refused:
            client.ask(MemberJoin(name="home", instance="x"), Membership)
        assert refused.value.details["reason"] == "name_reserved"
    done = run_cli("start", "--join", crew.endpoint, "--home-key", crew.home_key, "--name", "home")
    assert done.returncode != 0 and "a worker cannot be named 'home'" in done.stderr


def _owner_endpoint(crew: Fleet, owner: str) -> str:
    book = json.loads((crew.home.state_dir / ADDRESS_BOOK_NAME).read_text())
    return str(book["home"]["owners"][owner])


def test_a_ledger_owners_own_tcp_socket_refuses_strangers_operator_acts_and_spoofed_hosts(
    local_crew: Fleet,
) -> None:
    crew = local_crew
    capacity = _owner_endpoint(crew, "capacity")
    stranger = ClientCredentials(Keypair.generate(), crew.home_key)
    with (
        Client(ZmqTransport(capacity, credentials=stranger)) as client,
        pytest.raises(NotAuthenticated),
    ):
        client.capacity.snapshot("s-stranger", 1)
    with Client(ZmqTransport(capacity, credentials=_credentials(crew, "w1"))) as client:
        release = ReleaseHost(host="w2", reason="not yours", operator="w1")
        with pytest.raises(BadRequest) as refused:
            client.ask(release, HostReleased)
        assert refused.value.details["reason"] == "local_only"
        with pytest.raises(BadRequest) as told:
            client.ask(OwnerPeers(allowed={}), Ack, target="capacity")
        assert told.value.details["reason"] == "local_only"
        spoof = Acquire(session_id="s-spoof", limit=2, run_id="r-spoof", host="w2")
        handle = client.ask(spoof, AcquireResult).handle
    held = {h.host: h.reserved for h in crew.client(crew.home).capacity.hosts().hosts}
    assert held.get("w1") == 1 and "w2" not in held  # w1 cannot hold a slot in w2's name
    assert handle is not None
    undone = crew.client(crew.home).ask(Rollback(handle=handle), RollbackResult)
    assert undone.rolled_back


def test_a_workers_key_is_no_operator_of_the_home_node_itself(local_crew: Fleet) -> None:
    """A worker's key speaks for that worker alone: the home answers its ping and its ledger
    requests, and refuses it the home's runs, a top-level run on the home and the home's stop."""
    crew = local_crew
    top_level = Launch(
        session_id="s-home-op",
        mode="single",
        background=True,
        items=[TaskItem(agent=AgentPlan(name="t", command=["true"]), task="x")],
        cwd="/",
    )
    refused_asks = ((ListRuns(limit=1), RunList), (top_level, LaunchResult), (Shutdown(), Ack))
    for host in ("", "home"):
        with Client(
            ZmqTransport(crew.endpoint, credentials=_credentials(crew, "w1"), host=host)
        ) as client:
            assert client.ask(Ping(), Pong).node_id
            for request, result in refused_asks:
                with pytest.raises(BadRequest) as refused:
                    client.ask(request, result)  # type: ignore[arg-type]
                assert refused.value.details["reason"] == "not_placeable"
    home = crew.client(crew.home)
    assert home.ask(Ping(), Pong).node_id  # still serving
    assert not home.runs.list(session_id="s-home-op")


@pytest.mark.parametrize("way", ["gateway", "owner socket"])
def test_r_cap_21_a_worker_cannot_start_roll_back_or_free_another_hosts_slot(
    local_crew: Fleet, way: str
) -> None:
    """What a worker sends is stamped with its name; a slot the home holds for another host
    (here the home's own) is not its to start, roll back or free, even with a matching proof."""
    crew = local_crew
    home = crew.client(crew.home)
    session = f"s-victim-{way.split()[0]}"
    held = home.ask(Acquire(session_id=session, limit=1, run_id=f"r-{way[0]}1"), AcquireResult)
    assert held.handle is not None
    handle = held.handle
    endpoint = crew.endpoint if way == "gateway" else _owner_endpoint(crew, "capacity")
    forged = RunnerProof(state="observed", runner_id="forged", pid=1)
    with Client(ZmqTransport(endpoint, credentials=_credentials(crew, "w1"))) as w1:
        with pytest.raises(CapacityOwnershipChanged) as changed:
            w1.ask(MarkStarted(handle=handle, runner_id="forged", pid=1), SlotHandle)
        assert changed.value.reason == "host_mismatch"
        assert not w1.ask(Rollback(handle=handle), RollbackResult).rolled_back
        report = ReportTerminal(
            session_id=session, run_id=handle.run_id, state="complete", proof=forged
        )
        assert w1.ask(report, Verdict).verdict == "not-owned"
    assert home.capacity.snapshot(session, 1).used == 1  # still held, and unstarted
    assert home.ask(Rollback(handle=handle), RollbackResult).rolled_back


def test_a_key_revoked_while_connected_to_a_ledger_owner_is_refused_from_its_next_frame(
    local_crew: Fleet,
) -> None:
    crew = local_crew
    pair = Keypair.generate()
    allowed = run_cli(
        "keys", "allow", "--name", "wx", "--", pair.public, state_dir=crew.home.state_dir
    )
    assert allowed.returncode == 0, allowed.stderr
    fanout = _owner_endpoint(crew, "fanout")
    keys = ClientCredentials(pair, crew.home_key)
    with Client(ZmqTransport(fanout, credentials=keys), timeout=2.0) as client:
        descriptor = client.fanout.create("root-wx", 3)
        assert client.fanout.snapshot(descriptor).limit == 3
        revoked = run_cli("keys", "revoke", "wx", state_dir=crew.home.state_dir)
        assert revoked.returncode == 0, revoked.stderr
        with pytest.raises(NodeTimeout):  # dropped unanswered, on the same connection
            client.fanout.snapshot(descriptor)


def test_a_key_allowed_by_hand_on_the_home_reaches_its_ledger_owners_own_sockets(
    local_crew: Fleet,
) -> None:
    """The home takes in an edited allow-list at its next handshake (runtime/node/curve.py)
    and tells its ledger owners, whose own tcp sockets admit the same keys: before, the
    owners knew only what `keys allow|revoke` had told them."""
    crew = local_crew
    pair = Keypair.generate()
    path = keys_dir(crew.home.state_dir) / "allowed.toml"
    entries = {**read_allowed(path), "by-hand": pair.public}
    edited = path.with_name("edited~")
    edited.write_text("[clients]\n" + "".join(f'"{n}" = "{k}"\n' for n, k in entries.items()))
    edited.chmod(0o600)
    edited.replace(path)
    keys = ClientCredentials(pair, crew.home_key)
    with Client(ZmqTransport(crew.endpoint, credentials=keys), timeout=5.0) as client:
        assert client.ask(Ping(), Pong).pid == crew.home.pid  # the home's gateway admits it
    fanout = _owner_endpoint(crew, "fanout")
    deadline = time.monotonic() + 10.0
    while True:  # the owners are told by a message: admitted once it has arrived
        try:
            with Client(ZmqTransport(fanout, credentials=keys), timeout=1.0) as client:
                assert client.fanout.snapshot(client.fanout.create("root-hand", 2)).limit == 2
            break
        except (NotAuthenticated, NodeTimeout):
            if time.monotonic() > deadline:
                raise


def test_a_home_needs_a_fixed_port_because_its_ledger_owners_listen_on_the_next_three() -> None:
    state_dir = new_state_dir()
    try:
        listen = "tcp://127.0.0.1:65534"
        done = run_cli("start", "--home", "--listen", listen, state_dir=state_dir)
        assert done.returncode != 0
        assert f"a home needs a fixed tcp port (1-65532), not {listen}" in done.stderr
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def test_a_home_whose_ledger_owner_port_is_taken_is_refused_at_start_in_one_line() -> None:
    """It used to start, say so, and leave its fan-out owner `failed` (a bind error, four times
    within five seconds): a port another process holds is refused before anything forks."""
    state_dir = new_state_dir()
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        fanout_port = squatter.getsockname()[1]
        listen = f"tcp://127.0.0.1:{fanout_port - 2}"
        done = run_cli("start", "--detach", "--home", "--listen", listen, state_dir=state_dir)
        assert done.returncode != 0
        assert f"cannot listen on tcp://127.0.0.1:{fanout_port} (the fanout owner's port" in (
            done.stderr
        )
        assert len(done.stderr.strip().splitlines()) == 1
        assert run_cli("ping", state_dir=state_dir).returncode != 0
    finally:
        squatter.close()
        run_cli("stop", state_dir=state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
