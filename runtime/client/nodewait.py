"""Waiting for a state dir's node to serve: the one another process is starting, or the next
one after the node stopped or was killed under a client (`served_again`).

Owns the wait: it asks at once, then sleeps until the state dir's pid file is written (a node
writes it once it serves: a temp file renamed in, seen with inotify, an event and not a poll)
and asks again, until the deadline. It never starts a node and never reads the pid file.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from subagents_node.client.client import Client
from subagents_node.client.inotify import DirectoryWatch
from subagents_node.client.paths import PID_NAME, ipc_path
from subagents_node.messages.errors import NodeNotRunning

T = TypeVar("T")


def wait_for_node(state_dir: Path, answering: Callable[[], T | None], wait_s: float) -> T | None:
    """What `answering` gives once it gives something (a node answered it); None if nothing
    did within `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    with DirectoryWatch(state_dir) as watch:
        while True:
            found = answering()
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            while PID_NAME not in watch.read():
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([watch], [], [], left)[0]:
                    break


def served_again(client: Client, wait_s: float) -> bool:
    """Whether the node `client` talks to over ipc serves again within `wait_s` seconds after
    it stopped or was killed (the next node on its state dir: ZeroMQ reconnects the client to
    the same socket path). Always False over tcp: the address may name any host's node."""
    sock = ipc_path(str(getattr(client.transport, "address", "")))
    if sock is None:
        return False

    def answering() -> bool | None:
        try:
            client.ping(timeout=2.0)
        except NodeNotRunning:
            return None
        return True

    return wait_for_node(sock.parent, answering, wait_s) is not None
