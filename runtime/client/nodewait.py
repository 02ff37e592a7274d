"""Waiting for a state dir's node to serve: the one another process is starting, or the next
one after the node stopped or was killed under a client (`served_again`), and a call made again
there (`across_lost_nodes`).

Owns the wait: it asks at once, then sleeps until the state dir's pid file is written (a node
writes it once it serves: a temp file renamed in, seen with inotify, an event and not a poll)
and asks again, until the deadline. It never starts a node and never reads the pid file, and it
makes a call again only for a caller that says the call is safe to make twice. A client that
was closed (`is_closed_error`) is no lost node: nothing more goes through it, so nothing is
waited for and its NodeNotRunning is raised at once.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from subagents_node.client.channel import closed_error, is_closed_error
from subagents_node.client.client import Client
from subagents_node.client.inotify import DirectoryWatch
from subagents_node.client.paths import PID_NAME, ipc_path
from subagents_node.messages.errors import NodeNotRunning, NodeTimeout

T = TypeVar("T")


def wait_for_node(
    state_dir: Path, answering: Callable[[], T | None], wait_s: float, stop: int | None = None
) -> T | None:
    """What `answering` gives once it gives something (a node answered it); None if nothing
    did within `wait_s` seconds, or once descriptor `stop` is readable (its caller gave up:
    an asyncio launch cancelled while a thread of its waits here)."""
    deadline = time.monotonic() + wait_s
    with DirectoryWatch(state_dir) as watch:
        # poll, not select: a process with over 1024 descriptors open gets higher numbers
        poller = select.poll()
        for fd in (watch.fileno(), stop):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        while True:
            found = answering()
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            while PID_NAME not in watch.read():
                left = deadline - time.monotonic()
                ready = {fd for fd, _ in poller.poll(left * 1000)} if left > 0 else set()
                if stop is not None and stop in ready:
                    return None
                if not ready:
                    break


def served_again(client: Client, wait_s: float, stop: int | None = None) -> bool:
    """Whether the node `client` talks to over ipc serves again within `wait_s` seconds after
    it stopped or was killed (the next node on its state dir: ZeroMQ reconnects the client to
    the same socket path). Always False over tcp: the address may name any host's node. False
    at once when descriptor `stop` is readable (`wait_for_node`); the client's closed error
    at once when it is closed meanwhile (from another thread, a signal handler)."""
    sock = ipc_path(str(getattr(client.transport, "address", "")))
    if sock is None:
        return False
    if stop is None and hasattr(client.transport, "ends_with_close"):
        return _until_closed(client, wait_s)

    def answering() -> bool | None:
        try:
            client.ping(timeout=2.0)
        except NodeNotRunning as err:
            if is_closed_error(err):  # closed meanwhile: no ping will ever go through it
                raise
            return None
        return True

    return wait_for_node(sock.parent, answering, wait_s, stop) is not None


def _until_closed(client: Client, wait_s: float) -> bool:
    """`served_again`, its wait ended by the client's close (a pipe whose write end the
    transport closes then); the close's error raised. Before, a close from another thread
    left the wait to run out (30 s), although a closed client waits for no node."""
    transport = client.transport
    stop, stopping = os.pipe()
    transport.ends_with_close(stopping)  # type: ignore[attr-defined]  # ZmqTransport's
    try:
        served = served_again(client, wait_s, stop)
    finally:
        os.close(stop)
        if transport.release(stopping):  # type: ignore[attr-defined]
            os.close(stopping)
    if not served and getattr(transport, "closed", False):
        raise closed_error(transport.address)
    return served


#: How a request in flight ends when its node goes (client/channel.py): a node that was killed
#: (`node_gone`), or an owner whose socket was replaced under it (`owner_restarted`, a node
#: stopped and started again): its outcome is unknown, it may have been applied.
_LOST_IN_FLIGHT = ("node_gone", "owner_restarted")


def node_lost(err: NodeNotRunning | NodeTimeout) -> bool:
    """Whether `err` says the node went (none runs, or it went with the request in flight),
    not that a node which is there was slow to answer, nor that the client was closed."""
    if isinstance(err, NodeNotRunning):
        return not is_closed_error(err)
    return err.details.get("reason") in _LOST_IN_FLIGHT


def across_lost_nodes(client: Client, call: Callable[[], T], wait_s: float, losses: int) -> T:
    """What `call()` gives, made again on the state dir's next node each time the node under it
    is lost (stopped or killed, before or while it was asked), at most `losses` times, each time
    waiting up to `wait_s` seconds for that next node. Only for a call that is safe to make
    twice, even when the lost node applied it and died before answering (a workflow's launch
    by key, its claim by id, a read); any other error, or no node back in time, is raised."""
    left = losses
    while True:
        try:
            return call()
        except (NodeNotRunning, NodeTimeout) as err:
            if not node_lost(err) or left <= 0 or not served_again(client, wait_s):
                raise
            left -= 1
