"""PeerFiles: the ipc socket file behind each of one thread's links, to tell a restarted peer.

An owner process binds its ipc socket as a new file each time it starts, so a link whose peer's
file is no longer the one it saw reaches a successor: whatever that link had in flight died
with the process before it. Owns, per endpoint, the file (device, inode, ctime: a file system
may give a new file the inode number the old one just freed) as the link last saw it; None for
tcp, or for a link opened before its peer bound (then the first send looks again).

It only stats files: it never opens, connects or signals anything, and keeps no socket.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

#: What identifies an ipc socket file: device, inode, ctime in ns.
SocketFile = tuple[int, int, int]


class PeerFiles:
    def __init__(self) -> None:
        self._seen: dict[str, SocketFile | None] = {}

    def opened(self, endpoint: str) -> None:
        """A link to `endpoint` was opened now."""
        self._seen[endpoint] = socket_file(endpoint)

    def sending(self, endpoint: str) -> None:
        """A request goes out on `endpoint`'s link: a link opened before its peer bound takes
        the file bound since as the one it reaches."""
        if self._seen.get(endpoint, 0) is None:
            self._seen[endpoint] = socket_file(endpoint)

    def forget(self, endpoint: str) -> None:
        self._seen.pop(endpoint, None)

    def replaced(self, endpoints: Iterable[str]) -> set[str]:
        """Those of `endpoints` whose file is not the one their link saw (their peer restarted,
        or is gone)."""
        found = set()
        for endpoint in endpoints:
            seen = self._seen.get(endpoint)
            if seen is not None and socket_file(endpoint) != seen:
                found.add(endpoint)
        return found


def socket_file(endpoint: str) -> SocketFile | None:
    """The ipc socket file behind `endpoint`; None for tcp or no file."""
    if not endpoint.startswith("ipc://"):
        return None
    try:
        found = os.stat(endpoint[len("ipc://") :])
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_ctime_ns
