"""Starting the agent command of one child: its stdio files, its process group, its cwd.

Owns the spawn itself and the one-line error that names what could not be used (the cwd, a
file, the command), never argv (it may hold the task, R-MISC-1). Standard library only (the
shim template imports it). It never waits for or signals the child: the shim does.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any


def spawn_error(order: dict[str, Any], err: OSError) -> str:
    """One line naming what could not be used (the cwd, a file or the command), never argv."""
    what = err.strerror or str(err)
    if err.filename == order["cwd"]:
        return f"cannot start the child: working directory {order['cwd']}: {what}"
    if err.filename in (order.get("stdin_path"), order["stdout_path"], order["stderr_path"]):
        return f"cannot start the child: {err.filename}: {what}"
    return f"cannot start {order['argv'][0]}: {what}"


def _open_stdio(order: dict[str, Any]) -> list[int]:
    """The child's stdin, stdout and stderr, opened here (an error names the file)."""
    append = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    wanted = (
        (order.get("stdin_path") or os.devnull, os.O_RDONLY | os.O_CLOEXEC),
        (order["stdout_path"], append),
        (order["stderr_path"], append),
    )
    fds: list[int] = []
    try:
        for path, mode in wanted:
            try:
                fds.append(os.open(path, mode, 0o600))
            except OSError as err:
                err.filename = path
                raise
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def spawn_agent(order: dict[str, Any]) -> int:
    """Start the agent in its own process group, stdio to its files, in its cwd; its pid.

    Through `subprocess` (vfork + exec in C, every other fd closed), not `os.fork()`: a fork of
    the shim copies its page tables and then faults in every page the forked Python touches
    before exec, which cost more than the rest of the shim's life for a short child. Raises
    OSError naming what could not be used (`spawn_error` turns it into one line)."""
    stdio = _open_stdio(order)
    try:
        proc = subprocess.Popen(
            order["argv"],
            stdin=stdio[0],
            stdout=stdio[1],
            stderr=stdio[2],
            cwd=order["cwd"],
            env=order["env"],
            close_fds=True,
            process_group=0,
        )
    finally:
        for fd in stdio:
            os.close(fd)
    # The shim reaps every descendant itself (waitpid(-1)): Popen must never wait for it.
    proc.returncode = 0
    return proc.pid
