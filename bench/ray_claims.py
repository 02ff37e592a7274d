"""Claims against a Ray actor, beside ours, in the same run (optional: the `ray` extra).

The same workload as bench/claims.py's headline row: 8 client processes, each sending
single-path claims one at a time to one owner. Ours goes through a real node process and
commits every claim to SQLite before it answers; the Ray actor keeps its counter in memory
(nothing is durable), so this compares the messaging and serialization cost of the two actor
runtimes, with ours carrying its durability on top. Skipped when Ray is not installed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from bench.common import Measurement, detached_node, markdown_table, measure

CLIENTS = 8
COUNT = 400
LIMIT = 10_000_000

Call = Callable[[], object]
Closer = Callable[[], None]


class RayBudget:
    """The fan-out budget as a Ray actor: all-or-nothing batches against a limit, in memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.claims: list[str] = []

    def claim(self, paths: list[str]) -> tuple[int, int]:
        if len(paths) > self.limit - self.used:
            raise ValueError(f"limit reached ({self.used}/{self.limit})")
        self.claims.extend(paths)
        self.used += len(paths)
        return self.used, self.limit


def _ours(descriptor: str, address: str) -> tuple[Call, Closer]:
    from subagents_node.client.client import connect

    client = connect(address)
    return (lambda: client.fanout.claim(descriptor, ["x"])), client.close


def _ray(gcs_address: str) -> tuple[Call, Closer]:
    import ray

    ray.init(
        address=gcs_address, namespace="bench", log_to_driver=False, logging_level=logging.ERROR
    )
    budget = ray.get_actor("budget")
    return (lambda: ray.get(budget.claim.remote(["x"]))), ray.shutdown


def _row(m: Measurement, floor: Measurement | None) -> list[object]:
    ratio = f"{m.throughput / floor.throughput:.2f}x" if floor else "1.00x"
    return [
        m.name,
        m.clients,
        m.requests,
        f"{m.throughput:,.0f}",
        f"{m.percentile_us(50):,.0f}",
        f"{m.percentile_us(99):,.0f}",
        ratio,
    ]


def main() -> str:
    title = "## Claims: ours vs a Ray actor (8 client processes, single-path claims)"
    try:
        import ray
    except ImportError:
        return f"{title}\n\nSkipped: Ray is not installed (`pip install -e '.[ray]'`)."

    from subagents_node.client.client import connect
    from subagents_node.messages.fanout import encode_descriptor

    with detached_node() as address:
        with connect(address) as client:
            descriptor = client.fanout.create(root_run_id="bench-ray", limit=LIMIT)
        factory = functools.partial(_ours, encode_descriptor(descriptor))
        ours = measure("ours (node, commit before reply)", factory, address, CLIENTS, COUNT)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="bench",
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    try:
        actor: Any = ray.remote(RayBudget).options(name="budget").remote(LIMIT)
        ray.get(actor.claim.remote([]))
        gcs = ray.get_runtime_context().gcs_address
        theirs = measure("Ray actor (in memory)", _ray, gcs, CLIENTS, COUNT, warmup=50)
    finally:
        ray.shutdown()
    table = markdown_table(
        ["path", "client procs", "requests", "req/s", "p50 µs", "p99 µs", "ours ÷ Ray"],
        [_row(theirs, None), _row(ours, theirs)],
    )
    return (
        f"{title}\n\nRay {ray.__version__}, `num_cpus=2`. The Ray actor does not persist its "
        "claims; ours commits them before answering.\n\n" + table
    )
