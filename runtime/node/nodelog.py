"""The detached node's log: `<state>/node.log`, rotated by size (issue 12: bounded growth).

Owns the logging set-up of a node started with `start --detach`. The daemon points the node's
stdout and stderr at `node.log` (so a crash before logging is configured still lands there);
once logging is configured, `NodeLogHandler` writes records to the same file and, each time it
rotates (`node.log` -> `node.log.1` ... `node.log.N`), points fds 1 and 2 at the fresh file too,
so tracebacks and stray prints follow the rotation instead of growing a renamed file forever.
Size is checked on every record, against the file's real end (every writer appends). A
foreground node logs to its stderr and leaves rotation to whoever reads it.

It never writes anything but log records and never deletes anything but rotated backups.
"""

from __future__ import annotations

import io
import logging
import os
from logging.handlers import RotatingFileHandler
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class NodeLogHandler(RotatingFileHandler):
    """A size-rotated log file that also owns the process's stdout and stderr."""

    def _open(self) -> io.TextIOWrapper:
        stream = super()._open()
        # The file is private like everything in the state dir (0700 dir, 0600 file).
        os.chmod(self.baseFilename, 0o600)
        for fd in (1, 2):
            os.dup2(stream.fileno(), fd)
        return stream

    def shouldRollover(self, record: logging.LogRecord) -> int:
        # Other writers (tracebacks on fd 2) append to the same file: measure its real end.
        stream = self.stream
        if stream is None:
            stream = self.stream = self._open()
        return int(os.fstat(stream.fileno()).st_size >= self.maxBytes > 0)


def configure_node_log(path: Path, max_bytes: int, backups: int, level: int) -> None:
    handler = NodeLogHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
