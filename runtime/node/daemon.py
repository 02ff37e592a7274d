"""Detached nodes: start one in the background and wait for it to be ready; stop one cleanly.

A detached node is forked from the process that asks for it (`start --detach`: no second
interpreter start-up), or, from a process that may hold threads or sockets, started as a
fresh `subagents-node start`. Owns the start handshake (a pipe the detached node writes one
line to once it is serving, so the parent waits on an event, not on a polling loop) and the
stop sequence (ask the node to shut down, then wait for its process to exit).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from subagents_node.client.client import Client
from subagents_node.client.paths import LOG_NAME, ensure_state_dir, read_pid_file
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.errors import (
    NodeAlreadyRunning,
    NodeError,
    NodeNotRunning,
    NodeTimeout,
    StoreError,
    SubagentsError,
)
from subagents_node.node.claim import holds_claim

if TYPE_CHECKING:  # psutil and subprocess load where they are used: a node forked from the
    # start command, and its owners forked from it, never need them
    import subprocess

    import psutil

#: how long a detached node that failed to start may take to exit before it is killed
FAILED_EXIT_WAIT_S = 5.0


def start_detached(
    state_dir: Path, extra_args: list[str], timeout_s: float = 20.0
) -> dict[str, object]:
    """Start `subagents-node start` in a fresh interpreter in its own session; return its pid
    record once serving. For a caller that may hold threads or sockets (a fork would copy
    them); `fork_detached` is the quicker way from a process that holds neither."""
    import subprocess

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
    from subagents_node.node.nodelog import open_log  # here: `stop` never needs logging's

    try:
        log_fd = open_log(log_path)
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        raise StoreError(f"cannot open {log_path}: {exc.strerror}", path=str(log_path)) from None
    with open(log_fd, "ab") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    os.close(write_fd)
    return _await_ready(state_dir, read_fd, _Spawned(proc), timeout_s)


def fork_detached(
    state_dir: Path, serve: Callable[[int], int], timeout_s: float = 20.0
) -> dict[str, object]:
    """Start a node in a forked child of this process, in its own session, with stdio on
    node.log; return its pid record once serving.

    The child starts from what this process imported already (for `start --detach`: the CLI
    and the configuration), so the start costs a fork instead of an interpreter start-up and
    a second round of those imports. This
    process must hold no thread and no ZeroMQ context (the child would inherit them half
    alive). `serve(ready_fd)` runs in the child: it serves until the node stops, writing
    `ready` or `error: ...` to `ready_fd` as it starts (`signal_ready`), and returns the exit
    code; the child never returns into the caller's code.
    """
    ensure_state_dir(state_dir)
    log_path = state_dir / LOG_NAME
    read_fd, write_fd = os.pipe()
    for stream in (sys.stdout, sys.stderr):  # or the child would write the parent's buffer too
        stream.flush()
    pid = os.fork()
    if pid == 0:  # the node
        code = 1
        try:
            os.close(read_fd)
            try:
                _become_detached(log_path, keep=write_fd)
            except OSError as exc:  # a read-only (or full) state dir: no node.log to write to;
                # the starter prints this one line (a traceback here would reach its terminal)
                signal_failed(write_fd, StoreError(f"cannot open {log_path}: {exc.strerror}"))
            else:
                code = serve(write_fd)
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    return _await_ready(state_dir, read_fd, _Forked(pid), timeout_s)


def _become_detached(log_path: Path, keep: int) -> None:
    """A session of its own (no terminal, so no Ctrl-C from the shell that started it), stdin
    from /dev/null, stdout and stderr appended to node.log, and no other descriptor of the
    starting process but `keep` (as a fresh interpreter started with close_fds would be: a
    caller reading the start command's output sees it end when the command exits)."""
    os.setsid()
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
    from subagents_node.node.nodelog import open_log  # here: `stop` never needs logging's

    null = os.open(os.devnull, os.O_RDONLY)
    # Never through a symlink, never blocking on a FIFO (a refusal is the starter's one line).
    log = open_log(log_path)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)


class _Spawned:
    """A detached node started as a fresh interpreter."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def running(self) -> bool:
        return self._proc.poll() is None

    def kill(self) -> None:
        self._proc.kill()

    def wait(self, timeout_s: float) -> bool:
        import subprocess

        try:
            self._proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False


class _Forked:
    """A detached node forked from this process (our child until this process exits)."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._reaped = False

    def running(self) -> bool:
        if not self._reaped:
            self._reaped = os.waitpid(self._pid, os.WNOHANG)[0] == self._pid
        return not self._reaped

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)

    def wait(self, timeout_s: float) -> bool:
        if self._reaped:
            return True
        try:
            pidfd = os.pidfd_open(self._pid)
        except ProcessLookupError:
            return not self.running()
        try:
            select.select([pidfd], [], [], timeout_s)
        finally:
            os.close(pidfd)
        return not self.running()


class _Detached(Protocol):
    def running(self) -> bool: ...

    def kill(self) -> None: ...

    def wait(self, timeout_s: float) -> bool: ...


def _await_ready(
    state_dir: Path, read_fd: int, proc: _Detached, timeout_s: float
) -> dict[str, object]:
    """Wait for the detached node's one line on its ready pipe (an event, not a poll)."""
    log_path = state_dir / LOG_NAME
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout_s)
        line = os.read(read_fd, 4096).decode(errors="replace").strip() if ready else ""
    finally:
        os.close(read_fd)
    if line == "ready":
        record = read_pid_file(state_dir)
        if record is not None:
            return record
    if proc.running() and not line:
        proc.kill()
        proc.wait(FAILED_EXIT_WAIT_S)
        raise NodeTimeout(
            f"the detached node did not become ready within {timeout_s:g}s; see {log_path}",
            address=str(state_dir),
        )
    # A node that reported an error is cleaning up (its shim template, its sockets' linger) and
    # exiting: return only once it is gone, so a failed start leaves nothing running.
    if not proc.wait(FAILED_EXIT_WAIT_S):
        proc.kill()
        proc.wait(FAILED_EXIT_WAIT_S)
    code, _, message = line.removeprefix("error ").partition(": ")
    if code == NodeAlreadyRunning.code:  # another node claimed the state dir first
        raise NodeAlreadyRunning(message, address=str(state_dir))
    try:  # a node that could not open its log, or write to it (a read-only or full disk),
        # wrote nothing there: pointing at an empty log sent people to read nothing.
        see = f"; see {log_path}" if log_path.is_file() and log_path.stat().st_size else ""
    except OSError:
        see = ""
    raise NodeError(  # the CLI says `error: ` once, before the whole line
        f"the detached node failed to start: {message or 'exited'}{see}",
        address=str(state_dir),
    )


def signal_failed(ready_fd: int | None, err: SubagentsError) -> None:
    """Tell the starter why the start failed: `error CODE: MESSAGE` (one line)."""
    signal_ready(ready_fd, f"error {err.code}: {err.message}")


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
        # No answer: a wedged node is ended by a signal below, but only a process that holds
        # the state dir's claim is this node. A record naming another live process (copied,
        # forged) must not have `stop` kill it.
        if not holds_claim(pid, state_dir) and read_pid_file(state_dir) is not None:
            raise NodeNotRunning(
                f"no node answers for {state_dir}, and the process its node.pid names "
                f"(pid {pid}) does not serve it: nothing was signalled",
                address=str(record["address"]),
            ) from None
    finally:
        client.close()
    _wait_stopped(pid, str(record["address"]), timeout_s)
    return pid


def stop_node_at(client: Client, timeout_s: float = 15.0) -> int:
    """Ask the node `client` talks to (an explicit --address) to shut down; wait for its
    process to exit when it runs on this host (its state dir's pid file names it)."""
    status = client.status()
    client.shutdown()
    record = read_pid_file(Path(status.state_dir))
    if record is not None and record.get("pid") == status.pid:
        _wait_stopped(status.pid, client.address, timeout_s)
    return status.pid


def _wait_stopped(pid: int, address: str, timeout_s: float) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    if not wait_exited(proc, timeout_s):
        proc.terminate()
        if not wait_exited(proc, 5.0):
            raise NodeTimeout(
                f"the node (pid {pid}) did not exit after shutdown and SIGTERM",
                address=address,
                timeout_s=timeout_s + 5.0,
            )


def wait_exited(proc: psutil.Process, timeout_s: float) -> bool:
    """Wait for `proc` (not necessarily our child) to exit; True once it has.

    A zombie has exited: only its reaper can collect it, and in a container pid 1 may never
    do so, so waiting for the pid to vanish (psutil's wait) can hang. On Linux a pidfd becomes
    readable exactly when the process terminates, so this waits on an event, not a poll.
    """
    import psutil

    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        pidfd = None  # no pidfd support: fall back to psutil's wait
    if pidfd is not None:
        try:
            # poll, not select: a caller with more than 1024 descriptors open gets a pidfd
            # that select() cannot watch.
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            ready = poller.poll(max(0, int(timeout_s * 1000)))
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
