"""The node's own files in its state dir, which a process of the same user may have replaced.

A child agent runs as the node's user and knows its run directory, so anything there (and in
the state dir) may have been swapped for a FIFO, a device, a directory or a symlink to a file
elsewhere, carelessly or not. Owns the one way the node opens such a file: never through a
symlink (`O_NOFOLLOW`: a link as the last component is refused, ELOOP), never blocking on a
FIFO (`O_NONBLOCK` for the open only: a FIFO then opens at once for reading, and fails ENXIO
for writing when no one reads it), and a regular file only (`fstat`); and the one way it
replaces one (`replace_file`: a temp file of a name no one can foresee, created `O_EXCL`, then
renamed or linked into place). Every refusal is an `OSError` whose strerror says why in a few
words, so each caller keeps treating it as it treats a file it cannot read or write: an owner
is never wedged in `open()` and never writes a file outside the state dir.

Standard library only (the shim template imports it through actors/child/records.py). It
never decides what a refused file means to its caller, and never removes anything but its own
temp file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

#: Far above any record, descriptor or summary the node writes; far below what hurts an owner.
MAX_STATE_FILE_BYTES = 64 << 20

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISLNK, "a symbolic link"),
)


def _not_regular(mode: int, path: str) -> OSError:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return OSError(errno.EINVAL, f"{kind}, not a regular file", path)


def open_file(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor of the regular file at `path`, opened with `flags` (O_CREAT makes it with
    `mode`); OSError when it cannot be opened, is a symlink, or is not a regular file. The
    descriptor blocks as usual (O_NONBLOCK held for the open only) and is not inherited."""
    name = os.fspath(path)
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink; a FIFO (or a socket) for writing
            try:
                found = os.lstat(name).st_mode
            except OSError:
                raise exc from None
            if not stat.S_ISREG(found):
                raise _not_regular(found, name) from None
        raise
    try:
        found = os.fstat(fd).st_mode
        if not stat.S_ISREG(found):
            raise _not_regular(found, name)
        if not flags & os.O_NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(path: str | os.PathLike[str], limit: int = MAX_STATE_FILE_BYTES) -> bytes:
    """The bytes of the regular file at `path` (`open_file`'s rules), refused past `limit`."""
    fd = open_file(path)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def replace_file(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    exclusive: bool = False,
    sync: bool = True,
    mode: int = 0o600,
) -> bool:
    """Write `data` to `path` whole: a temp file beside it (a fresh random name, O_EXCL: a
    symlink or a FIFO planted under a name the node would use is never opened), fsync, then
    rename (or link, which fails when `path` exists: `exclusive`), then fsync the directory
    (both unless `sync` is False). Whatever `path` was (a symlink included) is replaced, never
    written through. False when exclusive lost."""
    target = os.fspath(path)
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}-{os.urandom(6).hex()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            if not written:  # no room for a byte more
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
            view = view[written:]
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
                os.link(tmp, target)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        # Only a failed link or rename leaves the temp file (a stat of it on every success
        # cost each shim a syscall per record).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync:
        dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return True


def restrict_socket(path: str | os.PathLike[str], mode: int = 0o600) -> None:
    """Set the mode of the unix socket just bound at `path` (libzmq makes it under the process
    umask). On that very file: never through a symlink planted in its place since the bind, and
    only a socket (OSError otherwise, and nothing changed). Its `chmod` by name followed a link
    to whatever file it named."""
    name = os.fspath(path)
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)  # the link itself, if one
    try:
        found = os.fstat(fd).st_mode
        if not stat.S_ISSOCK(found):
            kind = next((k for test, k in _KINDS if test(found)), "a regular file")
            raise OSError(errno.EINVAL, f"{kind}, not the socket bound there", name)
        # An O_PATH descriptor takes no fchmod; its /proc link names the same inode.
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)
