"""Reading the small files a user names: run files, config files, key files, agent files.

Owns the rules every such read follows: a regular file only (a FIFO would block forever,
`/dev/zero` would never end, a directory is no file), at most `MAX_INPUT_FILE_BYTES`, and a
TOML file that is UTF-8 text, valid and not nested past what the parser can recurse through;
and how an error shows the path it names (`shown_path`, at most 160 characters).
Failures are `OSError` (cannot read: its strerror says why) or `ValueError` (read, but not
valid: a one-line reason); each caller turns them into its own typed error. It never writes,
and never reads more than one byte past the limit.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

#: Far above any run file, config or agent a person writes; far below what hurts a machine.
MAX_INPUT_FILE_BYTES = 16 << 20


#: Most characters of a path an error repeats (a bad one may be kilobytes long).
SHOWN_PATH_CHARS = 160


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as an error about it shows it: at most SHOWN_PATH_CHARS characters."""
    text = os.fspath(path)
    return text if len(text) <= SHOWN_PATH_CHARS else text[: SHOWN_PATH_CHARS - 1] + "…"


def read_small_file(path: Path, limit: int = MAX_INPUT_FILE_BYTES) -> bytes:
    """The bytes of the regular file at `path`, refused past `limit` bytes."""
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # a file that grows while it is read counts as it is read
                raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_toml(path: Path, limit: int = MAX_INPUT_FILE_BYTES) -> dict[str, Any]:
    """The TOML document at `path`; ValueError("not valid TOML: …") when it is not one."""
    import tomllib  # here: most processes read no TOML at all

    data = read_small_file(path, limit)
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError("not valid TOML: arrays or tables nested too deeply") from None
