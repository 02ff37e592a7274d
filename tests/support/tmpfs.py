"""A tmpfs the test mounts on a directory of its own (root only): a full disk, a disk with no
inode left, a read-only file system, each as small as the test needs.

`mounted(directory, options)` skips the test, saying why, where no tmpfs can be mounted; it
always unmounts afterwards, lazily when something still holds a file there (a node's log), so no
mount outlives its test. `fill(path)` writes zeros to `path` until the disk refuses (ENOSPC).
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted(directory: Path, options: str) -> Iterator[Path]:
    """A tmpfs with mount `options` (`size=2m,mode=0700`, `nr_inodes=1`, `ro`) on `directory`."""
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        umount = subprocess.run(["umount", str(directory)], capture_output=True, check=False)
        if umount.returncode != 0:  # something still holds a file: detach it, never leave it
            subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def remount(directory: Path, options: str) -> None:
    """Change a mounted tmpfs's options (`size=64m`: space back; `ro`: read-only from now)."""
    subprocess.run(
        ["mount", "-o", f"remount,{options}", str(directory)],
        check=True,
        capture_output=True,
        text=True,
    )


def fill(path: Path) -> Path:
    """Write zeros to `path` until its disk is full; `path`, which holds them."""
    with path.open("wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return path
