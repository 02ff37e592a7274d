"""An operator's release is served on the node's ipc socket only (issue 13; DESIGN §2-3).

`capacity.release_host` frees every slot of a host: an act for the home node's own user (the
`nodes forget` command), never for a peer admitted over tcp, which is a worker and could
otherwise free the slots of others. Against a real node listening on loopback tcp with CURVE:
the allow-listed peer is served the read-only capacity queries and refused the release with a
typed `local_only` error that changes nothing; the same release on ipc is served.
"""

from __future__ import annotations

import pytest

from subagents_node.client.client import Client
from subagents_node.client.keys import (
    CLIENT_KEY,
    SERVER_KEY,
    ClientCredentials,
    keys_dir,
    read_keypair,
)
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.capacity_hosts import HostSlotCount
from subagents_node.messages.errors import BadRequest
from tests.support.nodes import NodeProcess

pytestmark = pytest.mark.processes


def _tcp_client(node: NodeProcess, address: str) -> Client:
    keys = keys_dir(node.state_dir)
    credentials = ClientCredentials(
        read_keypair(keys / CLIENT_KEY), read_keypair(keys / SERVER_KEY).public
    )
    return Client(ZmqTransport(address, credentials=credentials), timeout=10)


def test_release_host_is_refused_from_a_tcp_peer_and_served_on_ipc(
    tcp_node: tuple[NodeProcess, str],
) -> None:
    node, tcp = tcp_node
    local = node.client()
    assert local.capacity.acquire(session_id="s", limit=2, run_id="a", host="w1") is not None
    held = [HostSlotCount(host="w1", reserved=1, started=0)]
    with _tcp_client(node, tcp) as peer:
        assert peer.capacity.hosts("w1").hosts == held  # queries are served to peers
        assert peer.capacity.releases().releases == []
        with pytest.raises(BadRequest) as caught:
            peer.capacity.release_host("w1", reason="a worker frees another's slots")
        assert caught.value.details["reason"] == "local_only"
        assert "ipc socket only" in caught.value.message
    assert local.capacity.hosts("w1").hosts == held
    assert local.capacity.releases().releases == []
    assert local.capacity.release_host("w1", reason="lost", operator="ana").count == 1
    assert local.capacity.hosts().hosts == []
