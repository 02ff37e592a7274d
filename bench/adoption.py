"""Adoption: a node that restarts while N children run takes them all back (issue 10, item 3).

N children (`/bin/sleep SLEEP_S`, N = `$BENCH_SCALE_CHILDREN`, default 1000) run in parallel
runs of 64 under a detached node. The node then goes, in one of two ways: a graceful `stop`
(the documented upgrade: the shims and their children stay), or a kill -9 of the node process
(its owners follow it: PDEATHSIG). A new `start --detach` is timed to its return, which is when
every owner is ready: the run supervisor has adopted every run and child from its store in one
transaction. Then every run is waited for, and each must end `complete` (every child's true exit
status 0 came back through its shim, none was lost with the node).

The baseline, measured in the same run: `start --detach` of the same node with nothing to adopt
(its store holds the settled runs of the warm-up). It never asserts: benchmarks report, tests
judge; a run that does not end `complete` is reported as a failure of the benchmark.
"""

from __future__ import annotations

import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from bench.common import REPO, markdown_table
from bench.scale import CHILDREN, MAX_CONCURRENCY, launch_of
from subagents_node.client.client import Client, connect
from subagents_node.client.paths import read_pid_file
from subagents_node.node.daemon import stop_node

#: Long enough that every child still runs when the new node has started.
SLEEP_S = 15.0
#: Starts with nothing to adopt (the baseline), median of these.
EMPTY_STARTS = 3
_HEADERS = [
    "the node went by",
    "start to ready",
    "start, nothing to adopt",
    "ratio",
    "runs ended complete",
]


class _Node:
    """A detached node on a fresh state dir, started and restarted through the command line."""

    def __init__(self) -> None:
        self.state_dir = Path(tempfile.mkdtemp(prefix="sa-adopt-", dir="/tmp"))
        self._cli = [sys.executable, "-m", "subagents_node", "--state-dir", str(self.state_dir)]

    def start(self) -> float:
        """`start --detach`, timed to its return (every owner ready)."""
        began = time.perf_counter()
        subprocess.run([*self._cli, "start", "--detach"], check=True, cwd=REPO, capture_output=True)
        return time.perf_counter() - began

    def client(self) -> Client:
        record = read_pid_file(self.state_dir)
        if record is None:
            raise RuntimeError(f"the bench node did not start; see {self.state_dir}/node.log")
        return connect(str(record["address"]), timeout=60.0)

    def stop(self) -> None:
        stop_node(self.state_dir)

    def kill(self) -> None:
        """kill -9 of the node process; returns once it and its owners are gone."""
        record = read_pid_file(self.state_dir)
        assert record is not None
        node = psutil.Process(int(str(record["pid"])))
        owners = node.children()
        node.send_signal(signal.SIGKILL)
        psutil.wait_procs([node, *owners], timeout=30)

    def remove(self) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)


def _restart_with_children(node: _Node, go: Callable[[_Node], None]) -> tuple[float, int, int]:
    """Launch CHILDREN sleepers, make the node go, start it again: (start s, runs that ended
    complete, runs)."""
    with node.client() as client:
        sizes = [MAX_CONCURRENCY] * (CHILDREN // MAX_CONCURRENCY)
        sizes += [CHILDREN % MAX_CONCURRENCY] if CHILDREN % MAX_CONCURRENCY else []
        runs = [client.runs.launch(launch_of(["/bin/sleep", str(SLEEP_S)], n)) for n in sizes]
    go(node)
    started_s = node.start()
    with node.client() as client:
        ended = [client.runs.wait(run.run_id, timeout=600) for run in runs]
    return started_s, sum(1 for run in ended if run.state == "complete"), len(runs)


def main() -> str:
    node = _Node()
    try:
        node.start()
        with node.client() as client:  # warm-up: imports, the template, the store
            client.runs.wait(client.runs.launch(launch_of(["/bin/true"], 8)).run_id, timeout=60)
        empty = []
        for _ in range(EMPTY_STARTS):
            node.stop()
            empty.append(node.start())
        baseline = statistics.median(empty)
        stopped = _restart_with_children(node, _Node.stop)
        killed = _restart_with_children(node, _Node.kill)
        node.stop()
    finally:
        node.remove()
    rows = [
        [way, f"{started:.2f} s", f"{baseline:.2f} s", f"{started / baseline:.1f}x",
         f"{complete} of {runs}"]
        for way, (started, complete, runs) in (
            ("`stop`, then `start --detach`", stopped),
            ("kill -9 of the node, then `start --detach`", killed),
        )
    ]  # fmt: skip
    return (
        f"## Adoption: a node restarted while {CHILDREN} children run\n\n"
        f"{CHILDREN} `/bin/sleep {SLEEP_S:g}` children in parallel runs of {MAX_CONCURRENCY} under "
        "a detached node; the node goes, a new one starts and adopts them all from its store "
        "before its `start` returns. Baseline: the same node's `start --detach` with nothing to "
        f"adopt (median of {EMPTY_STARTS}), in the same run. Every run must then end `complete` "
        "(each child's exit status 0 reported by its shim to the new node).\n\n"
        + markdown_table(_HEADERS, rows)
    )


if __name__ == "__main__":
    print(main())
