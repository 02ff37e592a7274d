"""Detached nodes: start one in the background and wait for it to be ready; stop one cleanly.

Owns the start handshake (a pipe the detached node writes one line to once it is serving, so
the parent waits on an event, not on a polling loop) and the stop sequence (ask the node to
shut down, then wait for its process to exit).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import psutil

from subagents_node.client.client import Client
from subagents_node.client.paths import LOG_NAME, ensure_state_dir, read_pid_file
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.errors import NodeError, NodeNotRunning, NodeTimeout

#: how long a detached node that failed to start may take to exit before it is killed
FAILED_EXIT_WAIT_S = 5.0


def start_detached(
    state_dir: Path, extra_args: list[str], timeout_s: float = 20.0
) -> dict[str, object]:
    """Start `subagents-node start` in its own session; return its pid record once serving."""
    ensure_state_dir(state_dir)
    read_fd, write_fd = os.pipe()
    log_path = state_dir / LOG_NAME
    cmd = [
        sys.executable,
        "-m",
        "subagents_node",
        "--state-dir",
        str(state_dir),
        "start",
        "--ready-fd",
        str(write_fd),
        "--log-file",
        *extra_args,
    ]
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout_s)
        line = os.read(read_fd, 4096).decode(errors="replace").strip() if ready else ""
    finally:
        os.close(read_fd)
    if line == "ready":
        record = read_pid_file(state_dir)
        if record is not None:
            return record
    if proc.poll() is None and not line:
        proc.kill()
        raise NodeTimeout(
            f"the detached node did not become ready within {timeout_s:g}s; see {log_path}",
            address=str(state_dir),
        )
    # A node that reported an error is cleaning up (its shim template, its sockets' linger) and
    # exiting: return only once it is gone, so a failed start leaves nothing running.
    try:
        proc.wait(timeout=FAILED_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    raise NodeError(
        f"the detached node failed to start: {line or 'exited'}; see {log_path}",
        address=str(state_dir),
    )


def signal_ready(ready_fd: int | None, message: str) -> None:
    if ready_fd is None:
        return
    try:
        os.write(ready_fd, (message + "\n").encode())
    finally:
        os.close(ready_fd)


def stop_node(state_dir: Path, timeout_s: float = 15.0) -> int:
    """Ask the node serving `state_dir` to shut down and wait for its process to exit."""
    record = read_pid_file(state_dir)
    if record is None:
        raise NodeNotRunning(f"no node is running for {state_dir}", address=str(state_dir))
    pid = int(str(record["pid"]))
    client = Client(ZmqTransport(str(record["address"])), timeout=5.0)
    try:
        client.shutdown()
    except NodeError:
        pass  # fall back to a signal below
    finally:
        client.close()
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return pid
    if not wait_exited(proc, timeout_s):
        proc.terminate()
        if not wait_exited(proc, 5.0):
            raise NodeTimeout(
                f"the node (pid {pid}) did not exit after shutdown and SIGTERM",
                address=str(record["address"]),
                timeout_s=timeout_s + 5.0,
            )
    return pid


def wait_exited(proc: psutil.Process, timeout_s: float) -> bool:
    """Wait for `proc` (not necessarily our child) to exit; True once it has.

    A zombie has exited: only its reaper can collect it, and in a container pid 1 may never
    do so, so waiting for the pid to vanish (psutil's wait) can hang. On Linux a pidfd becomes
    readable exactly when the process terminates, so this waits on an event, not a poll.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        pidfd = None  # no pidfd support: fall back to psutil's wait
    if pidfd is not None:
        try:
            ready, _, _ = select.select([pidfd], [], [], timeout_s)
        finally:
            os.close(pidfd)
        return bool(ready)
    try:
        proc.wait(timeout_s)
        return True
    except psutil.TimeoutExpired:
        pass
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
