"""Helpers shared by the run tests: tiny agents, gates, event-driven waits, ledger snapshots.

What it owns: the agents the run tests write for themselves (`echo`, `fail`, `gate`), the gate
(a unix socket each gate child connects to, reports its pid on, and then blocks on until the
test releases it), and the waits the tests use. Every wait has a deadline and waits on an event
(a socket, a FIFO, a `runs.watch` long-poll); the one exception is `wait_until`, for ledger
snapshots that have no event to wait on: it re-reads the snapshot until the condition holds.
It never mocks ZeroMQ, SQLite or processes.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.capacity import CapacitySnapshot
from subagents_node.messages.fanout import FanoutDescriptor, FanoutSnapshot
from subagents_node.messages.session import SpawnSnapshot
from subagents_node.messages.supervisor import RunEvent, RunView

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_AGENTS = REPO / "examples" / "agents"
WAIT_S = 20.0

T = TypeVar("T")

_GATE_SCRIPT = '''\
"""Gate: tell the test our pid over its unix socket, then exit with the code it sends."""
import os, socket, sys

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(f"{os.getpid()}\\n".encode())
reply = sock.recv(64).decode().strip()
print(f"released {reply or 'by eof'}")
sys.exit(int(reply) if reply else 3)
'''

_AGENTS = {
    "echo": (
        "Prints its task.",
        '["{python}", "-c", "import sys; print(sys.argv[1])", "{task}"]',
    ),
    "fail": (
        "Writes its task to stderr and exits 3.",
        '["{python}", "-c", "import sys; sys.stderr.write(\'broken: \' + sys.argv[1]); '
        'sys.exit(3)", "{task}"]',
    ),
    "gate": (
        "Connects to the unix socket named by its task and waits to be released.",
        '["{python}", "{agent_dir}/gate.py", "{task}"]',
    ),
}


def write_agent(directory: Path, name: str, description: str, command: str, **front: Any) -> Path:
    """One agent file; `command` is the YAML of the command list."""
    directory.mkdir(parents=True, exist_ok=True)
    extra = "".join(f"{key}: {value}\n" for key, value in front.items())
    path = directory / f"{name}.md"
    path.write_text(
        f"---\nname: {name}\ndescription: {description}\ncommand: {command}\n{extra}---\n"
        f"You are the {name} test agent.\n"
    )
    return path


def script_agents(directory: Path) -> Path:
    """Write the `echo`, `fail` and `gate` agents into `directory`; returns it."""
    for name, (description, command) in _AGENTS.items():
        write_agent(directory, name, description, command)
    (directory / "gate.py").write_text(_GATE_SCRIPT)
    return directory


def new_session() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


def launch_context(
    *agents_dirs: Path,
    session: str | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> LaunchContext:
    """What a launcher in this process would resolve, with extra variables and config values."""
    environ = {**os.environ, **(env or {})}
    return LaunchContext.from_environment(
        cwd=cwd,
        env=environ,
        agents_dirs=[*agents_dirs, EXAMPLE_AGENTS],
        session_id=session or new_session(),
        overrides=overrides or None,
    )


# -- gates ----------------------------------------------------------------------------------------


@dataclass
class GateChild:
    """One connected gate agent: its pid, and the connection that releases it."""

    pid: int
    conn: socket.socket

    def release(self, exit_code: int = 0) -> None:
        self.conn.sendall(f"{exit_code}\n".encode())

    def wait_exit(self, timeout: float = WAIT_S) -> None:
        wait_gone(self.pid, timeout)


class Gate:
    """The unix socket gate agents connect to (its path is their task)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "gate.sock"
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(64)
        self.children: list[GateChild] = []

    def accept(self, count: int, timeout: float = WAIT_S) -> list[GateChild]:
        """Wait for `count` more gate agents to connect and report their pids."""
        self._server.settimeout(timeout)
        fresh = []
        for _ in range(count):
            conn, _ = self._server.accept()
            conn.settimeout(timeout)
            line = b""
            while not line.endswith(b"\n"):
                chunk = conn.recv(64)
                assert chunk, "a gate agent hung up before sending its pid"
                line += chunk
            fresh.append(GateChild(int(line), conn))
        self.children += fresh
        return fresh

    def close(self) -> None:
        for child in self.children:
            child.conn.close()  # a gate still waiting exits (code 3) when its connection ends
        self._server.close()


# -- waits ----------------------------------------------------------------------------------------


def wait_until(condition: Callable[[], T], timeout: float = WAIT_S, what: str = "") -> T:
    """Re-check `condition` until it is truthy; for state that announces no event (snapshots)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or condition}")
        pause.wait(0.02)


def wait_view(
    client: Client, run_id: str, condition: Callable[[RunView], bool], timeout: float = WAIT_S
) -> RunView:
    """Follow the run's events (long-poll) until its view satisfies `condition`."""
    deadline = time.monotonic() + timeout
    seq = 0
    while True:
        remaining = deadline - time.monotonic()
        batch = client.runs.watch(run_id, seq, wait_s=max(0.0, min(5.0, remaining)))
        if condition(batch.run):
            return batch.run
        if remaining <= 0:
            raise AssertionError(f"run {run_id} never got there; it is {batch.run.state}")
        seq = batch.last_seq


def wait_gone(pid: int, timeout: float = WAIT_S) -> None:
    """Block until the process has exited (a zombie counts): its pidfd turns readable."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"process {pid} still runs after {timeout:g}s"
    finally:
        os.close(fd)


def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return client.runs.watch(run_id, 0, wait_s=0).events


def read_fifo(path: Path, timeout: float = WAIT_S) -> str:
    """Block until a child writes its line into the FIFO (read in a thread: a deadline)."""
    got: list[str] = []
    done = threading.Event()

    def reader() -> None:
        with open(path) as fifo:
            got.append(fifo.read())
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    assert done.wait(timeout), f"nothing was written to {path}"
    return got[0]


def stop_active_runs(client: Client, timeout: float = WAIT_S) -> None:
    """Teardown: stop whatever a failed test left running, and wait until it settled."""
    for run in client.runs.list(active_only=True, limit=1000):
        client.runs.stop(run.run_id)
        client.runs.wait(run.run_id, timeout=timeout)


# -- facts ----------------------------------------------------------------------------------------


def peak_alive(events: Iterable[RunEvent]) -> int:
    """The most children alive at once, by the run's own events (started .. exited)."""
    alive: set[object] = set()
    peak = 0
    for event in events:
        if event.kind == "child.started":
            alive.add(event.data["child"])
            peak = max(peak, len(alive))
        elif event.kind == "child.exited":
            alive.discard(event.data["child"])
    return peak


def peak_overlap(run: RunView) -> int:
    """The most children whose [started_at, ended_at] intervals overlap (the processes' lives)."""
    edges = sorted(
        edge
        for child in run.children
        if child.started_at is not None and child.ended_at is not None
        for edge in ((child.started_at, 1), (child.ended_at, -1))
    )
    alive = peak = 0
    for _, step in edges:
        alive += step
        peak = max(peak, alive)
    return peak


def _thread_states(pid: int) -> list[str]:
    """The state letter of each thread of `pid` (none: the process is gone)."""
    states = []
    with suppress(FileNotFoundError, ProcessLookupError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with suppress(FileNotFoundError, ProcessLookupError):
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                states.append(stat.rsplit(")", 1)[1].split()[0])
    return states


def stop_process(pid: int, timeout: float = WAIT_S) -> None:
    """SIGSTOP `pid` and return once every thread of it has stopped (or it is gone).

    `kill` only queues the stop: one thread takes it when it is next scheduled, and until then
    the process's other threads run on. On a loaded host that was long enough for a "silenced"
    node to answer the request a test sent right after the kill. No event says a process that
    is not our child stopped, so its threads' states are read until they all say so."""
    os.kill(pid, signal.SIGSTOP)
    wait_until(
        lambda: all(state in "TtZX" for state in _thread_states(pid)),
        timeout,
        what=f"process {pid} to stop",
    )


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP `pid` for the block: it keeps its sockets but answers nothing until SIGCONT
    after the block (even when the block killed it: a signal to a gone process is ignored).
    What a test holds an owner busy with until its event came, where a timed sleep of the
    owner could end first on a loaded host. The block starts once every thread has stopped."""
    stop_process(pid)
    try:
        yield
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def process_gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, waiting for a reaper that may never come)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass(frozen=True)
class Ledgers:
    """Everything a refused launch must leave exactly as it was."""

    capacity: CapacitySnapshot
    spawns: SpawnSnapshot
    budget: FanoutSnapshot | None
    runs: tuple[str, ...]


def ledgers(
    client: Client, session: str, limit: int, budget: FanoutDescriptor | None = None
) -> Ledgers:
    return Ledgers(
        capacity=client.capacity.snapshot(session, limit),
        spawns=client.session.spawn_snapshot(session),
        budget=client.fanout.snapshot(budget) if budget is not None else None,
        runs=tuple(r.run_id for r in client.runs.list(limit=1000)),
    )


PYTHON = sys.executable
