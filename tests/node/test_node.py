"""The node as a process (issue 2, "Tests"; DESIGN §1, §2, §3): round trips over ipc and loopback
tcp, many concurrent clients with every reply matched to its request, reconnect across a
restart, the store after `kill -9`, supervision of a crashing actor with its restart-intensity
limit, and `Busy` instead of unbounded queues under a flood. Real node processes, real sockets.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import subagents_node
from subagents_node.actors.child import cgroup
from subagents_node.client.channel import PendingReply
from subagents_node.client.client import Client
from subagents_node.client.paths import owner_db, read_pid_file
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Ack, Message, Request
from subagents_node.messages.envelope import ERROR, REPLY, Envelope
from subagents_node.messages.errors import (
    BadAddress,
    Busy,
    Internal,
    NodeNotRunning,
    NodeTimeout,
    OwnerUnavailable,
    SubagentsError,
)
from subagents_node.messages.node import DebugRaise, DebugSleep, NodeStatus, Ping, Pong
from subagents_node.node.containment import ContainmentProbe
from subagents_node.node.node import Node
from subagents_node.node.options import NodeOptions
from subagents_node.node.owners import owner_classes
from subagents_node.node.store import Store
from subagents_node.node.supervision import RestartIntensity
from tests.support.nodes import (
    ForegroundNode,
    NodeProcess,
    RawPeer,
    error_of,
    free_tcp_port,
    new_state_dir,
    run_cli,
    run_in_processes,
    running_node,
)
from tests.support.runs import wait_until

ACTORS = ("capacity", "fanout", "session")


@pytest.fixture(scope="module")
def shared() -> Iterator[NodeProcess]:
    """One --faults node for the tests that neither crash, stop nor reconfigure it."""
    with running_node("--faults") as node:
        yield node


# -- round trips ----------------------------------------------------------------------------------


def test_round_trip_over_ipc_reaches_the_node_and_every_owner_actor(
    shared: NodeProcess,
) -> None:
    node = shared
    assert node.address == f"ipc://{node.state_dir.resolve()}/node.sock"
    client = node.client()
    assert client.ping().pid == node.pid
    status = client.status()
    assert status.endpoints == [node.address]
    assert {a.name for a in status.actors} >= set(ACTORS)
    for actor in ACTORS:
        assert client.ask(DebugSleep(ms=0), Ack, target=actor) == Ack()


def test_state_dir_is_created_private_0700(shared: NodeProcess) -> None:
    assert shared.state_dir.stat().st_mode & 0o777 == 0o700


def test_round_trip_over_loopback_tcp(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    """DESIGN §3: tcp is CURVE; the state dir's own client key (keys generate) is allowed."""
    assert run_cli("keys", "generate", state_dir=state_dir).returncode == 0
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    node = start_node("--faults", "--listen", tcp, state_dir=state_dir)
    client = node.client(address=tcp)
    assert client.ping().pid == node.pid
    assert client.status().endpoints == [node.address, tcp]
    assert client.ask(DebugSleep(ms=0), Ack, target="capacity") == Ack()


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3"])
def test_tcp_on_a_non_loopback_address_is_refused_with_a_clear_error(
    host: str, state_dir: Path
) -> None:
    endpoint = f"tcp://{host}:{free_tcp_port()}"
    with pytest.raises(BadAddress) as info:
        Node(NodeOptions(state_dir=state_dir, listen=[endpoint])).start()
    assert info.value.details == {"address": endpoint}
    assert "loopback" in info.value.message


def test_cli_start_with_a_non_loopback_tcp_listen_fails_and_leaves_no_node(
    state_dir: Path,
) -> None:
    done = run_cli("start", "--detach", "--listen", "tcp://0.0.0.0:7700", state_dir=state_dir)
    assert done.returncode != 0
    assert "refusing to listen on tcp://0.0.0.0:7700" in done.stderr
    assert "loopback" in done.stderr
    assert "Traceback" not in done.stderr
    assert read_pid_file(state_dir) is None


def test_an_extra_ipc_listen_path_that_is_a_file_is_refused_and_the_file_kept(
    state_dir: Path, tmp_path: Path
) -> None:
    """zmq unlinks whatever is at an ipc path before binding: a `listen` from a cloned
    repository's subagents.toml must not delete the user's file."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    done = run_cli("start", "--detach", "--listen", f"ipc://{precious}", state_dir=state_dir)
    assert done.returncode != 0
    assert "exists and is not a socket" in done.stderr
    assert "Traceback" not in done.stderr
    assert precious.read_text() == "keep me"
    assert read_pid_file(state_dir) is None


def test_an_extra_ipc_listen_path_in_the_state_dir_is_refused(state_dir: Path) -> None:
    endpoint = f"ipc://{state_dir.resolve()}/runs.sock"
    with pytest.raises(BadAddress, match="the sockets in the state dir are the node's own"):
        Node(NodeOptions(state_dir=state_dir, listen=[endpoint])).start()


def test_an_extra_ipc_listen_path_another_node_serves_is_refused(
    shared: NodeProcess, state_dir: Path
) -> None:
    done = run_cli("start", "--detach", "--listen", shared.address, state_dir=state_dir)
    assert done.returncode != 0
    assert "another process serves that socket" in done.stderr
    assert shared.client().ping().pid == shared.pid
    assert read_pid_file(state_dir) is None


def test_an_extra_ipc_listen_path_left_by_a_dead_process_is_reused(
    state_dir: Path, tmp_path: Path
) -> None:
    import socket

    left = tmp_path / "left.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(left))  # bound, never listening, then closed: a leftover socket file
    with (
        Node.embedded(state_dir=state_dir, listen=[f"ipc://{left}"]) as node,
        Client(ZmqTransport(f"ipc://{left}")) as client,
    ):
        assert client.ping().node_id == node.node_id


def test_embedded_node_serves_in_process_and_zmq_clients(state_dir: Path) -> None:
    with Node.embedded(state_dir=state_dir, faults=True) as node:
        inproc, over_zmq = node.client(), node.client("zmq")
        assert inproc.ping().node_id == over_zmq.ping().node_id == node.node_id
        assert inproc.ask(DebugSleep(ms=0), Ack, target="session") == Ack()
        assert over_zmq.ask(DebugSleep(ms=0), Ack, target="session") == Ack()
    assert not (state_dir / "node.sock").exists()
    assert read_pid_file(state_dir) is None


def test_connect_finds_the_node_through_subagents_node(
    shared: NodeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUBAGENTS_NODE", shared.address)
    with subagents_node.connect() as client:
        assert client.ping().pid == shared.pid


def test_connect_without_address_uses_the_default_state_dir(
    shared: NodeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUBAGENTS_STATE_DIR", str(shared.state_dir))
    with subagents_node.connect() as client:
        assert client.address == shared.address
        assert client.ping().pid == shared.pid


# -- 32 concurrent clients x 200 requests -------------------------------------------------------

#: Requests whose replies have different shapes: a reply matched to the wrong request fails
#: validation against that request's declared Result (Pong, NodeStatusResult, Ack).
REQUEST_MIX: tuple[tuple[Request, str], ...] = (
    (Ping(), ""),
    (NodeStatus(), ""),
    (DebugSleep(ms=0), "capacity"),
    (DebugSleep(ms=0), "fanout"),
    (DebugSleep(ms=0), "session"),
)


def _one_client(transport: ZmqTransport, requests: int, window: int) -> tuple[int, str | None]:
    """Keep up to `window` requests outstanding on this thread's socket; check every reply.

    Returns (matched, first problem). Stops at the first problem so a stall fails in seconds.
    """
    pending: deque[PendingReply] = deque()
    matched = 0
    submitted = 0
    while submitted < requests or pending:
        if submitted < requests and len(pending) < window:
            request, target = REQUEST_MIX[submitted % len(REQUEST_MIX)]
            pending.append(transport.submit(request, target))
            submitted += 1
            continue
        reply = pending.popleft()
        try:
            result: Message = reply.result(timeout=10)
        except SubagentsError as err:
            return matched, f"{reply.request.type}: {err.code}: {err.message}"
        if type(result) is not reply.request.Result:
            return matched, f"{reply.request.type} answered with {type(result).__name__}"
        matched += 1
    return matched, None


def client_load(address: str, threads: int, requests: int, window: int) -> tuple[int, list[str]]:
    """`threads` concurrent clients (one DEALER each) in this process; (matched, problems)."""
    transport = ZmqTransport(address)
    outcomes: list[tuple[int, str | None]] = []
    start = threading.Barrier(threads)

    def run() -> None:
        start.wait()
        outcomes.append(_one_client(transport, requests, window))

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()  # bounded: every wait inside has a timeout
    transport.close()
    return sum(m for m, _ in outcomes), [p for _, p in outcomes if p is not None]


@pytest.mark.slow
def test_32_concurrent_clients_x_200_requests_every_reply_matched_to_its_request(
    shared: NodeProcess,
) -> None:
    """8 clients are threads of this process, 24 are threads of 3 other processes."""
    node = shared
    requests, window = 200, 20
    results: list[tuple[int, list[str]]] = []

    def other_processes() -> None:
        load = [(node.address, 8, requests, window)] * 3
        results.extend(run_in_processes(client_load, load, timeout=120))

    pool = threading.Thread(target=other_processes)
    pool.start()
    results.append(client_load(node.address, 8, requests, window))
    pool.join(150)
    assert len(results) == 4
    problems = [p for _, found in results for p in found]
    assert problems == []
    assert sum(matched for matched, _ in results) == 32 * requests
    assert node.alive()


def test_raw_replies_carry_the_correlation_id_of_their_request_exactly_once(
    shared: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    peers = [raw_dealer(shared.address) for _ in range(4)]
    sent: dict[int, set[str]] = {}
    for k, peer in enumerate(peers):
        sent[k] = {
            peer.send_env(Envelope(type=r.type, body=r.to_body(), target=t))
            for _ in range(10)
            for r, t in REQUEST_MIX
        }
    for k, peer in enumerate(peers):
        seen: list[str] = []
        while len(seen) < len(sent[k]):
            reply = peer.recv_env(timeout=10)
            assert reply is not None
            assert reply.type == REPLY, reply.body
            seen.append(str(reply.corr))
        assert sorted(seen) == sorted(sent[k])  # each of its own requests, once, none of others'


# -- restart, reconnect, kill -9 ----------------------------------------------------------------


def test_client_reconnects_after_the_node_restarts_on_the_same_state_dir(
    node: NodeProcess,
) -> None:
    transport = node.transport()
    client = subagents_node.Client(transport, timeout=10)
    first_pid = node.pid
    assert client.ping().pid == first_pid
    in_flight = transport.submit(DebugSleep(ms=500), "capacity")

    assert node.stop().returncode == 0
    # Answered if the actor finished before the gateway closed, else lost with it: both are
    # allowed; hanging or a reply of the wrong shape is not.
    with contextlib.suppress(NodeTimeout):
        assert in_flight.result(timeout=0.5) == Ack()
    with pytest.raises(NodeNotRunning):
        client.ping()

    node.start()
    assert node.pid != first_pid
    assert client.ping().pid == node.pid  # same transport, same thread, same socket
    assert client.ask(DebugSleep(ms=0), Ack, target="capacity") == Ack()
    other_thread: list[Pong] = []
    worker = threading.Thread(target=lambda: other_thread.append(client.ping()))
    worker.start()
    worker.join(15)
    assert [p.pid for p in other_thread] == [node.pid]


def test_kill_9_then_restart_keeps_the_store_intact_and_acknowledged_claims(
    node: NodeProcess,
) -> None:
    client = node.client()
    budget = client.fanout.create(root_run_id="before-kill", limit=5)
    assert client.fanout.claim(budget, ["tasks[0]", "tasks[1]"]).used == 2
    first_pid = node.pid

    node.kill()
    assert not node.alive()
    assert read_pid_file(node.state_dir) is None  # the stale pid record is not a live node
    assert (node.state_dir / "node.sock").exists()  # left behind by the killed node

    node.start()
    assert node.pid != first_pid
    for owner in owner_classes():  # each owner process keeps its own database file (DESIGN §5)
        store = Store(owner_db(node.state_dir, owner.name))
        assert store.integrity_check() == "ok"
        assert store.versions()[owner.name] == len(owner.MIGRATIONS)
    client = node.client()
    assert client.ping().pid == node.pid
    assert client.fanout.snapshot(budget).used == 2
    assert client.fanout.claim(budget, ["tasks[2]"]).used == 3


class _ToldProbe(ContainmentProbe):
    """An early probe whose answer no real probe gives, to see whether the node took it."""

    def _run(self) -> None:
        self._found = cgroup.Containment("subreaper", why="told by the early probe")


@pytest.mark.parametrize("same", [True, False], ids=["its-state-dir", "another-state-dir"])
def test_a_node_takes_the_early_containment_probe_only_for_its_own_state_dir(same: bool) -> None:
    """`start` probes the containment while the node's code loads (runtime/node/containment.py):
    the node uses that answer only when it was probed for its own state dir and setting."""
    state = new_state_dir()
    key = str(state.resolve()) if same else str(new_state_dir().resolve())
    probe = _ToldProbe("subreaper", key)
    settings = {"containment": "subreaper"}
    with Node.embedded(state_dir=state, settings=settings, containment_probe=probe) as node:
        told = node.containment.why == "told by the early probe"
        assert told == same
        assert node.containment.mode == "subreaper"


def test_a_second_node_on_the_same_state_dir_is_refused(shared: NodeProcess) -> None:
    done = run_cli("start", "--detach", state_dir=shared.state_dir)
    assert done.returncode != 0
    assert f"a node (pid {shared.pid}) already serves" in done.stderr
    assert shared.client().ping().pid == shared.pid


# -- supervision ----------------------------------------------------------------------------------


def test_an_actor_that_raises_is_answered_internal_restarted_and_serves_the_next_request(
    node: NodeProcess,
) -> None:
    client = node.client()
    with pytest.raises(Internal) as info:
        client.ask(DebugRaise(), Ack, target="capacity")
    assert info.value.details == {"actor": "capacity"}
    assert "injected fault in capacity" in info.value.message
    restarts = {a.name: a.restarts for a in client.status().actors}
    assert restarts["capacity"] == 1
    assert all(restarts[name] == 0 for name in ACTORS if name != "capacity")
    assert client.ask(DebugSleep(ms=0), Ack, target="capacity") == Ack()
    assert node.alive()


def test_in_process_crash_is_answered_internal_and_counted_without_stopping_the_node(
    embedded_node: Node,
) -> None:
    client = embedded_node.client()
    with pytest.raises(Internal):
        client.ask(DebugRaise(), Ack, target="session")
    # The owner's word on its restart travels on its control pipe, not with the reply: it may
    # reach the node a moment after the client has its answer.
    wait_until(
        lambda: {a.name: a.restarts for a in client.status().actors}["session"] == 1,
        what="the in-place restart counted",
    )
    assert client.ask(DebugSleep(ms=0), Ack, target="session") == Ack()
    assert embedded_node.failure is None


def test_restart_intensity_trips_once_on_the_4th_crash_inside_the_window() -> None:
    now = [0.0]
    reasons: list[str] = []
    intensity = RestartIntensity(reasons.append, max_restarts=3, window_s=5.0, clock=lambda: now[0])
    boom = RuntimeError("boom")
    for t in (0.0, 1.0, 2.0):
        now[0] = t
        intensity.report("fanout", boom)
    assert reasons == []
    now[0] = 4.9
    intensity.report("fanout", boom)
    assert reasons == [
        "actor 'fanout' crashed 4 times within 5s (limit 3); last error: RuntimeError('boom')"
    ]
    intensity.report("fanout", boom)
    assert len(reasons) == 1  # reported once; the node is already stopping


def test_restart_intensity_forgets_crashes_older_than_the_window() -> None:
    now = [0.0]
    reasons: list[str] = []
    intensity = RestartIntensity(reasons.append, max_restarts=3, window_s=5.0, clock=lambda: now[0])
    for t in (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0):
        now[0] = t
        intensity.report("capacity", RuntimeError())
    assert reasons == []


def test_status_answers_at_once_while_an_actor_is_busy(shared: NodeProcess) -> None:
    """Status is answered by the gateway from what it knows; it never waits on an actor."""
    transport = shared.transport()
    busy = transport.submit(DebugSleep(ms=1200), "session")
    client = shared.client(timeout=1.0)
    for _ in range(3):
        assert {a.name: a.restarts for a in client.status().actors}["session"] == 0
    assert busy.result(timeout=10) == Ack()


def test_an_owner_past_its_restart_intensity_is_failed_and_the_others_keep_serving(
    foreground_node: Callable[..., ForegroundNode],
) -> None:
    """Issue 11: more than 3 crashes of one owner within 5 s mark that owner `failed` (status
    says why), its callers get OwnerUnavailable at once, and the node serves the others."""
    fg = foreground_node("--faults")
    transport = ZmqTransport(fg.address)
    client = Client(ZmqTransport(fg.address), timeout=10)
    try:
        for _ in range(3):
            with pytest.raises(Internal):
                transport.call(DebugRaise(), timeout=10, target="fanout")
        transport.submit(DebugRaise(), "fanout")  # the 4th: its reply may not make it out
        fanout = wait_until(
            lambda: next(
                (a for a in client.status().actors if a.name == "fanout" and a.state == "failed"),
                None,
            ),
            timeout=20,
            what="fanout marked failed",
        )
        assert "crashed 4 times within 5s (limit 3)" in fanout.reason
        assert "injected fault in fanout" in fanout.reason
        with pytest.raises(OwnerUnavailable) as refused:
            client.fanout.create(root_run_id="after-failure", limit=3)
        assert refused.value.details["owner"] == "fanout"
        assert refused.value.details["state"] == "failed"
        # Every other owner still answers, and the node process is still up.
        assert client.capacity.snapshot("s-1").used == 0
        assert client.ping().pid == fg.proc.pid
        assert fg.proc.poll() is None
        others = {a.name: a.state for a in client.status().actors if a.name != "fanout"}
        assert set(others.values()) == {"running"}
    finally:
        transport.close()
        client.close()
    assert "owner fanout failed" in fg.log()


# -- backpressure ---------------------------------------------------------------------------------


def _collect(peer: RawPeer, expected: set[str]) -> dict[str, list[Envelope]]:
    """Every reply until each expected id has one, then up to a barrier ping (duplicates show)."""
    replies: dict[str, list[Envelope]] = defaultdict(list)
    while len(replies) < len(expected):
        reply = peer.recv_env(timeout=10)
        assert reply is not None, f"{len(expected) - len(replies)} requests got no reply"
        assert reply.corr in expected, f"reply to an unknown request: {reply}"
        replies[str(reply.corr)].append(reply)
    barrier = peer.send_env(Envelope(type="node.ping", body={}))
    while (reply := peer.recv_env(timeout=10)) is not None and reply.corr != barrier:
        replies[str(reply.corr)].append(reply)
    assert reply is not None, "no reply to the barrier ping"
    return replies


@pytest.mark.slow
def test_flood_against_a_small_mailbox_gets_busy_replies_exactly_once_and_bounded_memory(
    start_node: Callable[..., NodeProcess], raw_dealer: Callable[[str], RawPeer]
) -> None:
    node = start_node("--faults", "--mailbox-limit", "4")
    peer = raw_dealer(node.address)
    assert peer.ping().type == REPLY

    blocker = peer.send_env(Envelope(type="debug.sleep", body={"ms": 300}, target="fanout"))
    flood = [
        peer.send_env(Envelope(type="debug.sleep", body={"ms": 0}, target="fanout"))
        for _ in range(200)
    ]
    replies = _collect(peer, {blocker, *flood})
    assert all(len(r) == 1 for r in replies.values()), "a request got more than one reply"
    assert replies[blocker][0].type == REPLY
    busy = [error_of(replies[i][0]) for i in flood if replies[i][0].type == ERROR]
    served = [i for i in flood if replies[i][0].type == REPLY]
    assert len(busy) + len(served) == 200
    assert all(isinstance(err, Busy) for err in busy)
    assert all(err.details == {"target": "fanout", "mailbox": 4, "limit": 4} for err in busy)
    # The blocker holds the actor for 300 ms while the gateway refuses all but 4 at once.
    assert len(busy) >= 100, f"only {len(busy)} of 200 were refused"

    # A larger flood through the client: memory stays bounded and so does the mailbox.
    rss_before = node.rss()
    transport = node.transport()
    for _ in range(5):
        hold = transport.submit(DebugSleep(ms=200), "fanout")
        pending = [transport.submit(DebugSleep(ms=0), "fanout") for _ in range(1000)]
        depth = {a.name: a.mailbox for a in node.status().actors}
        assert depth["fanout"] <= 4
        outcomes = []
        for reply in pending:
            try:
                outcomes.append(reply.result(timeout=30))
            except Busy as err:
                outcomes.append(err)
        assert len(outcomes) == 1000
        assert hold.result(timeout=10) == Ack()
    growth = node.rss() - rss_before
    assert growth < 64 * 1024 * 1024, f"node RSS grew by {growth / 1e6:.1f} MB under a flood"
    assert node.client().ping().pid == node.pid
