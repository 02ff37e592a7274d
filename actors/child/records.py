"""The two files a child shim keeps beside its run: who the shim is, and how the child ended.

Owns their names and the one way they are written (`write_atomically`: temp, rename or link,
fsync when asked), shared by the shim that writes them and the run supervisor that claims a
child at recovery (link(2): exactly one of them wins). Standard library only (the shim
template imports it). It never reads a record: ChildKeeper does.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from typing import Any

#: Who the shim is (written once, exclusively: it claims the child before starting it).
SHIM_RECORD = "shim.json"
#: The exit status and whether the tree ended, written before each report that tells of it.
EXIT_RECORD = "exit.json"


def write_atomically(
    path: str, data: dict[str, Any], *, exclusive: bool = False, sync: bool = True
) -> bool:
    """Write `data` as JSON to `path`: temp file, fsync, then rename (or link, which fails when
    `path` exists: `exclusive`), then fsync the directory (both unless `sync` is False).
    False when exclusive lost."""
    directory = os.path.dirname(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        if os.write(fd, payload := json.dumps(data).encode()) != len(payload):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)  # a short write
        if sync:
            os.fsync(fd)
    except BaseException:  # a full disk: no empty temp file is left behind
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        # Only a failed link or rename leaves the temp file (a stat of it on every success
        # cost each shim a syscall per record).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return True
