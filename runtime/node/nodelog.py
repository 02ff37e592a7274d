"""The detached node's log: `<state>/node.log`, rotated by size (issue 12: bounded growth).

Owns the logging set-up of a node started with `start --detach`. The daemon points the node's
stdout and stderr at `node.log` (so a crash before logging is configured still lands there);
once logging is configured, `NodeLogHandler` writes records to the same file and, each time it
rotates (`node.log` -> `node.log.1` ... `node.log.N`), points fds 1 and 2 at the fresh file too,
so tracebacks and stray prints follow the rotation instead of growing a renamed file forever.
Size is checked on every record, against the file's real end (every writer appends). A
foreground node logs to its stderr and leaves rotation to whoever reads it.

Every record is one line, with text from outside inert (`InertFormatter`, messages/inert.py):
a field name a client made up, echoed by a refusal, once wrote its own "ERROR" line into
node.log and sent its escape sequences to whoever tailed it. A traceback keeps its lines.
`configure_stderr_log` gives a foreground node (and a command's embedded one) the same.

It never writes anything but log records and never deletes anything but rotated backups.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

from subagents_node.messages import statefiles
from subagents_node.messages.inert import one_line

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class InertFormatter(logging.Formatter):
    """A record on one line, its controls shown as escapes; the traceback after it as it is
    (`format` appends that after `formatMessage`)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))


class NodeLogHandler(RotatingFileHandler):
    """A size-rotated log file that also owns the process's stdout and stderr."""

    def _open(self) -> io.TextIOWrapper:
        # Never through a symlink, never blocking on a FIFO (messages/statefiles.py): a link
        # planted as node.log had the log appended to a file elsewhere and that file chmod'ed.
        # The file is private like everything in the state dir (0700 dir, 0600 file): fchmod,
        # on the file opened, never a chmod by name.
        log = open_log(self.baseFilename)
        # The handler keeps it open (and closes it at rotation or shutdown): no `with`.
        stream = open(log, "a", encoding=self.encoding, errors=self.errors)  # noqa: SIM115
        for fd in (1, 2):
            os.dup2(stream.fileno(), fd)
        return stream

    def shouldRollover(self, record: logging.LogRecord) -> int:
        # Other writers (tracebacks on fd 2) append to the same file: measure its real end.
        stream = self.stream
        if stream is None:
            stream = self.stream = self._open()
        return int(os.fstat(stream.fileno()).st_size >= self.maxBytes > 0)


def open_log(path: str | os.PathLike[str]) -> int:
    """`node.log` opened for appending (made 0600 if new, made 0600 if not): OSError when it is
    a symlink or not a regular file (messages/statefiles.py)."""
    fd = statefiles.open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def configure_node_log(path: Path, max_bytes: int, backups: int, level: int) -> None:
    handler = NodeLogHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    handler.setFormatter(InertFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def configure_stderr_log(level: int, fmt: str = LOG_FORMAT) -> None:
    """Records to stderr, one inert line each: a foreground node's log. Like
    `logging.basicConfig`, it leaves a process whose logging is set up already as it is."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(InertFormatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
