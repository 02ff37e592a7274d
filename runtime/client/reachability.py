"""Whether a node is there to answer, told from its files (ipc only).

Owns the two questions a client asks before and after talking to a node over ipc: is there a
socket to connect to, and is the node that bound it still alive (a node killed with -9 leaves
its socket file behind; its pid record then names a dead process). A tcp address cannot be
checked this way and always passes.

It must never open a socket or talk to a node: it only looks at files, so every transport
(sync and async) can ask it at no more than a stat or two. Like the rest of the client, it
never imports the node or the actors.
"""

from __future__ import annotations

from pathlib import Path

from subagents_node.client.paths import PID_NAME, ipc_path, pid_record, read_pid_file
from subagents_node.messages.errors import NodeNotRunning


def _stale(path: Path) -> bool:
    """A socket left behind by a node killed with -9: its pid record names a dead process."""
    return (path.parent / PID_NAME).exists() and read_pid_file(path.parent) is None


def known_dead(path: Path) -> bool:
    """Whether the node that bound the ipc socket `path` is known to be dead: the pid record
    beside it names a process that is no more (a node killed with -9 leaves both files behind,
    the socket unchanged). A record that cannot be read says nothing: a live node must never
    be taken for dead, so only a record that parses and names a dead process counts."""
    found = pid_record(path.parent)
    return found is not None and not found[1]


def why_silent(address: str) -> str:
    """Why a node did not answer, when that can be told (for a timeout's message)."""
    path = ipc_path(address)
    if path is not None and (not path.exists() or _stale(path)):
        return "its node is not running any more"
    return "is it running?"


def check_reachable(address: str, stale: bool = False) -> None:
    """For ipc: raise NodeNotRunning when no socket is there, or (`stale`) its node is gone.

    Checked when a channel is first opened and when a request is sent, never per reply: a node
    killed with -9 leaves its socket file behind.
    """
    path = ipc_path(address)
    if path is None:
        return
    if not path.exists():
        raise NodeNotRunning(
            f"no node is running at {address} (socket {path} does not exist); "
            "start one with `subagents-node start`",
            address=address,
        )
    if not path.is_socket():  # a directory, a file, a device: nothing will ever answer there
        raise NodeNotRunning(
            f"no node is running at {address}: {path} is not a socket", address=address
        )
    if stale and _stale(path):
        raise NodeNotRunning(
            f"no node is running at {address}: the node that served it is gone "
            "(stale socket); start one with `subagents-node start`",
            address=address,
        )
