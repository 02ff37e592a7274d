"""Spawn overhead: trivial children launched and settled through a real node, beside bare Popen.

For each trivial command (`python -c pass`, `/bin/true`) and each concurrency, in the same run:
- node: one parallel run of CHILDREN tasks with that concurrency cap, sent to a real node process
  (`start --detach`) over its ipc socket; timed from the launch request until `runs.wait`
  reports the run terminal, i.e. until every child has its process-terminal proof committed and
  the run is settled. Each child goes the whole way: its own shim, its own process group, log
  files, a stdin file for its task, rows and events in SQLite.
- bare: a `subprocess.Popen` loop in this process keeping the same number of the same children
  alive (each in its own session, output to /dev/null), reaped with `os.wait()`.
Reported: the median of REPEATS wall times each, their ratio (target <= 1.3x for a realistic
child), the cost per child, and the node's peak RSS (VmHWM) over the whole benchmark.
It never asserts: benchmarks report, tests judge.
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, markdown_table
from subagents_node.client.client import Client, connect
from subagents_node.messages.supervisor import AgentPlan, Launch, TaskItem

CHILDREN = 200
CONCURRENCIES = (1, 8)
REPEATS = 3
COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "/bin/true": ["/bin/true"],
}


@dataclass(frozen=True)
class Row:
    command: str
    concurrency: int
    node_s: float
    bare_s: float

    @property
    def ratio(self) -> float:
        return self.node_s / self.bare_s

    @property
    def overhead_ms(self) -> float:
        """What the node adds per child (its share of the wall time difference)."""
        return (self.node_s - self.bare_s) / CHILDREN * 1000


@contextlib.contextmanager
def node_process() -> Iterator[tuple[Client, int]]:
    """A detached node on a fresh short state dir: a connected client and the node's pid."""
    from subagents_node.client.paths import read_pid_file
    from subagents_node.node.daemon import stop_node

    state_dir = Path(tempfile.mkdtemp(prefix="sa-bench-", dir="/tmp"))
    cli = [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir)]
    try:
        subprocess.run([*cli, "start", "--detach"], check=True, cwd=REPO, capture_output=True)
        record = read_pid_file(state_dir)
        if record is None:
            raise RuntimeError(f"the bench node did not start; see {state_dir}/node.log")
        client = connect(str(record["address"]), timeout=60.0)
        try:
            yield client, int(str(record["pid"]))
        finally:
            client.close()
            stop_node(state_dir)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def peak_rss_bytes(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM), exact rather than sampled."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def through_node(client: Client, argv: Sequence[str], count: int, concurrency: int) -> float:
    agent = AgentPlan(name="trivial", command=list(argv), task_delivery="stdin")
    launch = Launch(
        session_id="bench-spawn",
        mode="parallel",
        background=False,
        items=[TaskItem(agent=agent, task=f"child {i}") for i in range(count)],
        concurrency=concurrency,
        spawns_per_run=count,  # the default fan-out budget (64) would refuse the batch
        cwd=str(REPO),
        env=dict(os.environ),
    )
    started = time.perf_counter()
    run = client.runs.launch(launch)
    done = client.runs.wait(run.run_id, timeout=600)
    elapsed = time.perf_counter() - started
    if done.state != "complete":
        raise RuntimeError(f"bench run {done.run_id} ended {done.state}: {done.error}")
    return elapsed


def bare_popen(argv: Sequence[str], count: int, concurrency: int) -> float:
    started = time.perf_counter()
    alive: set[int] = set()
    launched = 0
    while launched < count or alive:
        while launched < count and len(alive) < concurrency:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            alive.add(proc.pid)
            proc.returncode = 0  # reaped below with os.wait(): Popen must not wait for it again
            launched += 1
        pid, _ = os.wait()
        alive.discard(pid)
    return time.perf_counter() - started


def measure() -> tuple[list[Row], int]:
    rows = []
    with node_process() as (client, node_pid):
        for argv in COMMANDS.values():  # warm both paths (imports, page cache, the store)
            through_node(client, argv, 10, 4)
            bare_popen(argv, 10, 4)
        for name, argv in COMMANDS.items():
            for concurrency in CONCURRENCIES:
                node_times, bare_times = [], []
                for _ in range(REPEATS):  # interleaved, so drift hits both sides alike
                    node_times.append(through_node(client, argv, CHILDREN, concurrency))
                    bare_times.append(bare_popen(argv, CHILDREN, concurrency))
                rows.append(
                    Row(
                        name,
                        concurrency,
                        statistics.median(node_times),
                        statistics.median(bare_times),
                    )
                )
        peak = peak_rss_bytes(node_pid)
    return rows, peak


def main() -> str:
    rows, peak = measure()
    table = markdown_table(
        ["child", "concurrency", "node (s)", "bare Popen (s)", "ratio", "node ms/child extra"],
        [
            (r.command, r.concurrency, r.node_s, r.bare_s, f"{r.ratio:.2f}x", r.overhead_ms)
            for r in rows
        ],
    )
    return (
        f"## Spawn overhead: {CHILDREN} trivial children through the supervisor vs bare Popen\n\n"
        f"One parallel run of {CHILDREN} tasks per measurement (median of {REPEATS}), sent to a "
        "real node process over ipc and timed until the run is settled (every child's proof "
        "committed); beside a bare `subprocess.Popen` loop with the same concurrency. "
        "Target: ratio <= 1.3x.\n\n"
        f"{table}\n\nNode peak RSS (VmHWM) over the benchmark: {peak / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    print(main())
