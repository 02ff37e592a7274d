"""DESIGN §3 on a node that listens on tcp only (`ipc=False`): its own clients get in with a key
of its own, and nobody else does.

Before: `node.client("zmq")` on such a node, and a forked child's in-process client (which
calls over the node's socket), raised `NotAuthenticated`: the state dir held only `server.key`
and the client offered a key file nobody had allowed. Now the node makes an ephemeral keypair
for its own process (runtime/node/curve.py), admitted in memory only: never written to
`allowed.toml`, never in a `keys show` listing, never pickled into another process; a second
process still needs a key of its own on the allow-list. Real node, sockets, processes.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.client.keys import ALLOWED, keys_dir, read_allowed
from subagents_node.messages.keys import AllowedKeys, KeysList
from subagents_node.node.node import Node
from tests.node.test_embedded_fork import _exit_code_within
from tests.support.descriptors import run_python
from tests.support.nodes import free_tcp_port, run_cli


@pytest.fixture
def tcp_only(state_dir: Path) -> Iterator[Node]:
    """An embedded node whose only listener is loopback tcp, its state dir's keys generated
    first (so the allow-list has a user's key, `local`, to be compared with)."""
    done = run_cli("keys", "generate", state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    with Node.embedded(state_dir, ipc=False, listen=[tcp]) as node:
        assert node.address == tcp
        yield node


def test_design_3_a_tcp_only_nodes_own_zmq_client_pings_and_claims(state_dir: Path) -> None:
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    with Node.embedded(state_dir, ipc=False, listen=[tcp]) as node:
        assert sorted(p.name for p in keys_dir(node.state_dir).iterdir()) == ["server.key"]
        with node.client("zmq", timeout=10) as client:
            assert client.ping().pid == os.getpid()
            budget = client.fanout.create(root_run_id="own-key", limit=2)
            assert client.fanout.claim(budget, ["tasks[0]"]).used == 1
        assert not (keys_dir(node.state_dir) / ALLOWED).exists()  # nothing written for it


def a_forked_child_calls_a_tcp_only_node_through_the_in_process_client(port: int) -> None:
    """In a process of its own (it forks): the child's calls go over the node's tcp socket."""
    with Node.embedded(ipc=False, listen=[f"tcp://127.0.0.1:{port}"]) as node:
        client = node.client(timeout=10)
        budget = client.fanout.create(root_run_id="fork-tcp", limit=5)
        pid = os.fork()
        if pid == 0:
            try:
                ok = client.fanout.claim(budget, ["child[0]"]).used == 1
                ok = ok and client.ping().pid == os.getppid()
            except BaseException as err:
                print(f"child: {type(err).__name__}: {err}", flush=True)
                os._exit(1)
            os._exit(0 if ok else 2)
        assert _exit_code_within(pid, 60) == 0, "the child's calls failed"
        assert client.fanout.snapshot(budget).used == 1
    print("ok")


def test_design_3_a_forked_childs_in_process_client_reaches_a_tcp_only_node() -> None:
    name = "a_forked_child_calls_a_tcp_only_node_through_the_in_process_client"
    done = run_python(
        f"from tests.node.test_own_tcp_key import {name}; {name}({free_tcp_port()})",
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    )


def test_design_3_the_nodes_own_key_is_on_no_allow_list_a_user_sees(tcp_only: Node) -> None:
    before = read_allowed(keys_dir(tcp_only.state_dir) / ALLOWED)
    assert list(before) == ["local"]
    with tcp_only.client("zmq", timeout=10) as client:
        client.ping()
    assert tcp_only.curve is not None
    own = tcp_only.curve.own_credentials().client
    assert own.public not in before.values()
    assert read_allowed(keys_dir(tcp_only.state_dir) / ALLOWED) == before  # the file
    listing = tcp_only.client(timeout=10).ask(KeysList(), AllowedKeys)  # `keys show`'s list
    assert listing.clients == before
    # Nor does a pickled client carry it to another process (it would admit that process).
    assert own.secret.encode() not in pickle.dumps(tcp_only.client("zmq"))
    assert own.secret.encode() not in pickle.dumps(tcp_only.client())


#: What `another_process_is_refused` prints: no client key in the state dir; a key nobody
#: allowed, refused in the handshake; no ipc socket to fall back on.
EXPECTED_REFUSALS = ["refused: no_keys", "refused: handshake", "no ipc socket", "ok"]


def another_process_is_refused(address: str, state_dir: str) -> None:
    """In a process of its own: with the state dir's keys (no client key) and with a key of its
    own that nobody allowed, the node refuses it; its ipc socket is not there at all."""
    from subagents_node.client.client import connect
    from subagents_node.client.keys import (
        SERVER_KEY,
        ClientCredentials,
        Keypair,
        keys_dir,
        read_keypair,
    )
    from subagents_node.messages.errors import NodeNotRunning, NotAuthenticated

    server = read_keypair(keys_dir(Path(state_dir)) / SERVER_KEY).public
    stranger = ClientCredentials(Keypair.generate(), server)
    for client in (
        connect(address, timeout=5, state_dir=state_dir),
        connect(address, timeout=5, credentials=stranger),
    ):
        try:
            with client:
                client.ping()
        except NotAuthenticated as err:
            print(f"refused: {err.details.get('reason')}")
    try:
        with connect(state_dir=state_dir, timeout=5) as client:
            client.ping()
    except NodeNotRunning:
        print("no ipc socket")
    print("ok")


def test_design_3_another_process_without_an_allowed_key_is_still_refused(
    state_dir: Path,
) -> None:
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    with Node.embedded(state_dir, ipc=False, listen=[tcp]) as node:
        with node.client("zmq", timeout=10) as client:
            client.ping()  # the node's own key is in use meanwhile
        done = run_python(
            "from tests.node.test_own_tcp_key import another_process_is_refused; "
            f"another_process_is_refused({tcp!r}, {str(node.state_dir)!r})",
            timeout=60,
        )
    assert done.stdout.splitlines() == EXPECTED_REFUSALS, (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    )
