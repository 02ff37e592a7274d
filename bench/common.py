"""Shared bench machinery: client processes, latencies, percentiles, machine facts, tables.

Owns the measuring protocol every benchmark uses: N spawned client processes each warm up,
meet at a barrier, run a fixed number of requests timing each one, and send their latencies
home; throughput is the total over the span from the first start to the last finish. It never
starts or stops a node itself (see `detached_node`) and never asserts anything: benchmarks
report, tests judge.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import zmq

#: One timed request: a callable made once per process by a `ClientFactory`.
Call = Callable[[], object]
#: Builds, inside the client process, the call to time and a closer; must be module-level.
ClientFactory = Callable[[str], tuple[Call, Callable[[], None]]]

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ClientResult:
    latencies: list[float]  # seconds, one per timed request
    started: float  # time.monotonic(): CLOCK_MONOTONIC is system-wide on Linux
    finished: float


@dataclass(frozen=True)
class Measurement:
    name: str
    clients: int
    results: list[ClientResult]

    @property
    def requests(self) -> int:
        return sum(len(r.latencies) for r in self.results)

    @property
    def span_s(self) -> float:
        return max(r.finished for r in self.results) - min(r.started for r in self.results)

    @property
    def throughput(self) -> float:
        return self.requests / self.span_s if self.span_s > 0 else 0.0

    def percentile_us(self, p: float) -> float:
        return percentile(sorted(x for r in self.results for x in r.latencies), p) * 1e6


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (p in 0..100)."""
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _client_process(
    factory: ClientFactory,
    address: str,
    warmup: int,
    count: int,
    barrier: Barrier,
    results: Queue[ClientResult | str],
) -> None:
    try:
        call, close = factory(address)
    except Exception as exc:  # reported, so the parent does not wait for a result forever
        barrier.abort()
        results.put(f"client failed to start: {exc!r}")
        return
    try:
        for _ in range(warmup):
            call()
        barrier.wait(60)
        clock = time.perf_counter
        latencies = [0.0] * count
        started = time.monotonic()
        for i in range(count):
            t0 = clock()
            call()
            latencies[i] = clock() - t0
        results.put(ClientResult(latencies, started, time.monotonic()))
    except Exception as exc:
        barrier.abort()
        results.put(f"client failed: {exc!r}")
    finally:
        close()


def measure(
    name: str,
    factory: ClientFactory,
    address: str,
    clients: int,
    count: int,
    warmup: int = 200,
    timeout_s: float = 120.0,
) -> Measurement:
    """Run `clients` spawned processes, each timing `count` sequential requests."""
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(clients)
    results: Queue[ClientResult | str] = spawn.Queue()
    procs = [
        spawn.Process(
            target=_client_process, args=(factory, address, warmup, count, barrier, results)
        )
        for _ in range(clients)
    ]
    for proc in procs:
        proc.start()
    collected: list[ClientResult] = []
    try:
        for _ in procs:
            item = results.get(timeout=timeout_s)
            if isinstance(item, str):
                raise RuntimeError(f"{name}: {item}")
            collected.append(item)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return Measurement(name, clients, collected)


@contextlib.contextmanager
def detached_node(*start_args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A real node process (`start --detach`) on a fresh short state dir; yields its address.
    `env` is the start command's environment (default: this process's)."""
    from subagents_node.client.paths import read_pid_file
    from subagents_node.node.daemon import stop_node

    state_dir = Path(tempfile.mkdtemp(prefix="sa-bench-", dir="/tmp"))
    cli = [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir)]
    subprocess.run(
        [*cli, "start", "--detach", *start_args],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    try:
        record = read_pid_file(state_dir)
        if record is None:
            raise RuntimeError(f"the bench node did not start; see {state_dir}/node.log")
        yield str(record["address"])
    finally:
        stop_node(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def machine_facts() -> dict[str, str]:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": str(os.cpu_count()),
        "cpu model": model,
        "load average (1/5/15 min)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "pyzmq / libzmq": f"{zmq.__version__} / {zmq.zmq_version()}",
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"
        return str(value)

    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(" --- " for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
