"""What a forked owner keeps of the descriptors it inherits from the node.

A fork copies every descriptor of the node into the owner: the node's client connections (its
gateway's zmq sockets), its zmq context's eventfds, the pidfds and control pipes of the other
owners, and in an embedded node whatever its host process had open. An owner restarted while
the node served a hundred clients held those hundred connections for its whole life, long
after the clients had gone (the kernel frees a socket only when its last descriptor closes),
so every restart carried the node's connections at that moment into the new owner.

Owns the choice of what a forked owner keeps: standard input and output, its control pipe to
the node, the state dir's claim socket (runtime/node/claim.py: the owners hold the claim until
they are gone), and every file, directory or device (a file holds no peer and wakes nothing;
the logging streams are files, and SQLite's table of open databases, inherited too, names
some). Every other socket, pipe and anonymous descriptor (eventfd, pidfd, epoll) is closed
once, right after the fork, before the owner opens anything of its own. It must never
close a descriptor the owner opened itself, nor touch a Python object of the node's: those
objects are never used or finalized in the owner (it leaves with `os._exit`).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Iterable
from contextlib import suppress

#: Where the kernel lists this process's descriptors.
FD_DIR = "/proc/self/fd"


def close_inherited(claim: bytes, keep: Iterable[int]) -> int:
    """Close every descriptor but 0-2, `keep`, the logging streams and the state dir's claim
    socket (bound to the abstract name `claim`: runtime/node/claim.py). Returns how many were
    closed (0 where /proc cannot be read)."""
    kept = {0, 1, 2, *keep, *_logging_fds()}
    try:
        listed = [int(name) for name in os.listdir(FD_DIR)]
    except OSError:
        return 0
    closed = 0
    for fd in listed:
        if fd in kept:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            mode = 0  # closed already (the listing's own directory descriptor): closed below
        if _is_file(mode) or (stat.S_ISSOCK(mode) and _is_claim(fd, claim)):
            continue
        with suppress(OSError):  # the listing's own directory descriptor is already gone
            os.close(fd)
            closed += 1
    return closed


def _logging_fds() -> set[int]:
    fds = set()
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        stream = getattr(handler, "stream", None)
        with suppress(AttributeError, OSError, ValueError):
            fds.add(int(stream.fileno()))  # type: ignore[union-attr]
    return fds


def _is_file(mode: int) -> bool:
    """A file, directory or device, not a connection: kept. SQLite keeps a table of the
    database files its process has open, and a forked owner inherits that table with the fds
    it names: closing one under it (an embedding program's own connection to an owner's
    database) fails the owner's opening of that database with 'locking protocol'. What a file
    descriptor holds (no peer, no wake-up) is not what an owner must let go of."""
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def _is_claim(fd: int, claim: bytes) -> bool:
    """Whether socket `fd` is bound to the abstract name `claim`."""
    try:
        copy = os.dup(fd)  # probed through a copy: the socket object closes what it wraps
    except OSError:
        return False
    try:
        probe = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return False
    with probe:
        try:
            name = probe.getsockname()
        except OSError:
            return False
    return isinstance(name, bytes) and name == claim
