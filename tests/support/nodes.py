"""Shared fixtures: short state dirs, real node processes, embedded nodes, the CLI two ways.

What it owns: the life of every node process a test starts (started detached or in the
foreground, stopped at teardown, killed if it will not stop) and of every raw socket handed
out, so a failing test never leaves a node or a socket behind. It never mocks ZeroMQ, SQLite or
processes, and it never sleeps: every wait is on an event (a ready pipe, a pidfd, a reply) with
a deadline.

Fixtures
    state_dir           a fresh short directory under /tmp (ipc paths must stay < 107 bytes)
    node                a detached node started with --faults (NodeProcess)
    start_node          factory: start_node("--mailbox-limit", "4", ...) -> NodeProcess
    foreground_node     factory: a node run in the foreground as our child (exit code, log)
    embedded_node       subagents_node.Node.embedded(...) with faults on, in this process
    invoke              the CLI in this process through click's CliRunner
    raw_dealer          factory: a bare DEALER socket connected to an address (RawPeer);
                        `peer.request_once(env)` also proves no second reply follows
Helpers
    run_cli(...)        the CLI as a real subprocess (`python -m subagents_node`)
    run_in_processes()  run a module-level function in N fresh processes and collect results
    free_tcp_port()     a loopback port nobody is listening on right now
    free_home_port()    one free with the next three (a home and its ledger owners)
    new_state_dir()     what the state_dir fixture uses, for module-scoped fixtures
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq
from click.testing import CliRunner, Result

from subagents_node.cli import cli
from subagents_node.client.client import Client
from subagents_node.client.paths import LOG_NAME, read_pid_file
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.envelope import Envelope
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.node import NodeStatusResult
from subagents_node.node.daemon import stop_node, wait_exited
from subagents_node.node.node import Node

REPO = Path(__file__).resolve().parents[2]
#: Environment variables that would make a test talk to a developer's real node or state.
_LEAKY_ENV = (
    "SUBAGENTS_NODE",
    "SUBAGENTS_STATE_DIR",
    "SUBAGENTS_TEST_FAULTS",
    "SUBAGENTS_RUN_FANOUT",
    "SUBAGENTS_SESSION",
    "SUBAGENTS_DEPTH",
    "SUBAGENTS_MAX_DEPTH",
    "SUBAGENTS_CONTAINMENT",
)
START_TIMEOUT_S = 30.0
CLI = (sys.executable, "-m", "subagents_node")


def node_files_left(state_dir: Path) -> list[str]:
    """The pid files and sockets a node left in `state_dir` (none once it stopped cleanly)."""
    return sorted(p.name for p in state_dir.iterdir() if p.suffix in (".pid", ".sock"))


#: The test session's own short directory (tests/conftest.py makes it and removes it at the
#: end), inherited by every process a test starts; /tmp outside a session.
SESSION_TMP_ENV = "SA_TESTS_TMP"


def short_dir(prefix: str = "sa-") -> Path:
    """A short, fresh directory in the session's: ipc socket paths must be < 107 bytes (pytest's
    tmp_path is not), and whatever a test leaves there goes with the session."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get(SESSION_TMP_ENV, "/tmp")))


def new_state_dir() -> Path:
    """A short, fresh directory for a node's state (`short_dir`)."""
    return short_dir()


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_home_port() -> int:
    """A loopback port that is free with the next three (a home's ledger owners listen on
    them: a start refuses one that is taken), as far as can be known right now."""
    for _ in range(100):
        base = free_tcp_port()
        if base > 65532:
            continue
        probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(3)]
        try:
            for offset, probe in enumerate(probes, 1):
                probe.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError("no four free loopback ports in a row")


def run_cli(
    *args: str,
    state_dir: Path | None = None,
    timeout: float = 60.0,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m subagents_node [--state-dir D] ARGS` as a real process; output as text.
    `prefix` runs it through another command (`ip netns exec NS`: on another "host")."""
    cmd = [*prefix, *CLI]
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
        env=env,
    )


def run_in_processes(
    fn: Callable[..., Any], arg_lists: Sequence[tuple[Any, ...]], timeout: float = 60.0
) -> list[Any]:
    """Run `fn(*args)` in one fresh (spawned) process per entry; return the results in order.

    `fn` must be a module-level function of an importable module (a test module is fine) and
    its arguments and result must pickle. Spawned, not forked: a forked child would inherit
    this process's ZeroMQ contexts and threads.
    """
    spawn = multiprocessing.get_context("spawn")
    # An executor, not a Pool: a worker that dies (even while importing `fn`'s module) breaks
    # the executor at once instead of leaving its task to hang until the timeout.
    with ProcessPoolExecutor(max_workers=len(arg_lists), mp_context=spawn) as pool:
        futures = [pool.submit(fn, *args) for args in arg_lists]
        return [f.result(timeout) for f in futures]


# -- real node processes ----------------------------------------------------------------------


@dataclass
class NodeProcess:
    """A node started with `start --detach` on `state_dir`; its pid and address once serving."""

    state_dir: Path
    args: tuple[str, ...] = ()
    #: run `start` through this command (e.g. `ip netns exec NS`: the node lives there)
    prefix: tuple[str, ...] = ()
    #: a fault-injection step at which the node kills itself (SUBAGENTS_TEST_KILL_AT, with
    #: `--faults`); only this start sees it, so the node started after it on the same state
    #: dir lives
    kill_at: str = ""
    #: more environment for this start only (a test-only knob of a node started `--faults`)
    env: dict[str, str] = field(default_factory=dict)
    pid: int = 0
    address: str = ""
    _proc: psutil.Process | None = None
    _clients: list[Client] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.state_dir / LOG_NAME

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> NodeProcess:
        more = {**self.env, "SUBAGENTS_TEST_KILL_AT": self.kill_at} if self.kill_at else self.env
        env = {**os.environ, **more} if more else None
        done = run_cli(
            "start", "--detach", *self.args, state_dir=self.state_dir, prefix=self.prefix, env=env
        )
        assert done.returncode == 0, f"start failed: {done.stderr}\n--- node log ---\n{self.log()}"
        record = read_pid_file(self.state_dir)
        assert record is not None, "a started node must leave a live pid record"
        self.pid = int(str(record["pid"]))
        self.address = str(record["address"])
        self._proc = psutil.Process(self.pid)
        return self

    def stop(self) -> subprocess.CompletedProcess[str]:
        return run_cli("stop", state_dir=self.state_dir)

    def kill(self) -> None:
        """SIGKILL, then wait until the process has exited (a zombie counts as exited)."""
        assert self._proc is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            self._proc.send_signal(signal.SIGKILL)
        assert wait_exited(self._proc, 10.0), f"node {self.pid} survived SIGKILL"

    def wait_exited(self, timeout: float) -> bool:
        assert self._proc is not None
        return wait_exited(self._proc, timeout)

    def alive(self) -> bool:
        if self._proc is None:
            return False
        try:
            return self._proc.is_running() and self._proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def rss(self) -> int:
        assert self._proc is not None
        return int(self._proc.memory_info().rss)

    def transport(self, address: str | None = None) -> ZmqTransport:
        """A ZmqTransport to the node (or to another of its endpoints), closed at teardown."""
        transport = ZmqTransport(address or self.address, state_dir=self.state_dir)
        self._clients.append(Client(transport))
        return transport

    def client(self, timeout: float = 10.0, address: str | None = None) -> Client:
        # tcp is CURVE: the keys are this node's state dir's (`keys generate`).
        transport = ZmqTransport(address or self.address, state_dir=self.state_dir)
        client = Client(transport, timeout=timeout)
        self._clients.append(client)
        return client

    def status(self) -> NodeStatusResult:
        with Client(ZmqTransport(self.address), timeout=10.0) as client:
            return client.status()

    def close_clients(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    def cleanup(self) -> None:
        """Stop the node if it still runs; kill it if it will not stop."""
        self.close_clients()
        if not self.alive():
            return
        # The CLI's own stop sequence, in this process: no interpreter start per teardown.
        with contextlib.suppress(SubagentsError):
            stop_node(self.state_dir, timeout_s=15.0)
        if self.alive():
            self.kill()


@contextlib.contextmanager
def running_node(
    *args: str, state_dir: Path | None = None, kill_at: str = ""
) -> Iterator[NodeProcess]:
    """A detached node for the duration of the block (usable from any fixture scope);
    `kill_at` makes it one that kills itself at that step (NodeProcess.kill_at)."""
    own_dir = state_dir is None
    node = NodeProcess(state_dir or new_state_dir(), tuple(args), kill_at=kill_at)
    try:
        yield node.start()
    finally:
        node.cleanup()
        if own_dir:
            shutil.rmtree(node.state_dir, ignore_errors=True)


@dataclass
class ForegroundNode:
    """A node run in the foreground as our child: we see its exit code and its output."""

    state_dir: Path
    proc: subprocess.Popen[bytes]
    address: str

    @property
    def log_path(self) -> Path:
        return self.state_dir / "foreground.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, timeout: float = 10.0) -> Client:
        return Client(ZmqTransport(self.address), timeout=timeout)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_foreground(state_dir: Path, *args: str) -> ForegroundNode:
    """`start` (not detached) with a ready pipe; returns once the node serves."""
    read_fd, write_fd = os.pipe()
    log = open(state_dir / "foreground.log", "wb")  # noqa: SIM115 (the child owns it)
    with log:
        proc = subprocess.Popen(
            [*CLI, "--state-dir", str(state_dir), "start", "--ready-fd", str(write_fd), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(write_fd,),
            cwd=REPO,
        )
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], START_TIMEOUT_S)
        line = os.read(read_fd, 4096).decode(errors="replace").strip() if ready else ""
    finally:
        os.close(read_fd)
    node = ForegroundNode(state_dir, proc, f"ipc://{state_dir.resolve()}/node.sock")
    if line != "ready":
        node.cleanup()
        raise AssertionError(f"foreground node did not start ({line!r}):\n{node.log()}")
    return node


# -- raw sockets --------------------------------------------------------------------------------


class RawPeer:
    """A bare DEALER socket: sends whatever bytes a test wants, reads replies as envelopes."""

    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
        self.address = address
        self.sock = zctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 20)
        self.sock.connect(address)

    def send_frames(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def send_env(self, env: Envelope) -> str:
        self.sock.send(encode(env))
        return env.id

    def recv_env(self, timeout: float = 10.0) -> Envelope | None:
        """The next reply, or None when none arrives within `timeout`."""
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return decode(self.sock.recv(), 64 << 20)

    def ping(self, timeout: float = 10.0) -> Envelope:
        """A valid node.ping on this socket; returns its reply (skipping unrelated ones)."""
        rid = self.send_env(Envelope(type="node.ping", body={}))
        while True:
            reply = self.recv_env(timeout)
            assert reply is not None, f"no reply to a valid ping on {self.address}"
            if reply.corr == rid:
                return reply

    def request_once(self, env: Envelope, timeout: float = 10.0) -> Envelope:
        """Send `env`, return its one reply, and check that no second reply follows it: a ping
        sent on the same DEALER after the reply must be answered by the very next frame. The
        window is that round trip (an event, not a sleep): a second answer the node sends with
        or after the first, before it serves the ping, arrives ahead of the pong."""
        self.send_env(env)
        reply = self.recv_env(timeout)
        assert reply is not None, f"no reply to {env.type} within {timeout}s"
        assert reply.corr == env.id, f"a reply to something else: {reply.type} {reply.body}"
        ping = Envelope(type="node.ping", body={})
        self.send_env(ping)
        follow = self.recv_env(timeout)
        assert follow is not None, f"no pong after {env.type}: is the node still serving?"
        assert follow.corr == ping.id, (
            f"{env.type} was answered twice: the frame after its reply was {follow.type} "
            f"{str(follow.body)[:300]}"
        )
        return reply

    def close(self) -> None:
        self.sock.close(linger=0)


def error_of(env: Envelope) -> SubagentsError:
    """The typed error an error reply carries."""
    assert env.type == "error", f"expected an error reply, got {env.type}: {env.body}"
    return SubagentsError.from_wire(env.body)


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No test may reach a developer's real node, state or agent dirs through the environment."""
    for name in _LEAKY_ENV:
        monkeypatch.delenv(name, raising=False)
    home = new_state_dir()
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = new_state_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_node() -> Iterator[Callable[..., NodeProcess]]:
    """Factory: `start_node(*start_args, state_dir=None, kill_at="")`; every node is stopped
    at teardown."""
    stack = contextlib.ExitStack()

    def start(*args: str, state_dir: Path | None = None, kill_at: str = "") -> NodeProcess:
        return stack.enter_context(running_node(*args, state_dir=state_dir, kill_at=kill_at))

    with stack:
        yield start


@pytest.fixture
def node(start_node: Callable[..., NodeProcess]) -> NodeProcess:
    """A detached node with fault injection (debug.raise / debug.sleep) enabled."""
    return start_node("--faults")


@pytest.fixture
def tcp_node(start_node: Callable[..., NodeProcess], state_dir: Path) -> tuple[NodeProcess, str]:
    """A detached node listening on loopback tcp too, with the state dir's keys generated (its
    own `local` client key allowed); and that tcp endpoint."""
    done = run_cli("keys", "generate", state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    return start_node("--listen", tcp, state_dir=state_dir), tcp


@pytest.fixture
def foreground_node() -> Iterator[Callable[..., ForegroundNode]]:
    """Factory: `foreground_node(*start_args)` -> a node that is our child process."""
    started: list[tuple[ForegroundNode, Path]] = []

    def start(*args: str) -> ForegroundNode:
        directory = new_state_dir()
        try:
            fg = start_foreground(directory, *args)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        started.append((fg, directory))
        return fg

    yield start
    for fg, directory in started:
        fg.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def embedded_node(state_dir: Path) -> Iterator[Node]:
    with Node.embedded(state_dir=state_dir, faults=True) as node:
        yield node


@pytest.fixture
def invoke() -> Callable[..., Result]:
    """Run the CLI in this process: `invoke("--state-dir", d, "ping", "--json")`."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(cli, list(args), prog_name="subagents-node", catch_exceptions=False)

    return run


@pytest.fixture
def raw_dealer() -> Iterator[Callable[[str], RawPeer]]:
    """Factory: `raw_dealer(address)` -> RawPeer; sockets and their context close at teardown."""
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    peers: list[RawPeer] = []

    def make(address: str) -> RawPeer:
        peer = RawPeer(zctx, address)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        peer.close()
    zctx.term()
