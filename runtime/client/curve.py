"""The client half of CURVE over tcp (DESIGN §3): which keys to offer, and what a refusal is.

Owns how a client socket becomes a CURVE client (its keypair and the server's public key set
before it connects), where a tcp client's keys come from when none are given, the error a
client without keys gets, and which handshake events mean the node will not talk to this key.

It must never read or write key files itself (`client/keys.py` owns their format), never log a
secret key, and never import the node or the actors: the node's home link and every child
agent's transport use it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import zmq

from subagents_node.client.keys import ClientCredentials, client_credentials
from subagents_node.client.paths import default_state_dir
from subagents_node.messages.constants import ENV_CLIENT_KEY, ENV_SERVER_KEY
from subagents_node.messages.errors import KeyFileInvalid, NotAuthenticated

#: Handshake events that mean the node will not talk to this key (or to no key at all): a
#: refused peer gets no reply, so a transport watches for these to fail at once, not time out.
HANDSHAKE_REFUSED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


def curve_client(sock: zmq.Socket[Any], creds: ClientCredentials) -> None:
    """Make `sock` (before it connects) a CURVE client with these keys (DESIGN §3)."""
    sock.setsockopt(zmq.CURVE_PUBLICKEY, creds.client.public.encode("ascii"))
    sock.setsockopt(zmq.CURVE_SECRETKEY, creds.client.secret.encode("ascii"))
    sock.setsockopt(zmq.CURVE_SERVERKEY, creds.server_public.encode("ascii"))


def no_keys(address: str, err: KeyFileInvalid) -> NotAuthenticated:
    """The error for a tcp client with no usable keys: it says where keys may come from, or,
    for a key file refused as unsafe, only that (its fix is a chmod, not other keys)."""
    if err.details.get("reason") == "unsafe_key_file":
        return NotAuthenticated(err.message, address=address, reason="unsafe_key_file")
    return NotAuthenticated(
        f"a tcp node needs CURVE keys: {err.message}; or give the server's public key "
        f"in ${ENV_SERVER_KEY} and your key file in ${ENV_CLIENT_KEY}",
        address=address,
        reason="no_keys",
    )


def default_credentials(state_dir: Path | None = None) -> ClientCredentials:
    """A tcp client's keys: $SUBAGENTS_CLIENT_KEY (a key file) and $SUBAGENTS_SERVER_KEY (z85)
    when set, else the state dir's `client.key` and `server.key` (`keys generate` makes both)."""
    return client_credentials(
        state_dir or default_state_dir(),
        server_key=os.environ.get(ENV_SERVER_KEY, "").strip() or None,
        client_file=os.environ.get(ENV_CLIENT_KEY, "").strip() or None,
    )
