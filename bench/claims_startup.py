"""Node cold start and idle memory (issue 11's last two targets), for `bench/claims.py`.

Measured, alternating so that load drifts hit every way alike:
- cold start: from spawning `subagents-node start` (foreground) to the first answered claim
  (a fresh state dir each time; the client retries until the owner's socket exists: that
  wait is what is measured), and from spawning `start --detach` (which returns once the node
  serves) to the first answered claim;
- both with our modules' bytecode cached (what an installed package runs with: the cache is
  written to a scratch `PYTHONPYCACHEPREFIX` by one untimed start first) and, when this
  environment sets `PYTHONDONTWRITEBYTECODE`, as the environment is: every start compiles
  our modules from source (an editable checkout that may not write `__pycache__`);
- idle memory: RSS and PSS of every process of an idle node (the node and its owners), each
  and summed. RSS counts the pages a forked owner shares with the node in each process; PSS
  splits them.
It reports and never asserts; `python -m bench.claims_startup` prints this section alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from bench.common import detached_node, markdown_table
from subagents_node.client.client import Client, connect
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.errors import NodeError

COLD_STARTS = 7
TARGET_S = 0.5
TARGET_RSS = 150 * 2**20
_CLI = [sys.executable, "-m", "subagents_node"]


def _first_claim(state_dir: Path, proc: subprocess.Popen[bytes] | None) -> None:
    """Create a budget and claim on it, retrying while the node's sockets do not exist."""
    address = f"ipc://{state_dir / 'node.sock'}"
    while True:
        try:
            with Client(ZmqTransport(address), timeout=5.0) as client:
                budget = client.fanout.create(root_run_id="cold", limit=1)
                client.fanout.claim(budget, ["tasks[0]"])
            return
        except NodeError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError("the node exited during its cold start") from None
            time.sleep(0.002)


def _cold_start_s(env: dict[str, str], detach: bool) -> float:
    """Spawn → first claim answered, on a fresh state dir; the node is stopped afterwards."""
    state_dir = Path(tempfile.mkdtemp(prefix="sa-cold-", dir="/tmp"))
    cli = [*_CLI, "--state-dir", str(state_dir), "start", *(["--detach"] if detach else [])]
    quiet = subprocess.DEVNULL
    started = time.monotonic()
    try:
        if detach:
            subprocess.run(cli, env=env, check=True, stdout=quiet, stderr=quiet)
            _first_claim(state_dir, None)
            return time.monotonic() - started
        proc = subprocess.Popen(cli, env=env, stdout=quiet, stderr=quiet)
        try:
            _first_claim(state_dir, proc)
            return time.monotonic() - started
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    finally:
        if detach:
            subprocess.run([*_CLI, "--state-dir", str(state_dir), "stop"], env=env, stdout=quiet)
        shutil.rmtree(state_dir, ignore_errors=True)


@contextlib.contextmanager
def _environments() -> Iterator[dict[str, dict[str, str]]]:
    """The environments a start is measured in: bytecode cached (always), and as this
    environment is when it keeps Python from writing bytecode."""
    cache = Path(tempfile.mkdtemp(prefix="sa-pyc-", dir="/tmp"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    cached = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = str(cache)
    envs = {"bytecode cached": cached}
    if base.get("PYTHONDONTWRITEBYTECODE"):
        envs["no bytecode cache"] = base
    try:
        _cold_start_s(cached, detach=False)  # untimed: writes the bytecode cache
        yield envs
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _idle_memory(client: Client) -> list[tuple[str, int, int]]:
    """(process, RSS, PSS) of each process of an idle node: the node, then its owners."""
    status = client.status()
    names = {a.pid: f"owner {a.name}" for a in status.actors if a.pid is not None}
    node = psutil.Process(status.pid)
    rows = []
    for one in [node, *node.children()]:
        info = one.memory_full_info()
        rows.append((names.get(one.pid, "node" if one is node else "other"), info.rss, info.pss))
    return rows


Memory = list[tuple[str, int, int]]


def measure() -> tuple[dict[str, list[float]], dict[str, Memory]]:
    """Cold-start samples (s) by way of starting, and each environment's idle node's memory
    by process (compiling from source leaves the compiler's garbage in the node's heap, and
    every owner inherits it)."""
    samples: dict[str, list[float]] = {}
    memory: dict[str, Memory] = {}
    with _environments() as envs:
        for _ in range(COLD_STARTS):
            for env_name, env in envs.items():
                for detach in (False, True):
                    way = f"`start{' --detach' if detach else ''}`, {env_name}"
                    samples.setdefault(way, []).append(_cold_start_s(env, detach))
        for env_name, env in envs.items():
            with detached_node(env=env) as address, connect(address, timeout=30.0) as client:
                memory[env_name] = _idle_memory(client)
    return samples, memory


def section() -> tuple[str, float, int]:
    """The markdown section; the foreground cached median (s) and the RSS sum (bytes)."""
    samples, memory = measure()
    ms = 1000.0
    cold = markdown_table(
        ["spawn → first claim answered", "median ms", "min ms", "max ms"],
        [(way, statistics.median(s) * ms, min(s) * ms, max(s) * ms) for way, s in samples.items()],
    )
    headline = statistics.median(samples["`start`, bytecode cached"])
    mib = float(2**20)
    sums = {env: (sum(r for _, r, _ in m), sum(p for _, _, p in m)) for env, m in memory.items()}
    names = [name for name, _, _ in memory["bytecode cached"]]
    mem = markdown_table(
        ["process", *(f"{env}: {kind} MiB" for env in memory for kind in ("RSS", "PSS"))],
        [
            (name, *(v / mib for m in memory.values() for v in m[i][1:]))
            for i, name in enumerate(names)
        ]
        + [("sum", *(v / mib for s in sums.values() for v in s))],
    )
    rss, pss = sums["bytecode cached"]
    text = (
        "### Cold start and idle memory\n\n"
        f"Cold start, {COLD_STARTS} of each, alternating (a fresh state dir each; a node "
        "started in the foreground is terminated afterwards, a detached one stopped). "
        "'bytecode cached' is how an installed package runs; 'no bytecode cache' is this "
        "environment as it is (PYTHONDONTWRITEBYTECODE=1 and an editable checkout: every "
        "start compiles our modules from source), shown only when it is set:\n\n"
        f"{cold}\n\n"
        f"Target < {TARGET_S * ms:.0f} ms (foreground `start`, bytecode cached, median): "
        f"**{headline * ms:.0f} ms**, {'met' if headline < TARGET_S else 'missed'}.\n\n"
        f"Idle node (`start --detach`): {len(names)} processes, the node and its owners, "
        "forked after the node's imports (RSS counts the pages they share in each of them, "
        f"PSS splits them):\n\n{mem}\n\n"
        f"Target RSS sum < {TARGET_RSS / mib:.0f} MiB (bytecode cached): "
        f"**{rss / mib:.1f} MiB**, {'met' if rss < TARGET_RSS else 'missed'} (PSS sum "
        f"{pss / mib:.1f} MiB)."
    )
    return text, headline, rss


if __name__ == "__main__":
    print(section()[0])
