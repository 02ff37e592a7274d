"""Scale: many concurrent children through a real node, beside a bare Popen loop in the same run.

- N concurrent children (`/bin/sleep SLEEP_S`, default N = 1000, `$BENCH_SCALE_CHILDREN`):
  N / 64 parallel runs of 64 (the concurrency cap of a run), launched one after another, sent to
  a real node process (`start --detach`). Launch-to-all-started ends when the last launch call
  returns (each is answered once every child's shim reported its pid); launch-to-all-settled
  ends when `runs.wait` reports the runs terminal (every child's tree
  proven ended, rows committed). At the peak: the memory (PSS) and threads of the node's
  processes (the node and its owner processes; against the idle node), the shim template's RSS
  and threads, each shim's private memory (Private_* of /proc/PID/smaps_rollup, averaged;
  target <= 2 MiB), `ping` p50/p99 while the children run, and the node's processes' CPU
  (plus the template's) per child.
- The same N sleeps through a bare `subprocess.Popen` loop (own session, output to /dev/null),
  reaped with `os.wait()`: all started when the loop is done, all settled when all are reaped.
- 200 `/bin/true` children launched and settled, 64 at a time (a run's concurrency cap), through
  the node vs a bare Popen loop keeping 64 alive: the median of 3 of each, taken in turn; and
  the machine's busy CPU time per child over each (/proc/stat: the shims, reaped by the kernel,
  show in no process's times).
It never asserts: benchmarks report, tests judge.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, markdown_table
from bench.spawn import bare_popen, node_process
from subagents_node.actors.child.shimtemplate import TEMPLATE_MODULE
from subagents_node.client.client import Client
from subagents_node.messages.supervisor import AgentPlan, Launch, TaskItem

CHILDREN = int(os.environ.get("BENCH_SCALE_CHILDREN", "1000"))
#: Longer than launching them all takes, so that every child runs at the peak.
SLEEP_S = 20.0
TRUE_CHILDREN = 200
TRUE_REPEATS = 3
PINGS = 200
#: A run's concurrency cap (messages/supervisor.py): N children are N / 64 runs at once.
MAX_CONCURRENCY = 64
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TCK = os.sysconf("SC_CLK_TCK")


def launch_of(argv: list[str], count: int) -> Launch:
    agent = AgentPlan(name="scale", command=argv, task_delivery="argv")
    return Launch(
        session_id="bench-scale",
        mode="parallel",
        background=False,
        items=[TaskItem(agent=agent, task="") for _ in range(count)],
        concurrency=min(count, MAX_CONCURRENCY),
        spawns_per_run=count,
        cwd=str(REPO),
        env=dict(os.environ),
    )


def rss_threads(pid: int) -> tuple[int, int]:
    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    return rss, len(os.listdir(f"/proc/{pid}/task"))


def cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TCK


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        found += [int(p) for p in text.split()]
    return found


def private_bytes(pid: int) -> int | None:
    """None when the process is gone (a shim of the warm-up run exiting as it is listed)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


@dataclass
class NodeScale:
    started_s: float
    settled_s: float
    idle: tuple[int, int]
    peak: tuple[int, int]
    template: tuple[int, int]
    shim_private: float
    shims: int
    cpu_per_child_ms: float
    ping_ms: tuple[float, float]


def node_processes(node_pid: int) -> tuple[list[int], int]:
    """The node and its owner processes (DESIGN §1), and the shim template (a child of the run
    supervisor's owner process): everything the node runs but the shims themselves."""
    found, template = [node_pid], 0
    for owner in children_of(node_pid):
        found.append(owner)
        for pid in children_of(owner):
            if TEMPLATE_MODULE in _cmdline(pid):
                template = pid
    return found, template


def pss_threads(pid: int) -> tuple[int, int]:
    """Proportional set size (pages shared with the node's other processes counted once over
    all of them, not once in each: the owners are forked from the node) and threads."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    pss = next(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Pss:"))
    return pss, len(os.listdir(f"/proc/{pid}/task"))


def total(stats: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(s[0] for s in stats), sum(s[1] for s in stats)


def through_node(client: Client, node_pid: int) -> NodeScale:
    pids, _ = node_processes(node_pid)
    idle = total([pss_threads(p) for p in pids])
    before = sum(cpu_s(p) for p in pids)
    began = time.perf_counter()
    sizes = [MAX_CONCURRENCY] * (CHILDREN // MAX_CONCURRENCY)
    sizes += [CHILDREN % MAX_CONCURRENCY] if CHILDREN % MAX_CONCURRENCY else []
    runs = [client.runs.launch(launch_of(["/bin/sleep", str(SLEEP_S)], n)) for n in sizes]
    started = time.perf_counter() - began
    peak = total([pss_threads(p) for p in pids])
    pings = []
    for _ in range(PINGS):
        t = time.perf_counter()
        client.ping()
        pings.append((time.perf_counter() - t) * 1000)
    _, template = node_processes(node_pid)
    shims = children_of(template)
    private = [b for b in (private_bytes(p) for p in shims) if b is not None]
    template_cpu = cpu_s(template)
    tmpl = rss_threads(template)
    for run in runs:
        done = client.runs.wait(run.run_id, timeout=600)
        if done.state != "complete":
            raise RuntimeError(f"bench run {done.run_id} ended {done.state}: {done.error}")
    settled = time.perf_counter() - began
    cpu = sum(cpu_s(p) for p in pids) - before + template_cpu
    pings.sort()
    return NodeScale(
        started_s=started,
        settled_s=settled,
        idle=idle,
        peak=peak,
        template=tmpl,
        shim_private=statistics.mean(private) if private else 0.0,
        shims=len(private),
        cpu_per_child_ms=cpu / CHILDREN * 1000,
        ping_ms=(pings[len(pings) // 2], pings[int(len(pings) * 0.99) - 1]),
    )


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def bare(argv: list[str], count: int) -> tuple[float, float]:
    began = time.perf_counter()
    for _ in range(count):
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        proc.returncode = 0  # reaped below with os.wait()
    started = time.perf_counter() - began
    for _ in range(count):
        os.wait()
    return started, time.perf_counter() - began


def true_through_node(client: Client) -> float:
    began = time.perf_counter()
    run = client.runs.launch(launch_of(["/bin/true"], TRUE_CHILDREN))
    done = client.runs.wait(run.run_id, timeout=600)
    if done.state != "complete":
        raise RuntimeError(f"bench run {done.run_id} ended {done.state}: {done.error}")
    return time.perf_counter() - began


def machine_busy_s() -> float:
    """CPU time every cpu of the machine spent busy so far (/proc/stat: all but idle and
    iowait), in seconds. A shim is reaped by the kernel, so no process accounts for its time;
    over a run on an otherwise quiet machine, this does."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / _TCK


@dataclass(frozen=True)
class TrueChildren:
    """Medians over TRUE_REPEATS: wall time, and machine CPU per child (ms), node and bare."""

    node_s: float
    bare_s: float
    node_cpu_ms: float
    bare_cpu_ms: float


def true_interleaved(client: Client) -> TrueChildren:
    """Medians of TRUE_REPEATS node and bare runs, taken in turn: a shared machine's load
    drifts, and it must weigh on both sides alike."""
    node_s, bare_s, node_cpu, bare_cpu = [], [], [], []
    for _ in range(TRUE_REPEATS):
        busy = machine_busy_s()
        node_s.append(true_through_node(client))
        node_cpu.append((machine_busy_s() - busy) / TRUE_CHILDREN * 1000)
        busy = machine_busy_s()
        bare_s.append(bare_popen(["/bin/true"], TRUE_CHILDREN, MAX_CONCURRENCY))
        bare_cpu.append((machine_busy_s() - busy) / TRUE_CHILDREN * 1000)
    m = statistics.median
    return TrueChildren(m(node_s), m(bare_s), m(node_cpu), m(bare_cpu))


def main() -> str:
    with node_process() as (client, node_pid):
        true_through_node(client)  # warm: imports, the template, the store
        bare_popen(["/bin/true"], 20, MAX_CONCURRENCY)
        node = through_node(client, node_pid)
        true = true_interleaved(client)
    bare_started, bare_settled = bare(["/bin/sleep", str(SLEEP_S)], CHILDREN)
    mib = 1024 * 1024
    rows = [
        ["launch to all started", f"{node.started_s:.2f} s", f"{bare_started:.2f} s",
         f"{node.started_s / bare_started:.1f}x"],
        ["launch to all settled", f"{node.settled_s:.2f} s", f"{bare_settled:.2f} s",
         f"{node.settled_s / bare_settled:.2f}x"],
        [f"{TRUE_CHILDREN} /bin/true launched and settled (median of {TRUE_REPEATS})",
         f"{true.node_s:.2f} s",
         f"{true.bare_s:.2f} s", f"{true.node_s / true.bare_s:.1f}x"],
        ["/bin/true: machine CPU per child (every process and the kernel)",
         f"{true.node_cpu_ms:.2f} ms", f"{true.bare_cpu_ms:.2f} ms",
         f"{true.node_cpu_ms / true.bare_cpu_ms:.1f}x"],
    ]  # fmt: skip
    facts = [
        ["node processes' PSS idle / at the peak",
         f"{node.idle[0] / mib:.0f} / {node.peak[0] / mib:.0f} MiB"],
        ["node processes' threads idle / at the peak", f"{node.idle[1]} / {node.peak[1]}"],
        ["shim template RSS, threads", f"{node.template[0] / mib:.0f} MiB, {node.template[1]}"],
        ["shims alive at the peak", str(node.shims)],
        ["shim private memory (mean)", f"{node.shim_private / mib:.2f} MiB"],
        ["node + template CPU per child", f"{node.cpu_per_child_ms:.2f} ms"],
        [f"ping p50 / p99 ({PINGS} while they run)",
         f"{node.ping_ms[0]:.2f} / {node.ping_ms[1]:.2f} ms"],
    ]  # fmt: skip
    return (
        f"## Scale: {CHILDREN} concurrent children (`/bin/sleep {SLEEP_S:g}`) under shims\n\n"
        f"Parallel runs of {MAX_CONCURRENCY} through a detached node, beside "
        "a bare `subprocess.Popen` loop in the same run.\n\n"
        + markdown_table(["measure", "node", "bare Popen", "ratio"], rows)
        + "\n\n"
        + markdown_table(["at the peak", "value"], facts)
    )


if __name__ == "__main__":
    print(main())
