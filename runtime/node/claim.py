"""The claim on a state dir: the kernel's word that exactly one node serves it.

Owns one unix socket bound in the abstract namespace under a name derived from the state dir's
real path. Binding is atomic: of two nodes starting at once for one state dir (two `start`s, a
`start` racing the node a `run --async` starts for itself), one binds and the other is refused
`NodeAlreadyRunning`, before either writes its pid file or forks an owner. The name is released
by the kernel when the last process holding the socket exits: the node, or the owners forked
from it (which hold the state dir's databases and sockets until they are gone too). Nothing is
written to disk, so nothing is left behind by a `kill -9` and nothing needs cleaning.

It never reads or writes the pid file (runtime/node/pidfile.py) and never signals a process; it
may wait, bounded, for the processes a dead node's record names to finish exiting, and says
whether a process holds the claim (`holds_claim`: what `stop` asks before it signals one).
"""

from __future__ import annotations

import errno
import hashlib
import os
import select
import socket
import time
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

from subagents_node.messages.errors import NodeAlreadyRunning

#: How long a start waits for a dead node's owners (which still hold the claim) to exit.
PREVIOUS_OWNERS_EXIT_S = 5.0


def claim_name(state_dir: Path) -> bytes:
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:40]
    return b"\0subagents-node/" + digest.encode()


class StateDirClaim:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._sock: socket.socket | None = None

    def take(self, leftovers: Iterable[int] = ()) -> None:
        """Bind the claim, or raise NodeAlreadyRunning. `leftovers`: the pids a dead node's
        record names (its owners may still be exiting and holding the claim): waited for,
        bounded, before giving up."""
        if self._try():
            return
        _wait_exited(leftovers, PREVIOUS_OWNERS_EXIT_S)
        if self._try():
            return
        raise NodeAlreadyRunning(
            f"another node is starting or stopping for {self.state_dir}; retry in a moment, "
            "or stop it with `subagents-node stop`",
            address=str(self.state_dir),
        )

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _try(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(claim_name(self.state_dir))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
        self._sock = sock
        return True


def holds_claim(pid: int, state_dir: Path) -> bool:
    """Whether process `pid` holds `state_dir`'s claim: it is that state dir's node (or one of
    its owners), whatever its pid record says. From /proc: the claim's socket inodes in the
    process's own network namespace's table, against the sockets among its descriptors. False
    when that cannot be seen (another user's process: not ours to signal either)."""
    name = "@" + claim_name(state_dir)[1:].decode()
    try:
        with open(f"/proc/{pid}/net/unix", encoding="utf-8", errors="replace") as table:
            inodes = {
                f"socket:[{fields[6]}]"
                for line in table
                if len(fields := line.split()) >= 8 and fields[7] == name
            }
        if not inodes:
            return False
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with suppress(OSError):  # closed meanwhile
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return True
    except OSError:
        return False
    return False


def _wait_exited(pids: Iterable[int], timeout_s: float) -> None:
    """Wait (on pidfds: events, not polls) until every process in `pids` has exited."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:
            continue  # gone already (or not ours to see): nothing to wait for
    deadline = time.monotonic() + timeout_s
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        left = len(fds)
        while left and (remaining := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(remaining * 1000):
                poller.unregister(fd)
                left -= 1
    finally:
        for fd in fds:
            os.close(fd)
