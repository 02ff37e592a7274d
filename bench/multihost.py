"""Multi-host: a home node and 3 workers, one network namespace each (issue 13's "Measured").

The nodes are started through the real CLI (`bench.multihost_fleet`) inside the hosts of a
`tests.support.netns` fabric, so every worker reaches the home over a real tcp connection with
CURVE, across a bridge; this process reaches each node through its ipc socket (a file). In one
run, each figure beside the baseline measured in the same run:

1. Admission latency: one admission is a capacity acquire + rollback pair (two requests,
   timed together) of one session (limit ADMISSION_LIMIT), sent by a client on a worker
   through that worker's own ipc socket (forwarded to the home over tcp + CURVE: the path a
   worker's run takes) vs by a client on the home through the home's ipc socket (local). In
   ROUNDS rounds of PAIRS, the two sides taken in turn (the first side alternating, and the
   worker rotating over the three), so that the shared machine's load drift falls on both.
   The paths differ in hops, not only in the wire: on the home a client's DEALER reaches the
   capacity owner's socket directly (the node process is not on the path), while a worker's
   `capacity.sock` is served by the worker node, whose forwarder sends it over its CURVE link
   to the home's tcp gateway, whose forwarder hands it to the capacity owner.
2. Home CPU per admission: user + sys CPU of the home node and every process under it
   (owner processes, the shim template), over the same timed blocks, per admission; and the
   forwarding worker's own CPU per admission. The home's heartbeat traffic (3 workers every
   HEARTBEAT_S) falls into both sides' blocks and is not subtracted.
3. CHILDREN concurrent `sleeper` children (examples/agents/sleeper.md, `seconds=SLEEP_S`) in
   one session: RUNS background parallel runs of RUN_SIZE, spread round-robin over the
   workers, plus one more launch, all sent at once; the session's capacity limit is RUNS and
   its spawn budget CHILDREN, so exactly one launch must be refused and both ledgers must end
   exactly full. Timed from the first launch until the last launch is answered (a launch is
   answered once its children's shims all reported their pid) and until every run is
   terminal; the home's memory is sampled every SAMPLE_S over the phase. Baseline: the same
   CHILDREN sleepers from a bare `subprocess.Popen` loop (bench.scale.bare).
4. Time to detect a lost worker: each worker's node process is killed (SIGKILL) in turn and
   the home's `node.members.list` is asked every POLL_S until it shows that worker
   `unreachable`, beside the configured heartbeat timeout.

Sizes come from `$BENCH_MULTIHOST_CHILDREN` (default 1000) and `$BENCH_MULTIHOST_ROUNDS`
(default 10), so a development run can be small. Without network namespaces (not root, no
`ip`) it reports why it was skipped. It owns the fabric, the nodes and their state dirs for
the length of `main()` and tears them down on every exit; it reports and never asserts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import psutil

from bench.common import REPO, markdown_table, percentile
from bench.multihost_fleet import Fleet, NodeHandle, fleet
from bench.scale import bare
from subagents_node.client.client import Client
from subagents_node.client.transport import ZmqTransport
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.members import MemberList, MemberListing
from subagents_node.messages.supervisor import Launch, RunView, TaskItem
from tests.support import netns

WORKERS = ("w1", "w2", "w3")
HEARTBEAT_S = 0.5
HEARTBEAT_TIMEOUT_S = 2.0
ROUNDS = int(os.environ.get("BENCH_MULTIHOST_ROUNDS", "10"))
PAIRS = 200
WARMUP = 100
ADMISSION_LIMIT = 8
CHILDREN_WANTED = int(os.environ.get("BENCH_MULTIHOST_CHILDREN", "1000"))
#: Children per run (a run starts at most 64 at once): CHILDREN is a multiple of it.
RUN_SIZE = min(50, CHILDREN_WANTED)
RUNS = max(1, CHILDREN_WANTED // RUN_SIZE)
CHILDREN = RUNS * RUN_SIZE
#: Longer than starting them all takes, so that every child runs at the peak.
SLEEP_S = float(os.environ.get("BENCH_MULTIHOST_SLEEP_S", "60"))
SAMPLE_S = 0.25
POLL_S = 0.02
LAUNCH_TIMEOUT_S = 300.0
SLEEPER = REPO / "examples" / "agents" / "sleeper.py"
_PAGE = os.sysconf("SC_PAGE_SIZE")


# -- measuring the home -------------------------------------------------------------------------


def cpu_s(processes: list[psutil.Process]) -> float:
    total = 0.0
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            total += float(times.user + times.system)
    return total


def memory(node: NodeHandle) -> tuple[int, int, int]:
    """RSS of the node process alone, RSS summed over it and everything under it, and their
    PSS (pages the forked owners share with the node counted once over all of them)."""
    processes = node.processes()
    rss = pss = 0
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess, OSError):
            rss += int(proc.memory_info().rss)
            pss += int(proc.memory_full_info().pss)
    return int(processes[0].memory_info().rss), rss, pss


@dataclass
class Peak:
    """The largest of each `memory()` figure seen by a sampling thread."""

    node: NodeHandle
    values: tuple[int, int, int] = (0, 0, 0)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        while True:
            (node, rss, pss), (peak_node, peak_rss, peak_pss) = memory(self.node), self.values
            self.values = (max(node, peak_node), max(rss, peak_rss), max(pss, peak_pss))
            self.samples += 1
            if self._stop.wait(SAMPLE_S):
                return

    @contextlib.contextmanager
    def sampling(self) -> Iterator[Peak]:
        thread = threading.Thread(target=self._run, name="bench-peak", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()


# -- 1 and 2: admissions ------------------------------------------------------------------------


@dataclass
class Side:
    latencies: list[float] = field(default_factory=list)
    home_cpu_s: float = 0.0
    forwarder_cpu_s: float = 0.0

    def p(self, q: float) -> float:
        return percentile(sorted(self.latencies), q) * 1e6

    def home_cpu_us(self) -> float:
        return self.home_cpu_s / len(self.latencies) * 1e6

    def forwarder_cpu_us(self) -> float:
        return self.forwarder_cpu_s / len(self.latencies) * 1e6


def admissions(client: Client, session: str, tag: str, count: int) -> list[float]:
    """`count` acquire + rollback pairs, each timed (seconds)."""
    clock = time.perf_counter
    latencies = [0.0] * count
    for i in range(count):
        t0 = clock()
        handle = client.capacity.acquire(session, ADMISSION_LIMIT, f"{tag}-{i}")
        if handle is None or not handle.rollback():
            raise RuntimeError(f"admission {tag}-{i}: {handle} was not rolled back")
        latencies[i] = clock() - t0
    return latencies


def measure_admissions(crew: Fleet, clients: dict[str, Client]) -> dict[str, Side]:
    session = f"bench-mh-adm-{os.getpid()}"
    home = crew.home.processes()
    workers = {name: crew.workers[name].processes() for name in WORKERS}
    for name in ("home", *WORKERS):
        admissions(clients[name], session, f"warm-{name}", WARMUP)
    sides = {"tcp": Side(), "ipc": Side()}
    for round_ in range(ROUNDS):
        worker = WORKERS[round_ % len(WORKERS)]
        order = ("tcp", "ipc") if round_ % 2 == 0 else ("ipc", "tcp")
        for side in order:
            name = worker if side == "tcp" else "home"
            forwarder = workers[worker] if side == "tcp" else []
            home_before, fwd_before = cpu_s(home), cpu_s(forwarder)
            sides[side].latencies += admissions(clients[name], session, f"{round_}-{name}", PAIRS)
            sides[side].home_cpu_s += cpu_s(home) - home_before
            sides[side].forwarder_cpu_s += cpu_s(forwarder) - fwd_before
    return sides


# -- 3: many children over the workers ----------------------------------------------------------


@dataclass
class Launched:
    worker: str
    answered_s: float = 0.0
    view: RunView | None = None
    refusal: str = ""
    settled: RunView | None = None
    settled_s: float = 0.0


@dataclass
class Scale:
    launches: list[Launched]
    peak: Peak
    idle: tuple[int, int, int]
    capacity: tuple[int, int]
    spawns: tuple[int, int | None]
    slots_by_host: dict[str, int]
    home_cpu_s: float

    @property
    def admitted(self) -> list[Launched]:
        return [one for one in self.launches if one.view is not None]

    @property
    def refused(self) -> list[Launched]:
        return [one for one in self.launches if one.refusal]

    def started_s(self) -> float:
        return max(one.answered_s for one in self.admitted)

    def settled_s(self) -> float:
        return max(one.settled_s for one in self.admitted)

    def children(self) -> list[tuple[float, float]]:
        """(started_at, ended_at) of every child of an admitted run, from the settled views."""
        return [
            (child.started_at or 0.0, child.ended_at or 0.0)
            for one in self.admitted
            if one.settled is not None
            for child in one.settled.children
        ]

    def at_once(self) -> int:
        """Children running at the moment the last one started."""
        spans = self.children()
        last = max(start for start, _ in spans)
        return sum(1 for start, end in spans if start <= last < end)

    def states(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for one in self.admitted:
            state = one.settled.state if one.settled is not None else "unknown"
            found[state] = found.get(state, 0) + 1
        return found


def sleeper_launch(session: str) -> Launch:
    """A background parallel run of RUN_SIZE sleepers, built the way the CLI builds
    `run --async --parallel` (the session's capacity limit RUNS, spawn budget CHILDREN)."""
    overrides = {
        "max_active_async_runs_per_session": RUNS,
        "max_subagent_spawns_per_session": CHILDREN,
        "max_subagent_spawns_per_run": RUN_SIZE,
    }
    ctx = LaunchContext.from_environment(
        cwd=REPO,
        agents_dirs=[SLEEPER.parent],
        session_id=session,
        overrides=overrides,
    )
    plan = ctx.plan("sleeper")
    items = [TaskItem(agent=plan, task=f"seconds={SLEEP_S:g}") for _ in range(RUN_SIZE)]
    return ctx.launch("parallel", True, items=items, concurrency=RUN_SIZE)


def launch_one(client: Client, launch: Launch, one: Launched, began: float) -> None:
    try:
        one.view = client.runs.launch(launch)
    except SubagentsError as err:
        one.refusal = f"{type(err).__name__}: {err}"
    one.answered_s = time.monotonic() - began


def settle_one(client: Client, one: Launched, began: float) -> None:
    assert one.view is not None
    one.settled = client.runs.wait(one.view.run_id, timeout=LAUNCH_TIMEOUT_S)
    one.settled_s = time.monotonic() - began


def measure_scale(crew: Fleet, clients: dict[str, Client], home: Client) -> Scale:
    session = f"bench-mh-scale-{os.getpid()}"
    launch = sleeper_launch(session)
    launches = [Launched(WORKERS[i % len(WORKERS)]) for i in range(RUNS + 1)]
    idle = memory(crew.home)
    home_procs = crew.home.processes()
    cpu_before = cpu_s(home_procs)
    with Peak(crew.home).sampling() as peak, ThreadPoolExecutor(len(launches)) as pool:
        began = time.monotonic()
        futures = [
            pool.submit(launch_one, clients[one.worker], launch, one, began) for one in launches
        ]
        for future in futures:
            future.result()
        capacity = home.capacity.snapshot(session, RUNS)
        spawns = home.session.spawn_snapshot(session)
        slots = {h.host or "home": h.started + h.reserved for h in home.capacity.hosts().hosts}
        futures = [
            pool.submit(settle_one, clients[one.worker], one, began)
            for one in launches
            if one.view is not None
        ]
        for future in futures:
            future.result()
    return Scale(
        launches=launches,
        peak=peak,
        idle=idle,
        capacity=(capacity.used, capacity.limit),
        spawns=(spawns.used, spawns.limit),
        slots_by_host=slots,
        home_cpu_s=cpu_s(home_procs) - cpu_before,
    )


# -- 4: a lost worker ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Detection:
    worker: str
    silent_at_kill_s: float
    detected_s: float
    polls: int


def listing(home: Client) -> dict[str, tuple[str, float]]:
    nodes = home.ask(MemberList(), MemberListing).nodes
    return {view.name: (view.state, view.silent_s or 0.0) for view in nodes}


def detect_lost(crew: Fleet, home: Client, name: str) -> Detection:
    silent = listing(home)[name][1]
    os.kill(crew.workers[name].pid, signal.SIGKILL)
    killed = time.monotonic()
    polls = 0
    stop = threading.Event()
    while listing(home)[name][0] != "unreachable":
        polls += 1
        if time.monotonic() - killed > 10 * HEARTBEAT_TIMEOUT_S:
            raise RuntimeError(f"{name} still not unreachable {10 * HEARTBEAT_TIMEOUT_S} s later")
        stop.wait(POLL_S)  # a timed poll of the listing, not a wait for an event
    return Detection(name, silent, time.monotonic() - killed, polls)


# -- the report ---------------------------------------------------------------------------------


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def admissions_section(sides: dict[str, Side]) -> str:
    tcp, ipc = sides["tcp"], sides["ipc"]
    p50, p99 = tcp.p(50) / ipc.p(50), tcp.p(99) / ipc.p(99)
    cpu = tcp.home_cpu_us() / ipc.home_cpu_us()
    rows = [
        ["p50 (µs)", tcp.p(50), ipc.p(50), f"{p50:.2f}x", "≤ 2x", _met(p50 <= 2.0)],
        ["p99 (µs)", tcp.p(99), ipc.p(99), f"{p99:.2f}x", "", ""],
        ["home CPU per admission (µs)", tcp.home_cpu_us(), ipc.home_cpu_us(), f"{cpu:.2f}x",
         "≤ 1.5x", _met(cpu <= 1.5)],
        ["forwarding worker's CPU per admission (µs)", tcp.forwarder_cpu_us(), "-", "", "", ""],
    ]  # fmt: skip
    headers = ["measure", "from a worker (tcp + CURVE)", "on the home (ipc)", "ratio", "target",
               "target met"]  # fmt: skip
    return (
        f"### Admission: a capacity acquire + rollback pair ({ROUNDS * PAIRS} per side)\n\n"
        + markdown_table(headers, rows)
    )


def scale_section(scale: Scale, bare_started: float, bare_settled: float) -> str:
    mib = 1024 * 1024
    admitted, refused = scale.admitted, scale.refused
    per_worker = {
        name: sum(len(one.view.children) for one in admitted if one.worker == name and one.view)
        for name in WORKERS
    }
    started = sum(len(one.view.children) for one in admitted if one.view)
    exact = (
        len(admitted) == RUNS
        and len(refused) == 1
        and scale.capacity == (RUNS, RUNS)
        and scale.spawns == (CHILDREN, CHILDREN)
    )
    limits: list[list[object]] = [
        ["runs admitted", len(admitted), RUNS],
        ["launches refused", len(refused), 1],
        ["children started", started, CHILDREN],
        ["capacity used / limit at the peak", f"{scale.capacity[0]} / {scale.capacity[1]}",
         f"{RUNS} / {RUNS}"],
        ["spawn budget used / limit at the peak", f"{scale.spawns[0]} / {scale.spawns[1]}",
         f"{CHILDREN} / {CHILDREN}"],
        ["slots held per host (the home's `capacity.hosts`)",
         ", ".join(f"{h} {n}" for h, n in sorted(scale.slots_by_host.items())),
         "one per admitted run, on its worker"],
        ["children per worker", ", ".join(f"{w} {n}" for w, n in per_worker.items()), ""],
        ["children running at once when the last one started", scale.at_once(), CHILDREN],
        ["runs ended", ", ".join(f"{s} {n}" for s, n in sorted(scale.states().items())),
         f"complete {RUNS}"],
    ]  # fmt: skip
    times = [
        ["launch to all started", f"{scale.started_s():.2f} s", f"{bare_started:.2f} s",
         f"{scale.started_s() / bare_started:.1f}x"],
        ["launch to all settled", f"{scale.settled_s():.2f} s", f"{bare_settled:.2f} s",
         f"{scale.settled_s() / bare_settled:.2f}x"],
        [f"settled minus the {SLEEP_S:g} s sleep", f"{scale.settled_s() - SLEEP_S:.2f} s",
         f"{bare_settled - SLEEP_S:.2f} s",
         f"{(scale.settled_s() - SLEEP_S) / (bare_settled - SLEEP_S):.1f}x"],
    ]  # fmt: skip
    memory_rows = [
        ["home node process RSS", f"{scale.idle[0] / mib:.0f} MiB",
         f"{scale.peak.values[0] / mib:.0f} MiB"],
        ["home node + owner processes, RSS summed", f"{scale.idle[1] / mib:.0f} MiB",
         f"{scale.peak.values[1] / mib:.0f} MiB"],
        ["home node + owner processes, PSS", f"{scale.idle[2] / mib:.0f} MiB",
         f"{scale.peak.values[2] / mib:.0f} MiB"],
        ["home CPU per admitted run over the phase", "",
         f"{scale.home_cpu_s / max(1, len(admitted)) * 1000:.1f} ms"],
    ]  # fmt: skip
    refusals = "; ".join(f"{one.worker}: `{one.refusal}`" for one in refused) or "none"
    return (
        f"### {CHILDREN} concurrent `sleeper` children over {len(WORKERS)} workers, one session\n\n"
        f"{RUNS} background parallel runs of {RUN_SIZE} (`seconds={SLEEP_S:g}`) and one more "
        f"launch, all sent at once; capacity limit {RUNS}, spawn budget {CHILDREN}. Limits "
        f"exact to the unit: {_met(exact)}. Refused: {refusals}.\n\n"
        + markdown_table(["ledgers", "measured", "expected"], limits)
        + "\n\n"
        + markdown_table(["time", "over the workers", "bare Popen", "ratio"], times)
        + "\n\n"
        + markdown_table(
            ["home memory", "idle", f"peak ({scale.peak.samples} samples, every {SAMPLE_S} s)"],
            memory_rows,
        )
    )


def detection_section(found: list[Detection]) -> str:
    rows = [
        [one.worker, f"{one.silent_at_kill_s:.2f} s", f"{one.detected_s:.2f} s",
         f"{one.detected_s / HEARTBEAT_TIMEOUT_S:.2f}x",
         f"{(one.detected_s + one.silent_at_kill_s) / HEARTBEAT_TIMEOUT_S:.2f}x"]
        for one in found
    ]  # fmt: skip
    worst = max(one.detected_s for one in found)
    headers = ["worker", "silent at the kill", "kill to unreachable", "÷ timeout",
               "(silent + detection) ÷ timeout"]  # fmt: skip
    return (
        "### Time to detect a lost worker\n\n"
        f"Home started with `--heartbeat {HEARTBEAT_S:g} --heartbeat-timeout "
        f"{HEARTBEAT_TIMEOUT_S:g}`; each worker's node process SIGKILLed in turn, the home's "
        f"`node.members.list` asked every {POLL_S * 1000:.0f} ms until it shows `unreachable`. "
        f"A worker is unreachable once silent for the timeout, so the time from the kill is the "
        f"timeout minus how long it had been silent already. Worst: {worst:.2f} s.\n\n"
        + markdown_table(headers, rows)
    )


def _title() -> str:
    return f"## Multi-host: a home and {len(WORKERS)} workers, one network namespace each\n\n"


def main() -> str:
    reason = netns.unavailable_reason()
    if reason is not None:
        return _title() + f"Skipped: {reason}."
    began = time.monotonic()

    def done(what: str) -> None:
        print(f"  multihost: {what} at {time.monotonic() - began:.0f} s", file=sys.stderr)

    with contextlib.ExitStack() as stack:
        fabric = stack.enter_context(netns.hosts(["home", *WORKERS]))
        crew = stack.enter_context(fleet(fabric, WORKERS, HEARTBEAT_S, HEARTBEAT_TIMEOUT_S))
        clients: dict[str, Client] = {}
        for node in [crew.home, *crew.workers.values()]:
            client = Client(ZmqTransport(node.address), timeout=LAUNCH_TIMEOUT_S)
            clients[node.name] = stack.enter_context(client)
        home = clients["home"]
        done("fleet up")
        sides = measure_admissions(crew, clients)
        done("admissions")
        scale = measure_scale(crew, clients, home)
        done("scale")
        found = [detect_lost(crew, home, name) for name in reversed(WORKERS)]
        done("lost workers")
    bare_started, bare_settled = bare(
        [sys.executable, str(SLEEPER), f"seconds={SLEEP_S:g}"], CHILDREN
    )
    done("bare baseline")
    return (
        _title() + "The home and each worker in its own network namespace (`tests.support.netns`), "
        "joined by one bridge; started through the CLI (`start --home` / `--join`); the bench "
        "process is every client, through each node's ipc socket.\n\n"
        + admissions_section(sides)
        + "\n\n"
        + scale_section(scale, bare_started, bare_settled)
        + "\n\n"
        + detection_section(found)
        + f"\n\nWall time of the benchmark: {time.monotonic() - began:.0f} s."
    )


if __name__ == "__main__":
    print(main())
