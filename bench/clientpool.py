"""A fixed set of spawned client processes, reused across measurements, that count outcomes.

Owns its worker processes, their pipes and one barrier per client count. The measuring
protocol is `bench.common.measure`'s (each client builds its call with a `ClientFactory`, warms
up, meets the others at a barrier, times `count` sequential requests and sends its latencies
home; the result is a `common.Measurement`), except that:
- the processes are spawned once: a benchmark of ~30 measurements would otherwise spend more of
  a 2-core machine on starting interpreters than on the requests it measures;
- a request that raises does not end the measurement: it is timed and counted as an error
  (the first one's repr is kept), and a call that returns `REJECTED` counts as a limit
  rejection, so "zero errors other than limit rejections" can be reported, not just assumed;
- each client reports the CPU time its process spent over the timed requests.
It never starts a server or a node, and never judges a result.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.synchronize import Barrier
from types import TracebackType
from typing import cast

from bench.common import ClientFactory, ClientResult, Measurement

#: What a call returns when the ledger refused it for its limit (not an error).
REJECTED = "rejected"


@dataclass(frozen=True)
class Outcomes:
    rejected: int = 0
    errors: int = 0
    first_error: str = ""

    def __add__(self, other: Outcomes) -> Outcomes:
        return Outcomes(
            self.rejected + other.rejected,
            self.errors + other.errors,
            self.first_error or other.first_error,
        )


@dataclass(frozen=True)
class Run:
    measurement: Measurement
    outcomes: Outcomes
    #: CPU time the client processes spent over their timed requests (all their threads).
    client_cpu_s: float = 0.0


@dataclass(frozen=True)
class _Job:
    factory: ClientFactory
    address: str
    clients: int
    warmup: int
    count: int


def _run_job(job: _Job, barrier: Barrier) -> tuple[ClientResult, Outcomes, float]:
    call, close = job.factory(job.address)
    try:
        clock = time.perf_counter
        latencies = [0.0] * (job.warmup + job.count)
        rejected = errors = 0
        first_error = ""
        started = cpu_started = 0.0
        # Warm-up requests are counted too (an error is an error), but neither timed nor kept.
        for i in range(job.warmup + job.count):
            if i == job.warmup:
                barrier.wait(60)
                started = time.monotonic()
                cpu_started = time.process_time()
            t0 = clock()
            try:
                outcome = call()
            except Exception as exc:
                outcome = None
                errors += 1
                first_error = first_error or repr(exc)
            latencies[i] = clock() - t0
            if outcome is REJECTED:
                rejected += 1
        finished = time.monotonic()
        cpu = time.process_time() - cpu_started
        timed = latencies[job.warmup :]
        outcomes = Outcomes(rejected, errors, first_error)
        return ClientResult(timed, started, finished), outcomes, cpu
    finally:
        close()


def _worker(conn: Connection, barriers: dict[int, Barrier]) -> None:
    while True:
        job: _Job | None = conn.recv()
        if job is None:
            return
        barrier = barriers[job.clients]
        try:
            conn.send(_run_job(job, barrier))
        except Exception as exc:  # reported, so the parent does not wait for a result forever
            barrier.abort()
            conn.send(f"client failed: {exc!r}")


class ClientPool:
    """`size` client processes; `measure(..., clients=n)` uses the first n of them."""

    def __init__(self, size: int, client_counts: Iterable[int]) -> None:
        spawn = multiprocessing.get_context("spawn")
        self._barriers = {n: spawn.Barrier(n) for n in set(client_counts)}
        if max(self._barriers) > size:
            raise ValueError(f"a pool of {size} cannot run {max(self._barriers)} clients")
        self._conns: list[Connection] = []
        self._procs = []
        for _ in range(size):
            here, there = spawn.Pipe()
            proc = spawn.Process(target=_worker, args=(there, self._barriers), daemon=True)
            proc.start()
            there.close()
            self._conns.append(here)
            self._procs.append(proc)

    def measure(
        self,
        name: str,
        factory: ClientFactory,
        address: str,
        clients: int,
        count: int,
        warmup: int = 50,
        timeout_s: float = 120.0,
    ) -> Run:
        if count < 1:
            raise ValueError("a measurement needs at least one timed request per client")
        job = _Job(factory, address, clients, warmup, count)
        conns = self._conns[:clients]
        for conn in conns:
            conn.send(job)
        deadline = time.monotonic() + timeout_s
        results: list[ClientResult] = []
        outcomes = Outcomes()
        cpu = 0.0
        failures: list[str] = []
        waiting = list(conns)
        while waiting:
            ready = wait(waiting, max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"{name}: {len(waiting)} clients did not finish in time")
            for ready_conn in ready:
                conn = cast(Connection, ready_conn)  # wait() returns what it was given
                waiting.remove(conn)
                item = conn.recv()
                if isinstance(item, str):
                    failures.append(item)
                else:
                    results.append(item[0])
                    outcomes += item[1]
                    cpu += item[2]
        if failures:
            self._barriers[clients].reset()
            raise RuntimeError(f"{name}: {failures[0]}")
        return Run(Measurement(name, clients, results), outcomes, cpu)

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
