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

from subagents_node.client.fleetrole import start_advice
from subagents_node.client.paths import PID_NAME, ipc_path, pid_record, read_pid_file
from subagents_node.messages.base import Request, resendable
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
    if path is None:
        return "is it running?"
    if not path.exists() or _stale(path):
        return "its node is not running any more"
    found = pid_record(path.parent)
    if found is not None and found[1]:
        # Running, but busy or stuck: "is it running?" sent users looking in the wrong place.
        return f"its node, pid {found[0]['pid']}, is running but did not answer"
    return "is it running?"


#: What a caller is told of a write whose answer did not come: it may have been applied, so
#: sending it again blindly may do it twice (a second resume of a finished run is a second
#: run, an append sent twice queues its steps twice), and where to look first.
UNKNOWN_OUTCOME = (
    "its outcome is unknown (it may have been applied): look at what it would have changed "
    "(`subagents-node runs`, `subagents-node show RUN`) before sending it again"
)


def timed_out(address: str, request: Request) -> str:
    """A timeout's message: what did not answer, why when that can be told, and, for a request
    that is not safe to send again (neither read-only nor idempotent), that its outcome is
    unknown (a launch, say, whose run may exist and hold a slot)."""
    outcome = "" if resendable(request) else f"; {UNKNOWN_OUTCOME}"
    return (
        f"the node at {address} did not answer {request.type} in time "
        f"({why_silent(address)}){outcome}"
    )


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
            f"{start_advice(address)}",
            address=address,
        )
    if not path.is_socket():  # a directory, a file, a device: nothing will ever answer there
        raise NodeNotRunning(
            f"no node is running at {address}: {path} is not a socket", address=address
        )
    if stale and _stale(path):
        raise NodeNotRunning(
            f"no node is running at {address}: the node that served it is gone "
            f"(stale socket); {start_advice(address)}",
            address=address,
        )
