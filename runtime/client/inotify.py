"""Linux inotify through ctypes: wake up when files in a directory grow or appear.

Owns one inotify instance (a file descriptor the caller selects on) and the decoding of its
events into file names. It exists so that following a log (`logs -f`) sleeps until the kernel
says a file changed, instead of re-reading files on a timer. Linux only (the node itself needs
pidfds, so nothing is lost); it never reads the watched files and never starts a thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

from subagents_node.messages.errors import BadRequest

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
#: struct inotify_event: int wd; uint32_t mask, cookie, len; char name[len]
_EVENT = struct.Struct("iIII")


class DirectoryWatch:
    """Watch one directory for files that are written, closed, created or moved in.

    `fileno()` becomes readable when something happened; `read()` returns the names involved
    (possibly empty after a spurious wake-up). A context manager; `close()` frees the fd.
    """

    def __init__(self, directory: Path) -> None:
        libc_name = ctypes.util.find_library("c") or "libc.so.6"
        libc = ctypes.CDLL(libc_name, use_errno=True)
        fd = int(libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise BadRequest(f"cannot watch {directory}: {os.strerror(err)}", reason="inotify")
        mask = IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO
        wd = int(libc.inotify_add_watch(fd, os.fsencode(directory), mask))
        if wd < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise BadRequest(f"cannot watch {directory}: {os.strerror(err)}", reason="inotify")
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def read(self) -> set[str]:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return set()
        names: set[str] = set()
        offset = 0
        while offset + _EVENT.size <= len(data):
            _, _, _, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            names.add(data[offset : offset + length].rstrip(b"\0").decode(errors="replace"))
            offset += length
        return names

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
