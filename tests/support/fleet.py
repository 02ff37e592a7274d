"""A home node and worker nodes for multi-host tests, on loopback or one network namespace each.

What it owns: each node's state dir and keys, the home's allow-list entries for its workers,
and the node processes (started detached through the real CLI, stopped or killed at the end).
Every node talks to the others only over tcp + CURVE; the test process reaches each node
through its ipc socket (a unix socket is a file, so it works across network namespaces). It
never sleeps: waits are on replies and on conditions with deadlines.

On namespaced hosts (`isolated(fabric)`) every node's state dir is `ROOT/NAME`, and each host
runs in its own mount namespace too, where `ROOT` shows only its own directory (its view:
an otherwise empty directory bind-mounted over `ROOT`, with the real `ROOT/NAME` bound into it):
no node sees another's files, and the test process, outside, sees them all at the same paths.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from subagents_node.client.client import Client
from subagents_node.client.keys import CLIENT_KEY, SERVER_KEY, keys_dir, read_keypair
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.members import MemberList, MemberListing, MemberView
from tests.support.netns import Fabric, hosts, skip_unless_netns
from tests.support.nodes import REPO, NodeProcess, free_home_port, new_state_dir, run_cli

EXAMPLE_AGENTS = REPO / "examples" / "agents"
#: The home's port inside its own network namespace (nothing else listens there).
NETNS_PORT = 7790

#: name -> the command prefix that puts a process on that "host" (() = this namespace)
Placement = Callable[[str], tuple[str, ...]]


def here(name: str) -> tuple[str, ...]:
    """Every node on this host (loopback)."""
    return ()


def on_hosts(fabric: Fabric) -> Placement:
    """Each node in its own network namespace of `fabric` (one per name)."""
    return lambda name: ("ip", "netns", "exec", fabric.namespace(name))


@dataclass(frozen=True)
class Isolation:
    """Where the state dirs of isolated hosts live (`ROOT/NAME`) and each host's view."""

    fabric: Fabric
    root: Path
    views: Path

    def state_dir(self, name: str) -> Path:
        directory = self.root / name
        directory.mkdir(mode=0o700)
        (self.views / name / name).mkdir(parents=True)  # the host's view: its own dir only
        return directory

    def place(self, name: str) -> tuple[str, ...]:
        view = self.views / name
        # In order: the real dir into the view, then the view over ROOT.
        return self.fabric.prefix(name, binds={view / name: self.root / name, self.root: view})

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.views, ignore_errors=True)


def isolated(fabric: Fabric) -> Isolation:
    """Each node on its own host of `fabric`: its network namespace and its mount namespace."""
    root = Path(tempfile.mkdtemp(prefix="saf-", dir="/tmp"))
    return Isolation(fabric, root, Path(tempfile.mkdtemp(prefix="safv-", dir="/tmp")))


@dataclass
class Fleet:
    home: NodeProcess
    endpoint: str
    home_key: str
    place: Placement
    heartbeat: tuple[float, float]
    workers: dict[str, NodeProcess] = field(default_factory=dict)
    #: the network namespaces the nodes live in (None: all on loopback)
    fabric: Fabric | None = None
    #: each node's own mount namespace as well (None: they share this one's files)
    isolation: Isolation | None = None
    _clients: dict[str, Client] = field(default_factory=dict)

    def cli(self, node: NodeProcess, *args: str, timeout: float = 60.0) -> tuple[int, str, str]:
        done = run_cli(*args, state_dir=node.state_dir, timeout=timeout)
        return done.returncode, done.stdout, done.stderr

    def client(self, node: NodeProcess, timeout: float = 20.0) -> Client:
        """One client per node (its address), kept for the fleet's life."""
        client = self._clients.get(node.address)
        if client is None:
            client = self._clients[node.address] = Client(ZmqTransport(node.address), timeout)
        return client

    def close_client(self, node: NodeProcess) -> None:
        """Forget the client of a node about to be killed (the next one connects afresh)."""
        client = self._clients.pop(node.address, None)
        if client is not None:
            client.close()

    def nodes(self) -> dict[str, MemberView]:
        listing = self.client(self.home).ask(MemberList(), MemberListing)
        return {view.name: view for view in listing.nodes}

    def worker_args(self, name: str, key: str | None = None) -> tuple[str, ...]:
        return ("--join", self.endpoint, "--home-key", key or self.home_key, "--name", name)

    def add_worker(self, name: str, allow: bool = True, start: bool = True) -> NodeProcess:
        """A worker's state dir with its own keys, allowed on the home as `name`, started."""
        directory = self.isolation.state_dir(name) if self.isolation else new_state_dir()
        generated = run_cli("keys", "generate", state_dir=directory)
        assert generated.returncode == 0, generated.stderr
        if allow:
            allowed = run_cli(
                "keys",
                "allow",
                "--name",
                name,
                "--",
                self.public_key(directory),
                state_dir=self.home.state_dir,
            )
            assert allowed.returncode == 0, allowed.stderr
        worker = NodeProcess(directory, self.worker_args(name), prefix=self.place(name))
        self.workers[name] = worker
        if start:
            worker.start()
        return worker

    @staticmethod
    def public_key(state_dir: Path) -> str:
        return read_keypair(keys_dir(state_dir) / CLIENT_KEY).public

    def run_background(
        self, node: NodeProcess, session: str, task: str, limit: int = 0, agent: str = "sleeper"
    ) -> tuple[int, str, str]:
        """`run --async` on `node` (a CLI on that host), with a capacity limit."""
        # A CLI on that host: it reaches its node over ipc (a file), from any namespace.
        env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": str(limit)}
        args = ("run", "--async", "--session", session, "--agents-dir", str(EXAMPLE_AGENTS))
        done = run_cli(*args, agent, task, state_dir=node.state_dir, env=env)
        return done.returncode, done.stdout, done.stderr

    def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()
        for node in [*self.workers.values(), self.home]:
            node.cleanup()
            shutil.rmtree(node.state_dir, ignore_errors=True)
        if self.isolation is not None:
            self.isolation.remove()


@contextlib.contextmanager
def fleet(
    workers: Sequence[str] = ("w1", "w2", "w3"),
    home_host: str = "127.0.0.1",
    place: Placement = here,
    heartbeat: tuple[float, float] = (0.2, 1.5),
    port: int = 0,
    isolation: Isolation | None = None,
    home_env: dict[str, str] | None = None,
) -> Iterator[Fleet]:
    """A home on `home_host` and started workers, torn down (and their dirs removed) after.
    With `isolation`, each node on its own host of its fabric (network and mount namespace).
    With `home_env`, the home starts with faults and this environment (its test-only knobs)."""
    if isolation is not None:
        place = isolation.place
    home_dir = isolation.state_dir("home") if isolation else new_state_dir()
    generated = run_cli("keys", "generate", state_dir=home_dir)
    assert generated.returncode == 0, generated.stderr
    endpoint = f"tcp://{home_host}:{port or free_home_port()}"
    beat, timeout = heartbeat
    home = NodeProcess(
        home_dir,
        (
            "--home",
            "--listen",
            endpoint,
            "--heartbeat",
            str(beat),
            "--heartbeat-timeout",
            str(timeout),
            *(("--faults",) if home_env is not None else ()),
        ),
        prefix=place("home"),
        env=home_env or {},
    )
    key = read_keypair(keys_dir(home_dir) / SERVER_KEY).public
    crew = Fleet(home, endpoint, key, place, heartbeat, isolation=isolation)
    try:
        home.start()
        for name in workers:
            crew.add_worker(name)
        yield crew
    finally:
        crew.close()


#: Where a fleet's nodes live: each a process on this host, or each in its own namespaces.
PLACES = ("loopback", "netns")


@contextlib.contextmanager
def fleet_on(
    place: str,
    workers: Sequence[str],
    spare: Sequence[str] = (),
    heartbeat: tuple[float, float] = (0.2, 1.5),
    home_env: dict[str, str] | None = None,
) -> Iterator[Fleet]:
    """A home and `workers`, on loopback or (`netns`) each on its own host of a fabric that
    has hosts for the `spare` workers a test adds too; skips, saying why, without namespaces.
    `heartbeat` and `home_env` as `fleet` takes them."""
    if place == "loopback":
        with fleet(workers, heartbeat=heartbeat, home_env=home_env) as started:
            yield started
        return
    skip_unless_netns()
    with (
        hosts(["home", *workers, *spare]) as fabric,
        fleet(
            workers,
            home_host=fabric.address("home"),
            place=on_hosts(fabric),
            port=NETNS_PORT,
            isolation=isolated(fabric),
            heartbeat=heartbeat,
            home_env=home_env,
        ) as started,
    ):
        started.fabric = fabric
        yield started
