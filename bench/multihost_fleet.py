"""A home node and its workers for `bench.multihost`, one network namespace each.

What it owns: each node's state dir and keys, the home's allow-list entries for its workers,
and the node processes, started detached through the real CLI (`keys generate`, `keys allow`,
`start --home` / `start --join`) inside the hosts of a `tests.support.netns` fabric, and
stopped at the end (the fabric's own teardown then kills whatever is left in its namespaces).
The bench process reaches every node through its ipc socket: a unix socket is a file, so it
works across network namespaces, and only the nodes' own links to the home go over tcp + CURVE.

It never asserts and never sleeps: a CLI that fails raises `FleetError` with its stderr, and
every wait is on a reply.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.common import REPO
from subagents_node.client.paths import read_pid_file
from subagents_node.messages.errors import SubagentsError
from subagents_node.node.daemon import stop_node
from tests.support.netns import Fabric

#: The home's port inside its own network namespace (nothing else listens there).
HOME_PORT = 7790
CLI_TIMEOUT_S = 60.0
_CLI = (sys.executable, "-m", "subagents_node")


class FleetError(RuntimeError):
    """A CLI step of setting up the fleet failed; its command and stderr are in the message."""


@dataclass
class NodeHandle:
    """One started node: its name (the host it lives on), state dir, pid and ipc address."""

    name: str
    state_dir: Path
    pid: int = 0
    address: str = ""

    def processes(self) -> list[psutil.Process]:
        """The node process and everything it started (its owner processes, the shim
        template, shims): the whole cost of the node on its host."""
        node = psutil.Process(self.pid)
        return [node, *node.children(recursive=True)]


@dataclass
class Fleet:
    fabric: Fabric
    home: NodeHandle
    endpoint: str
    workers: dict[str, NodeHandle] = field(default_factory=dict)


def _cli(
    *args: str, state_dir: Path, fabric: Fabric | None = None, host: str = ""
) -> subprocess.CompletedProcess[str]:
    argv = [*_CLI, "--state-dir", str(state_dir), *args]
    if fabric is None:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            cwd=REPO,
            check=False,
        )
    else:
        done = fabric.run(host, argv, timeout=CLI_TIMEOUT_S)
    if done.returncode != 0:
        where = f" on {host}" if host else ""
        raise FleetError(f"`{' '.join(args)}`{where} exited {done.returncode}: {done.stderr}")
    return done


def _keys(state_dir: Path) -> dict[str, str]:
    _cli("keys", "generate", state_dir=state_dir)
    shown = json.loads(_cli("keys", "show", "--json", state_dir=state_dir).stdout)
    return {"server": str(shown["server_public"]), "client": str(shown["client_public"])}


def _start(fabric: Fabric, node: NodeHandle, *args: str) -> NodeHandle:
    _cli("start", "--detach", *args, state_dir=node.state_dir, fabric=fabric, host=node.name)
    record = read_pid_file(node.state_dir)
    if record is None:
        raise FleetError(f"{node.name} did not leave a live pid record; see {node.state_dir}")
    node.pid, node.address = int(str(record["pid"])), str(record["address"])
    return node


def _stop(node: NodeHandle) -> None:
    if read_pid_file(node.state_dir) is None:
        return  # never started, or killed (the lost-worker measurement)
    with contextlib.suppress(SubagentsError, OSError):
        stop_node(node.state_dir, timeout_s=15.0)


@contextlib.contextmanager
def fleet(
    fabric: Fabric, workers: Sequence[str], heartbeat_s: float, heartbeat_timeout_s: float
) -> Iterator[Fleet]:
    """A home on fabric host `home` and a started worker on each host of `workers`, all
    stopped and their state dirs removed at the end (also on an exception)."""
    endpoint = f"tcp://{fabric.address('home')}:{HOME_PORT}"
    home = NodeHandle("home", Path(tempfile.mkdtemp(prefix="sa-mh-", dir="/tmp")))
    crew = Fleet(fabric, home, endpoint)
    try:
        home_key = _keys(home.state_dir)["server"]
        _start(
            fabric,
            home,
            *("--home", "--listen", endpoint),
            *("--heartbeat", str(heartbeat_s), "--heartbeat-timeout", str(heartbeat_timeout_s)),
        )
        for name in workers:
            worker = NodeHandle(name, Path(tempfile.mkdtemp(prefix="sa-mh-", dir="/tmp")))
            crew.workers[name] = worker
            key = _keys(worker.state_dir)["client"]
            _cli("keys", "allow", "--name", name, "--", key, state_dir=home.state_dir)
            _start(fabric, worker, "--join", endpoint, "--home-key", home_key, "--name", name)
        yield crew
    finally:
        for node in [*crew.workers.values(), home]:
            _stop(node)
        for node in [*crew.workers.values(), home]:
            shutil.rmtree(node.state_dir, ignore_errors=True)
