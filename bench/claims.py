"""The ledgers under load: fan-out claims and capacity cycles through a real node process, beside
the original's file-lock ledgers (SPEC §17, `bench/filelock_ledger.py`) and the bare pyzmq
REQ/REP floor of `bench/roundtrip.py`, all in one run (issue 3's benchmark).

Measured:
- claims: 1, 4, 8 and 16 client processes, single-path and 4-path batches, each on a fresh
  budget whose limit leaves room for every claim made; `client.fanout.claim` over ipc against
  `FileLockFanout.claim` on one budget directory, and the echo floor at the same counts;
- per-claim cost by `used`: one client, single-path claims on budgets pre-filled to each level
  (ours through the API in large batches; the file-lock budgets by writing the claim files a
  sequence of claims leaves), one level after the other claim by claim, so that load drift on
  this shared machine hits every level alike;
- acquire + rollback cycles at 8 clients: one shared session (limit 64) and one session per
  client (limit 8), ours against `FileLockCapacity`;
- errors other than limit rejections, counted per measurement (`bench.clientpool`), and the
  CPU time one request costs the server process (node or echo server) and the clients;
- the node's cold start and idle memory (issue 11; `bench/claims_startup.py`, which
  `python -m bench.claims_startup` runs alone).
Fixed request counts throughout, so the run is bounded (about 1.5 minutes on 2 cpus). It owns
its node, echo server, client processes and scratch directories for the length of `main()`;
it reports and never asserts (the targets table says which of issue 3's targets the run met),
and it never reaches into the node: everything it measures goes through the public client.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psutil

from bench.claims_clients import (
    filelock_claims,
    filelock_claims_rotating,
    filelock_cycles,
    our_claims,
    our_claims_rotating,
    our_cycles,
)
from bench.claims_report import (
    TARGET_CLIENTS,
    Row,
    cpu_note,
    cycles_table,
    targets,
    throughput_table,
    used_table,
)
from bench.claims_startup import section as startup_section
from bench.clientpool import ClientPool, Outcomes, Run
from bench.common import ClientResult, Measurement, detached_node
from bench.filelock_ledger import FileLockFanout
from bench.roundtrip import echo_server, floor_client
from subagents_node.actors.capacity.ledger import DEFAULT_TTL_S
from subagents_node.client.client import Client, connect
from subagents_node.messages.fanout import encode_descriptor

CLIENT_COUNTS = (1, 4, 8, 16)
BATCHES = (1, 4)
#: Timed requests per client process, by client count (roughly equal wall time per row).
OUR_COUNTS = {1: 1500, 4: 600, 8: 350, 16: 180}
FLOOR_COUNTS = {1: 4000, 4: 2000, 8: 1500, 16: 800}
#: The file-lock ledger by (client procs, paths per claim): its synchronous back-off makes
#: contended rows slow (a waiter can sleep up to 7.9 s), so those get few requests.
FILELOCK_COUNTS = {
    (1, 1): 300,
    (1, 4): 100,
    (4, 1): 60,
    (4, 4): 20,
    (8, 1): 60,
    (8, 4): 6,
    (16, 1): 6,
    (16, 4): 2,
}
WARMUP = {"ours": 30, "floor": 100, "file-lock": 3}
USED_LEVELS = (0, 1_000, 5_000, 10_000)
#: Claims per level, made in turn across the levels; the file-lock ones cost up to ~60 ms each.
USED_PER_LEVEL = {"ours": 400, "file-lock": 8}
USED_WARMUP_ROUNDS = 5
FILL_BATCH = 1_000
CYCLE_CLIENTS = TARGET_CLIENTS
CYCLE_COUNTS = {"ours": 250, "file-lock": 100}
SESSIONS = {"one shared session, limit 64": ("bench-shared", 64), "a session per client": ("", 8)}


def _only(processes: Iterable[psutil.Process]) -> psutil.Process:
    """The one process started since a snapshot of our children (the echo server)."""
    found = list(processes)
    if len(found) != 1:
        raise RuntimeError(f"expected one new child process (the echo server), got {found}")
    return found[0]


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="sa-flock-", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- the measurements ---------------------------------------------------------------------------


def _owner_process(client: Client, name: str) -> psutil.Process:
    """The process of one of the node's owners (its pid from `status`)."""
    pid = next((a.pid for a in client.status().actors if a.name == name), None)
    if pid is None:
        raise RuntimeError(f"the bench node reports no process for its {name} owner")
    return psutil.Process(pid)


def _rss_mib(proc: psutil.Process) -> float:
    return float(proc.memory_info().rss) / 2**20


def _grants(cycles: list[tuple[str, str, Run]]) -> int:
    """The capacity grants one row of our cycles made (one per cycle, warm-ups included)."""
    ours = next(run for _, system, run in cycles if system == "ours")
    return ours.measurement.requests + WARMUP["ours"] * CYCLE_CLIENTS


def _cpu_s(proc: psutil.Process) -> float:
    """CPU of a server: for the node, the node process and its owner processes (each owner
    is its own process, DESIGN §1), so the figure is the whole server side."""
    total = 0.0
    for one in (proc, *proc.children()):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = one.cpu_times()
            total += float(times.user + times.system)
    return total


def _with_server_cpu(
    system: str, batch: int, server: psutil.Process, measure: Callable[[], Run]
) -> Row:
    before = _cpu_s(server)
    run = measure()
    return Row(system, batch, run, _cpu_s(server) - before)


def _throughput(
    pool: ClientPool,
    setup: Client,
    floor: tuple[str, psutil.Process],
    node: tuple[str, psutil.Process],
    scratch: Path,
) -> list[Row]:
    (floor_address, echo), (address, node_proc) = floor, node
    rows = []
    for clients in CLIENT_COUNTS:
        count = FLOOR_COUNTS[clients]
        measure = functools.partial(
            pool.measure, "floor", floor_client, floor_address, clients, count, WARMUP["floor"]
        )
        rows.append(_with_server_cpu("floor", 1, echo, measure))
        for batch in BATCHES:
            count = OUR_COUNTS[clients]
            needed = clients * (count + WARMUP["ours"]) * batch
            desc = setup.fanout.create(root_run_id=f"bench-{clients}x{batch}", limit=2 * needed)
            factory = functools.partial(our_claims, encode_descriptor(desc), batch)
            measure = functools.partial(
                pool.measure, "ours", factory, address, clients, count, WARMUP["ours"]
            )
            rows.append(_with_server_cpu("ours", batch, node_proc, measure))

            count = FILELOCK_COUNTS[(clients, batch)]
            budget = FileLockFanout.create(scratch / "fanout", f"bench-{clients}x{batch}", 10**6)
            factory = functools.partial(filelock_claims, batch)
            warmup = WARMUP["file-lock"]
            run = pool.measure("file-lock", factory, str(budget.root), clients, count, warmup)
            rows.append(Row("file-lock", batch, run))
    return rows


def _fill_filelock(budget: FileLockFanout, used: int) -> None:
    """The claims directory that `used` single-path claims leave behind, written directly."""
    claims = budget.root / "claims"
    for index in range(used):
        record = {"claimId": f"fill-{index}", "path": f"fill/tasks[{index}]"}
        (claims / f"{index:06d}.json").write_text(json.dumps(record))


def _used_cost(
    pool: ClientPool, setup: Client, node: str, scratch: Path
) -> dict[str, tuple[list[Measurement], Outcomes]]:
    """Single-path claim latency on budgets already at each `used` level.

    One client claims on every level's budget in turn (request i goes to level i mod 4), so
    whatever else the machine does at a given moment falls on every level alike.
    """
    levels = len(USED_LEVELS)
    room = levels * (USED_PER_LEVEL["ours"] + USED_WARMUP_ROUNDS)
    ours: list[str] = []
    theirs: list[str] = []
    for level in USED_LEVELS:
        desc = setup.fanout.create(root_run_id=f"bench-used-{level}", limit=level + room)
        for start in range(0, level, FILL_BATCH):
            size = min(FILL_BATCH, level - start)
            setup.fanout.claim(desc, [f"fill/tasks[{start + i}]" for i in range(size)])
        ours.append(encode_descriptor(desc))
        budget = FileLockFanout.create(scratch / "used", f"bench-used-{level}", 10**6)
        _fill_filelock(budget, level)
        theirs.append(str(budget.root))
    jobs = {
        "ours": (functools.partial(our_claims_rotating, tuple(ours)), node),
        "file-lock": (functools.partial(filelock_claims_rotating, tuple(theirs)), ""),
    }
    by_system = {}
    for system, (factory, address) in jobs.items():
        count = levels * USED_PER_LEVEL[system]
        warmup = levels * (USED_WARMUP_ROUNDS if system == "ours" else 0)
        run = pool.measure(system, factory, address, 1, count, warmup)
        (result,) = run.measurement.results
        per_level = [
            Measurement(system, 1, [ClientResult(result.latencies[i::levels], 0.0, 0.0)])
            for i in range(levels)
        ]
        by_system[system] = (per_level, run.outcomes)
    return by_system


def _cycles(
    pool: ClientPool, node: str, scratch: Path, sample: Callable[[], None]
) -> list[tuple[str, str, Run]]:
    """Each session layout's cycles, ours then the file-lock's; `sample()` after each of ours
    (the capacity owner's RSS)."""
    rows = []
    for label, (session, limit) in SESSIONS.items():
        factory = functools.partial(our_cycles, session, limit)
        count = CYCLE_COUNTS["ours"]
        run = pool.measure("ours", factory, node, CYCLE_CLIENTS, count, WARMUP["ours"])
        sample()
        rows.append((label, "ours", run))
        root = scratch / f"capacity-{session or 'own'}"
        factory = functools.partial(filelock_cycles, session, limit)
        count = CYCLE_COUNTS["file-lock"]
        run = pool.measure(
            "file-lock", factory, str(root), CYCLE_CLIENTS, count, WARMUP["file-lock"]
        )
        rows.append((label, "file-lock", run))
    return rows


def main() -> str:
    loads = [os.getloadavg()]
    started = time.monotonic()

    def section_done(name: str) -> None:
        loads.append(os.getloadavg())
        elapsed = time.monotonic() - started
        print(f"  claims: {name} done at {elapsed:.0f} s", file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(_scratch())
        pool = stack.enter_context(ClientPool(max(CLIENT_COUNTS), (*CLIENT_COUNTS, CYCLE_CLIENTS)))
        children = {child.pid for child in psutil.Process().children()}
        floor = stack.enter_context(echo_server())
        echo = _only(child for child in psutil.Process().children() if child.pid not in children)
        node = stack.enter_context(detached_node())
        setup = stack.enter_context(connect(node, timeout=60.0))
        node_proc = psutil.Process(setup.status().pid)
        rows = _throughput(pool, setup, (floor, echo), (node, node_proc), scratch)
        section_done("throughput")
        used = _used_cost(pool, setup, node, scratch)
        section_done("per-claim cost by used")
        capacity = _owner_process(setup, "capacity")
        rss = [_rss_mib(capacity)]

        def sample() -> None:
            rss.append(_rss_mib(capacity))

        cycles = _cycles(pool, node, scratch, sample)
        section_done("acquire + rollback")
    startup, _, _ = startup_section()
    section_done("cold start and idle memory")
    ours = [r.run.outcomes for r in rows if r.system == "ours"] + [used["ours"][1]]
    ours += [run.outcomes for _, system, run in cycles if system == "ours"]
    our_errors = sum(outcomes.errors for outcomes in ours)
    first_error = next((outcomes.first_error for outcomes in ours if outcomes.errors), "")
    used_text, growth = used_table(used, USED_LEVELS)
    cycles_text, cycle_ratios = cycles_table(cycles)
    load_text = " → ".join(f"{one:.2f}" for one, _, _ in loads)
    return (
        "## Claims: the ledgers through a node process (ipc) vs the file-lock ledgers\n\n"
        "Client processes send one request at a time (a claim of 1 or 4 paths, an echo, or an "
        "acquire then a rollback); latency per request, throughput over the span from the "
        "first client's start to the last one's finish. Every claims row uses a fresh budget "
        "whose limit fits every claim. The file-lock rows follow SPEC §17 (mkdir admission "
        "lock, O_EXCL claim files scanned from index 0, readdir to count) on /tmp; their "
        "contended rows have few requests (its synchronous back-off makes them slow), so their "
        "p99 rests on few samples, and a lock wait that runs out (7.9 s) counts as an error. "
        "Ratios to the floor compare requests (one claim batch vs one echo). CPU per request: "
        "the server process (node or echo server) and all client processes, over the timed "
        "requests.\n\n"
        f"1-minute load average at start → after each section: {load_text} "
        f"({os.cpu_count()} cpus; the machine is shared, so the load is not all ours).\n\n"
        f"{throughput_table(rows)}\n\n"
        f"{cpu_note(rows)}\n\n"
        "### Per-claim cost by `used` (1 client, single-path claims)\n\n"
        "One client claims on each level's budget in turn (pre-filled: ours through the API, "
        "the file-lock's by writing the claim files), "
        f"{USED_PER_LEVEL['ours']} (ours) and {USED_PER_LEVEL['file-lock']} (file-lock) "
        "claims per level.\n\n"
        f"{used_text}\n\n"
        f"### Acquire + rollback at {CYCLE_CLIENTS} client processes\n\n"
        f"{cycles_text}\n\n"
        "The capacity owner's RSS before the cycles, after our first row, after our second: "
        f"{' / '.join(f'{one:.1f}' for one in rss)} MiB ({_grants(cycles):,} grants in each "
        f"row, each with a {DEFAULT_TTL_S:g} s TTL that its rollback ends). The first row "
        "warms the owner up (its store's page cache, its allocator's arenas); what it kept "
        "per grant until the TTL ran out would show as growth in the second.\n\n"
        "### Targets\n\n"
        f"{targets(rows, BATCHES, growth, cycle_ratios, our_errors)}\n\n"
        f"{startup}\n" + (f"\nFirst error of ours: `{first_error}`\n" if first_error else "")
    )


if __name__ == "__main__":
    print(main())
