"""History: everyday commands against a state dir that keeps a month of runs, beside a fresh one.

- Seed: a real node (`start --detach`) runs SEED_ROUNDS rounds of short background runs in 7
  sessions (a `/bin/true` single, a `/bin/false` single, a parallel run of 4, a chain of 3), then
  stops. Fresh: a copy of that state dir. History: another copy whose rows are copied in SQL
  (runs.db: runs, run_children, run_events, children; fanout.db: budgets and claims) to about
  HISTORY_RUNS runs (`$BENCH_HISTORY_RUNS`, default 20,000), their times spread over the last 25
  days (inside the default 30-day retention), ids fresh and the same in both databases, each
  run with its directory. Launching that many runs would take hours; copying rows, seconds.
- On each: `start --detach` twice (the first start of History also migrates its store), then
  the median of 3 of `status`, `runs`, `runs --session S --active`, `show PREFIX` (6
  characters), `logs RUN`, `prune --dry-run`, and the live `fleet` view's catch-up (listing,
  then following `runs.watch_all` until it has the node's last event).
It never asserts: benchmarks report, tests judge.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import REPO, markdown_table

HISTORY_RUNS = int(os.environ.get("BENCH_HISTORY_RUNS", "20000"))
SEED_ROUNDS = 5
REPEATS = 3
SPAN_S = 25 * 86_400.0
_HEX = "0123456789abcdef"


def _cli(state: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "subagents_node", "--state-dir", str(state), *args],
        check=True,
        capture_output=True,
        cwd=REPO,
        env={**os.environ, "SUBAGENTS_SESSION": "sess-0"},
    )
    return time.perf_counter() - started


def seed(state: Path) -> None:
    from subagents_node.client.client import connect
    from subagents_node.client.paths import read_pid_file
    from subagents_node.messages.supervisor import AgentPlan, ChainStep, Launch, TaskItem

    _cli(state, "start", "--detach")
    record = read_pid_file(state)
    assert record is not None
    client = connect(str(record["address"]), timeout=60.0)

    def item(argv: list[str]) -> TaskItem:
        return TaskItem(agent=AgentPlan(name="h", command=argv, task_delivery="stdin"), task="x")

    ok, failing = item(["/bin/true"]), item(["/bin/false"])
    shapes = [
        {"mode": "single", "items": [ok]},
        {"mode": "single", "items": [failing]},
        {"mode": "parallel", "items": [ok] * 4},
        {"mode": "chain", "chain": [ChainStep(items=[ok])] * 3},
    ]
    launched = []
    for n in range(SEED_ROUNDS * 7):
        for shape in shapes:
            launch = Launch(session_id=f"sess-{n % 7}", background=True, cwd="/tmp", **shape)
            launched.append(client.runs.launch(launch).run_id)
    for run_id in launched:
        client.runs.wait(run_id, timeout=120)
    client.close()
    _cli(state, "stop")


def _fresh_id(old: str) -> str:
    return "".join(secrets.choice(_HEX) if c in _HEX else c for c in old)


def multiply(state: Path, copies: int) -> None:
    """`copies` copies of every run tree's rows, ids fresh, times shifted back."""
    step = SPAN_S / copies
    runs = sqlite3.connect(state / "runs.db")
    olds = {r[0] for q in ("run_id", "root_run_id") for r in runs.execute(f"SELECT {q} FROM runs")}
    runs.close()
    fanout = sqlite3.connect(state / "fanout.db")
    olds |= {r[0] for r in fanout.execute("SELECT budget_id FROM fanout_budgets")}
    fanout.close()
    idmap = [(old, k, _fresh_id(old)) for old in olds for k in range(1, copies + 1)]

    def mapped(column: str) -> str:
        return f"(SELECT n FROM idmap WHERE o = {column} AND k = kk.k)"

    def child(column: str) -> str:  # a child id is its run id, a dash and its index
        return f"{mapped('t.run_id')} || substr({column}, length(t.run_id) + 1)"

    def shifted(*columns: str) -> dict[str, str | None]:
        return {c: f"{c} - kk.k * {step}" for c in columns}

    plans: dict[str, dict[str, dict[str, str | None]]] = {
        "runs.db": {
            "runs": {
                **{c: mapped(c) for c in ("run_id", "root_run_id")},
                "run_dir": f"'{state}/runs/' || {mapped('run_id')}",
                **shifted("created_at", "started_at", "ended_at", "deadline_at"),
            },
            "run_children": {
                "run_id": mapped("run_id"),
                "child_id": child("child_id"),
                **shifted("started_at", "ended_at"),
            },
            "run_events": {"seq": None, "run_id": mapped("run_id"), **shifted("ts")},
            "children": {
                "run_id": mapped("run_id"),
                "child_id": child("child_id"),
                **shifted("started_at", "ended_at"),
            },
        },
        "fanout.db": {
            "fanout_budgets": {
                "budget_id": mapped("budget_id"),
                "root_run_id": mapped("root_run_id"),
                **shifted("created_at"),
            },
            "fanout_claims": {"budget_id": mapped("budget_id"), **shifted("claimed_at")},
        },
    }
    for name, tables in plans.items():
        db = sqlite3.connect(state / name)
        db.execute("CREATE TEMP TABLE kk(k INTEGER PRIMARY KEY)")
        db.executemany("INSERT INTO kk VALUES (?)", [(k,) for k in range(1, copies + 1)])
        db.execute("CREATE TEMP TABLE idmap(o TEXT, k INTEGER, n TEXT, PRIMARY KEY (o, k))")
        db.executemany("INSERT INTO idmap VALUES (?, ?, ?)", idmap)
        for table, over in tables.items():
            columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            kept = [c for c in columns if over.get(c, c) is not None]
            values = ", ".join(str(over.get(c, c)) for c in kept)
            db.execute(
                f"INSERT INTO {table} ({', '.join(kept)}) SELECT {values} "
                f"FROM (SELECT * FROM {table}) AS t, kk ORDER BY kk.k DESC"
            )
        db.commit()
        if name == "runs.db":
            for run_dir, ended in db.execute("SELECT run_dir, created_at FROM runs"):
                directory = Path(run_dir)
                if not directory.exists():
                    directory.mkdir(parents=True)
                    os.utime(directory, (ended, ended))
        db.close()


def fleet_catch_up(state: Path) -> float:
    """Seconds the live fleet view takes to have the node's last event."""
    from subagents_node.cli.fleet import FleetState, poll
    from subagents_node.client.paths import read_pid_file

    record = read_pid_file(state)
    assert record is not None
    db = sqlite3.connect(state / "runs.db")
    target = int(db.execute("SELECT MAX(seq) FROM run_events").fetchone()[0] or 0)
    db.close()
    view, stop = FleetState(), threading.Event()
    started = time.perf_counter()
    follower = threading.Thread(target=poll, args=(str(record["address"]), "", view, stop))
    follower.start()
    try:
        while view.last_seq.get("", -1) < target and time.perf_counter() - started < 600:
            view.changed.wait(0.05)
            view.changed.clear()
        return time.perf_counter() - started
    finally:
        stop.set()
        follower.join(timeout=30)


def measure(state: Path) -> dict[str, str]:
    db = sqlite3.connect(state / "runs.db")
    (count,) = db.execute("SELECT COUNT(*) FROM runs").fetchone()
    (run_id,) = db.execute(
        "SELECT run_id FROM runs WHERE mode = 'parallel' ORDER BY created_at DESC LIMIT 1"
    ).fetchone()
    db.close()
    row: dict[str, str] = {"runs kept": f"{count:,}"}
    row["start (1st)"] = f"{_cli(state, 'start', '--detach'):.2f}"
    _cli(state, "stop")
    row["start"] = f"{_cli(state, 'start', '--detach'):.2f}"
    try:
        for name, args in (
            ("status", ("status",)),
            ("runs", ("runs",)),
            ("runs --session --active", ("runs", "--session", "sess-0", "--active")),
            ("show PREFIX", ("show", run_id[:6])),
            ("logs RUN", ("logs", run_id)),
            ("prune --dry-run", ("prune", "--dry-run")),
        ):
            row[name] = f"{statistics.median(_cli(state, *args) for _ in range(REPEATS)):.2f}"
        row["fleet catch-up"] = f"{fleet_catch_up(state):.2f}"
    finally:
        _cli(state, "stop")
    return row


def main() -> str:
    root = Path(tempfile.mkdtemp(prefix="sa-hist-", dir="/tmp"))
    try:
        base = root / "seed"
        base.mkdir()
        seed(base)
        fresh, history = root / "fresh", root / "history"
        shutil.copytree(base, fresh, symlinks=True)
        shutil.copytree(base, history, symlinks=True)
        (seeded,) = sqlite3.connect(base / "runs.db").execute("SELECT COUNT(*) FROM runs")
        multiply(history, max(1, HISTORY_RUNS // int(seeded[0]) - 1))
        rows = [measure(fresh), measure(history)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    columns = list(rows[0])
    table = markdown_table(columns, [[r[c] for c in columns] for r in rows])
    return (
        "## History: everyday commands with a month of runs kept\n\n"
        "Seconds (wall, CLI process included; medians of 3), a fresh state dir beside one "
        "whose rows were copied to a month of history.\n\n" + table
    )


if __name__ == "__main__":
    print(main())
