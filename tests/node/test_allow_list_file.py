"""The tcp allow-list is the file `keys/allowed.toml`, also while a node runs (DESIGN §3,
runtime/node/curve.py).

What used to happen: the node read the file once, at its start, and kept its own copy. An entry
added to the file by hand while it ran was ignored, then overwritten by the next `keys allow`
or `keys revoke` (lost); a key removed by hand stayed admitted until a restart; a file listing
one key under two names kept it admitted after `keys revoke` of one of them; a file it could
not parse stopped even a node that listens on no tcp endpoint; and `keys allow` through a node
opened its temp file by a foreseeable name (`.allowed.toml.<node pid>.tmp`), so a FIFO planted
there held the node's gateway in open() for good."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import Client
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
from subagents_node.messages.errors import NotAuthenticated
from tests.support.nodes import NodeProcess, run_cli

#: How long a refused handshake may take to be reported.
REFUSAL_S = 5.0


def _allowed_path(state_dir: Path) -> Path:
    return keys_dir(state_dir) / "allowed.toml"


def _write_by_hand(state_dir: Path, entries: list[tuple[str, str]]) -> None:
    """Save the file as an editor would: a new file renamed over the old one."""
    lines = ["[clients]", *(f'"{name}" = "{key}"' for name, key in entries)]
    tmp = _allowed_path(state_dir).with_name("edited~")
    tmp.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o600)
    tmp.replace(_allowed_path(state_dir))


def _client_with(node: NodeProcess, tcp: str, keys: Keypair) -> Client:
    server = read_keypair(keys_dir(node.state_dir) / SERVER_KEY).public
    return Client(ZmqTransport(tcp, credentials=ClientCredentials(keys, server)), timeout=REFUSAL_S)


def test_design_3_a_key_added_by_hand_while_the_node_runs_survives_keys_allow(
    node: NodeProcess,
) -> None:
    by_hand, by_cli = Keypair.generate().public, Keypair.generate().public
    _write_by_hand(node.state_dir, [("by-hand", by_hand)])
    done = run_cli("keys", "allow", "--name", "ci", "--", by_cli, state_dir=node.state_dir)
    assert done.returncode == 0, done.stderr
    assert read_allowed(_allowed_path(node.state_dir)) == {"by-hand": by_hand, "ci": by_cli}


def test_design_3_a_key_allowed_or_removed_by_hand_counts_from_the_next_handshake(
    tcp_node: tuple[NodeProcess, str],
) -> None:
    node, tcp = tcp_node
    local = read_keypair(keys_dir(node.state_dir) / CLIENT_KEY).public
    peer = Keypair.generate()
    _write_by_hand(node.state_dir, [("local", local), ("peer", peer.public)])
    with _client_with(node, tcp, peer) as client:
        assert client.ping().pid == node.pid  # admitted with no restart and no keys command
    _write_by_hand(node.state_dir, [("local", local)])
    with _client_with(node, tcp, peer) as client, pytest.raises(NotAuthenticated):
        client.ping()
    assert "read again" in node.log()


def test_design_3_an_allow_list_saved_half_keeps_the_last_good_one_and_keys_allow_says_why(
    tcp_node: tuple[NodeProcess, str],
) -> None:
    node, tcp = tcp_node
    local = read_keypair(keys_dir(node.state_dir) / CLIENT_KEY).public
    _allowed_path(node.state_dir).write_text('[clients]\n"local" = "' + local[:12])
    with _client_with(node, tcp, read_keypair(keys_dir(node.state_dir) / CLIENT_KEY)) as c:
        assert c.ping().pid == node.pid  # the list read before stays in force
    assert "the allow-list read before stays in force" in node.log()
    refused = run_cli(
        "keys", "allow", "--name", "x", "--", Keypair.generate().public, state_dir=node.state_dir
    )
    assert refused.returncode != 0
    assert "allowed.toml" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert _allowed_path(node.state_dir).read_text().endswith(local[:12])  # left as it was


def test_design_3_a_node_with_no_tcp_listener_starts_beside_an_unreadable_allow_list(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    _allowed_path(state_dir).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _allowed_path(state_dir).write_text("[clients\n")
    node = start_node(state_dir=state_dir)
    assert node.client().ping().pid == node.pid
    assert "listens on no tcp endpoint" in node.log()


@pytest.mark.parametrize("served", [True, False], ids=["through-the-node", "no-node"])
def test_design_3_revoking_a_name_revokes_its_key_under_every_name(
    served: bool, start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    if served:
        start_node(state_dir=state_dir)
    twice, other = Keypair.generate().public, Keypair.generate().public
    _write_by_hand(state_dir, [("a", twice), ("b", twice), ("c", other)])
    done = run_cli("keys", "revoke", "a", state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    assert read_allowed(_allowed_path(state_dir)) == {"c": other}


def test_keys_allow_through_a_node_never_opens_a_file_planted_at_a_temp_name(
    node: NodeProcess,
) -> None:
    planted = keys_dir(node.state_dir) / f".allowed.toml.{node.pid}.tmp"
    planted.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.mkfifo(planted)
    key = Keypair.generate().public
    try:
        done = run_cli("keys", "allow", "--name", "ci", "--", key, state_dir=node.state_dir)
    finally:
        # Without the fix the node's gateway waits in open() for a reader: be that reader, so
        # the node can be stopped.
        os.close(os.open(planted, os.O_RDONLY | os.O_NONBLOCK))
    assert done.returncode == 0, done.stderr
    assert read_allowed(_allowed_path(node.state_dir)) == {"ci": key}
    assert planted.exists() and not planted.is_file()  # never written through, never removed
