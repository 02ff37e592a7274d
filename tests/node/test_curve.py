"""DESIGN §3 against a real node: every tcp listener is CURVE with an allow-list (issue 12).

The peers here are real sockets on loopback: a bare DEALER with no security (the original
exploit), a CURVE client whose key was never allowed, one whose key is revoked while it is
connected, and the allow-listed one. A refused peer gets no reply at all; our own transport
reports the refusal as `NotAuthenticated` from its handshake events, within a bounded wait.
A node (and a home's ledger owners) listening on IPv6 loopback serves there too.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from subagents_node import AsyncClient
from subagents_node.client.client import Client, connect
from subagents_node.client.keys import (
    CLIENT_KEY,
    SERVER_KEY,
    ClientCredentials,
    Keypair,
    keys_dir,
    read_allowed,
    read_keypair,
)
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.envelope import Envelope
from subagents_node.messages.errors import BadRequest, NodeTimeout, NotAuthenticated
from subagents_node.messages.keys import AllowedKeys, KeysAllow, KeysList
from subagents_node.messages.supervisor import AgentPlan, Launch, TaskItem
from subagents_node.node.node import Node
from tests.support.nodes import NodeProcess, RawPeer, run_cli

#: A refused peer hears nothing; this is how long a test listens for that nothing.
SILENCE_S = 1.5
#: Our transport must report a refused handshake well within this.
REFUSAL_S = 5.0


def _credentials(state_dir: Path, client: Keypair | None = None) -> ClientCredentials:
    server = read_keypair(keys_dir(state_dir) / SERVER_KEY).public
    return ClientCredentials(client or read_keypair(keys_dir(state_dir) / CLIENT_KEY), server)


def _client(address: str, credentials: ClientCredentials, timeout: float = REFUSAL_S) -> Client:
    return Client(ZmqTransport(address, credentials=credentials), timeout=timeout)


def _exploit(marker: Path) -> Launch:
    """Issue 12, item 1: a launch whose agent command writes the node user's id to `marker`."""
    agent = AgentPlan(name="evil", command=["/bin/sh", "-c", f"id > {marker}"])
    return Launch(
        session_id="attacker",
        mode="single",
        background=True,
        items=[TaskItem(agent=agent, task="x")],
        cwd=str(marker.parent),
    )


def test_design_3_allow_listed_key_is_served_over_tcp(tcp_node: tuple[NodeProcess, str]) -> None:
    node, tcp = tcp_node
    with _client(tcp, _credentials(node.state_dir)) as client:
        assert client.ping().pid == node.pid
        assert client.status().endpoints == [node.address, tcp]


def test_design_3_principal_of_a_tcp_request_is_its_key_name_in_the_log(
    tcp_node: tuple[NodeProcess, str],
) -> None:
    node, tcp = tcp_node
    with _client(tcp, _credentials(node.state_dir)) as client:
        client.ping()
        with pytest.raises(BadRequest):
            client.ask(KeysAllow(name="x", public_key=Keypair.generate().public), AllowedKeys)
    assert "admitted as local" in node.log()
    assert "(principal local)" in node.log()


def test_issue_12_unauthenticated_tcp_launch_does_not_run_its_command(
    tcp_node: tuple[NodeProcess, str], raw_dealer: Callable[[str], RawPeer], tmp_path: Path
) -> None:
    """The original exploit: `runs.launch` of `/bin/sh -c 'id > F'` from a peer with no key."""
    node, tcp = tcp_node
    marker = tmp_path / "pwned"
    launch = _exploit(marker)
    peer = raw_dealer(tcp)  # no security mechanism at all, as in the report
    peer.send_env(Envelope(type=launch.type, body=launch.to_body(), target=launch.target))
    assert peer.recv_env(SILENCE_S) is None
    # The same request over the node's own ipc socket does run (so the request is not merely
    # invalid): watch that run to its end, then check the tcp one never ran.
    with node.client() as local:
        run = local.runs.launch(_exploit(tmp_path / "local"))
        local.runs.wait(run.run_id, timeout=30)
    assert (tmp_path / "local").exists()
    assert not marker.exists()


def test_design_3_unknown_key_is_refused_with_a_typed_error_and_no_reply(
    tcp_node: tuple[NodeProcess, str], tmp_path: Path
) -> None:
    node, tcp = tcp_node
    stranger = _credentials(node.state_dir, Keypair.generate())
    started = time.monotonic()
    with _client(tcp, stranger, timeout=30.0) as client, pytest.raises(NotAuthenticated):
        client.runs.launch(_exploit(tmp_path / "pwned"))
    assert time.monotonic() - started < REFUSAL_S
    assert not (tmp_path / "pwned").exists()
    assert "is not allowed" in node.log()


def test_design_3_wrong_server_key_gets_no_service(
    tcp_node: tuple[NodeProcess, str],
) -> None:
    """A client that trusts another server key never completes a handshake with this node."""
    node, tcp = tcp_node
    mine = read_keypair(keys_dir(node.state_dir) / CLIENT_KEY)
    wrong = ClientCredentials(mine, Keypair.generate().public)
    with (
        _client(tcp, wrong, timeout=SILENCE_S) as client,
        pytest.raises((NotAuthenticated, NodeTimeout)),
    ):
        client.ping()


def test_design_3_revoked_key_is_refused_without_a_restart(
    tcp_node: tuple[NodeProcess, str], raw_dealer: Callable[[str], RawPeer]
) -> None:
    node, tcp = tcp_node
    peer_keys = Keypair.generate()
    allowed = run_cli(
        "keys", "allow", "--name", "worker-1", "--", peer_keys.public, state_dir=node.state_dir
    )
    assert allowed.returncode == 0, allowed.stderr
    assert read_allowed(keys_dir(node.state_dir) / "allowed.toml")["worker-1"] == peer_keys.public
    creds = _credentials(node.state_dir, peer_keys)
    connected = _client(tcp, creds, timeout=SILENCE_S)
    assert connected.ping().pid == node.pid  # admitted without a restart
    revoked = run_cli("keys", "revoke", "worker-1", state_dir=node.state_dir)
    assert revoked.returncode == 0, revoked.stderr
    # The peer that stays connected is refused from its next frame on (no reply) ...
    with pytest.raises(NodeTimeout):
        connected.ping()
    connected.close()
    # ... and a new connection with that key fails its handshake.
    with _client(tcp, creds) as fresh, pytest.raises(NotAuthenticated):
        fresh.ping()
    assert "dropped a tcp frame from a key no longer allowed" in node.log()


def test_design_3_tcp_client_without_keys_is_told_how_to_get_them(
    tcp_node: tuple[NodeProcess, str], tmp_path: Path
) -> None:
    _, tcp = tcp_node
    done = run_cli("--timeout", "3", "--address", tcp, "ping", state_dir=tmp_path / "empty")
    assert done.returncode != 0
    assert "keys generate" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_design_3_key_files_are_private(tcp_node: tuple[NodeProcess, str]) -> None:
    node, _ = tcp_node
    directory = keys_dir(node.state_dir)
    assert directory.stat().st_mode & 0o777 == 0o700
    for path in directory.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    shown = run_cli("keys", "show", state_dir=node.state_dir)
    secret = read_keypair(directory / SERVER_KEY).secret
    assert shown.returncode == 0 and secret not in shown.stdout
    assert read_keypair(directory / SERVER_KEY).public in shown.stdout


def test_design_3_ipc_needs_no_keys(node: NodeProcess) -> None:
    assert not keys_dir(node.state_dir).exists()
    assert node.client().ping().pid == node.pid
    assert (node.state_dir / "node.sock").stat().st_mode & 0o777 == 0o600


def test_keys_show_allow_and_revoke_on_a_running_node_create_no_server_key(
    node: NodeProcess,
) -> None:
    """docs/operations.md: the server key is written by `keys generate` or the first tcp
    start; a listing through a running ipc node is the same as without one: no key."""
    key = Keypair.generate().public
    for args in (("show",), ("allow", "--name", "ci", "--", key), ("revoke", "ci")):
        done = run_cli("keys", *args, state_dir=node.state_dir)
        assert done.returncode == 0, done.stderr
    shown = run_cli("keys", "show", state_dir=node.state_dir)
    assert "server key  (none" in shown.stdout, shown.stdout
    assert not (keys_dir(node.state_dir) / SERVER_KEY).exists()


def test_design_3_keys_allow_without_a_node_edits_the_file(state_dir: Path) -> None:
    key = Keypair.generate().public
    # A z85 key may start with '-': after '--', as the command's help says.
    allowed = run_cli("keys", "allow", "--name", "ci", "--", key, state_dir=state_dir)
    assert allowed.returncode == 0, allowed.stderr
    assert read_allowed(keys_dir(state_dir) / "allowed.toml") == {"ci": key}
    bad = run_cli("keys", "allow", "not-a-key", "--name", "ci", state_dir=state_dir)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "not a CURVE public key" in bad.stderr
    accented = run_cli("keys", "allow", "--name", "x", "--", "A" * 39 + "é", state_dir=state_dir)
    assert "got 'é', which z85 does not use" in accented.stderr
    # A name that admits another key is not silently taken over: revoke it first.
    other = Keypair.generate().public
    taken = run_cli("keys", "allow", "--name", "ci", "--", other, state_dir=state_dir)
    assert taken.returncode != 0 and "already admits another key" in taken.stderr
    assert read_allowed(keys_dir(state_dir) / "allowed.toml") == {"ci": key}
    again = run_cli("keys", "allow", "--name", "ci", "--", key, state_dir=state_dir)
    assert again.returncode == 0, again.stderr  # the same key again: nothing changes
    assert run_cli("keys", "revoke", "ci", state_dir=state_dir).returncode == 0
    assert read_allowed(keys_dir(state_dir) / "allowed.toml") == {}


def test_design_3_a_key_that_starts_with_a_dash_is_allowed_after_double_dash(
    state_dir: Path,
) -> None:
    """z85 keys may begin with '-' (1 in 85 does): the documented form puts the key after
    '--', where click cannot take it for an option (docs/operations.md's example)."""
    key = next(k for k in (Keypair.generate().public for _ in range(20_000)) if k[0] == "-")
    done = run_cli("keys", "allow", "--name", "dash", "--", key, state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    assert read_allowed(keys_dir(state_dir) / "allowed.toml") == {"dash": key}


def test_design_3_curve_raw_peer_with_stolen_server_key_but_own_key_hears_nothing(
    tcp_node: tuple[NodeProcess, str],
) -> None:
    """A raw CURVE DEALER (not our transport) with an unlisted key: never a reply."""
    node, tcp = tcp_node
    server = read_keypair(keys_dir(node.state_dir) / SERVER_KEY).public
    mine = Keypair.generate()
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, mine.public.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, mine.secret.encode())
        sock.setsockopt(zmq.CURVE_SERVERKEY, server.encode())
        sock.connect(tcp)
        sock.send(encode(Envelope(type="node.ping", body={})), zmq.NOBLOCK)
        assert not sock.poll(int(SILENCE_S * 1000))
    finally:
        sock.close(linger=0)
        zctx.term()


def _ipv6_loopback_port(also_next: int = 3) -> int:
    """A port free on ::1 right now with the next `also_next` (a home's ledger owners take
    them); skips the test on a machine with no IPv6 loopback."""
    for _ in range(100):
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                probe.bind(("::1", 0))
                base = int(probe.getsockname()[1])
        except OSError as exc:
            pytest.skip(f"this machine has no IPv6 loopback (::1): {exc}")
        try:
            for offset in range(1, also_next + 1):
                with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                    probe.bind(("::1", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError("no free run of ports on ::1")


def _curve_ping(address: str, state_dir: Path) -> Envelope | None:
    """A node.ping from a raw CURVE DEALER that speaks IPv6, with the state dir's keys."""
    creds = _credentials(state_dir)
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, creds.client.public.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, creds.client.secret.encode())
        sock.setsockopt(zmq.CURVE_SERVERKEY, creds.server_public.encode())
        sock.connect(address)
        sock.send(encode(Envelope(type="node.ping", body={})))
        return decode(sock.recv(), 1 << 20) if sock.poll(int(REFUSAL_S * 1000)) else None
    finally:
        sock.close(linger=0)
        zctx.term()


def test_design_3_a_node_listening_on_ipv6_loopback_answers_there(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    assert run_cli("keys", "generate", state_dir=state_dir).returncode == 0
    tcp = f"tcp://[::1]:{_ipv6_loopback_port()}"
    node = start_node("--listen", tcp, state_dir=state_dir)
    assert node.status().endpoints == [node.address, tcp]
    reply = _curve_ping(tcp, state_dir)
    assert reply is not None and reply.type == "reply" and reply.body["pid"] == node.pid


def test_design_1_a_home_on_ipv6_loopback_serves_its_ledger_owners_there(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    """A home's ledger owners bind their own tcp ports on the home's (IPv6) host."""
    assert run_cli("keys", "generate", state_dir=state_dir).returncode == 0
    tcp = f"tcp://[::1]:{_ipv6_loopback_port()}"
    home = start_node("--home", "--listen", tcp, state_dir=state_dir)
    owners = {actor.name: actor for actor in home.status().actors}
    for name in ("capacity", "fanout", "session"):
        assert owners[name].state == "running", owners[name].reason
    reply = _curve_ping(tcp, state_dir)
    assert reply is not None and reply.body["pid"] == home.pid


def test_design_3_an_async_client_offers_the_keys_it_is_given_or_its_state_dirs_over_tcp(
    tcp_node: tuple[NodeProcess, str],
) -> None:
    """An AsyncClient took neither `credentials` nor `state_dir`: over tcp it could offer only
    the default state dir's keys (or the environment's), so it could not reach this node."""
    node, tcp = tcp_node

    async def go() -> set[int]:
        given = AsyncClient(tcp, timeout=REFUSAL_S, credentials=_credentials(node.state_dir))
        from_dir = AsyncClient(tcp, timeout=REFUSAL_S, state_dir=node.state_dir)
        async with given, from_dir:
            return {(await given.ping()).pid, (await from_dir.ping()).pid}

    assert asyncio.run(go()) == {node.pid}


def test_a_client_given_only_a_state_dir_talks_to_that_state_dirs_node(
    tcp_node: tuple[NodeProcess, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`connect(state_dir=X)` went to $SUBAGENTS_NODE (or the default state dir's node) and
    used X only for tcp keys: a program given a state dir talked to another node."""
    node, _ = tcp_node
    monkeypatch.setenv("SUBAGENTS_NODE", "ipc:///tmp/no-node-here/node.sock")
    with connect(state_dir=node.state_dir, timeout=REFUSAL_S) as client:
        assert client.ping().pid == node.pid

    async def go() -> int:
        async with AsyncClient(state_dir=node.state_dir, timeout=REFUSAL_S) as client:
            return (await client.ping()).pid

    assert asyncio.run(go()) == node.pid


def test_keys_allowed_at_once_from_a_programs_threads_are_all_kept() -> None:
    """A program's in-process client asks its embedded node in the program's own thread, not
    the gateway's: allows sent at once from several threads each read the allow-list, wrote
    the file and swapped it in, and one overwrote another's (an allowed key lost for good)."""
    names = [f"t{t}-k{k}" for t in range(6) for k in range(8)]
    keys = {name: Keypair.generate().public for name in names}
    with Node.embedded() as node:
        client = node.client()
        start = threading.Barrier(6)

        def allow(thread: int) -> None:
            start.wait()
            for name in names[thread * 8 : (thread + 1) * 8]:
                client.transport.call(KeysAllow(name=name, public_key=keys[name]), timeout=30)

        threads = [threading.Thread(target=allow, args=(t,)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        listed = client.transport.call(KeysList(), timeout=30)
        assert isinstance(listed, AllowedKeys)
        assert set(names) <= set(listed.clients), sorted(set(names) - set(listed.clients))
