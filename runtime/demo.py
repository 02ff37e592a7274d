"""`make demo`: the main job, end to end, on an embedded node with temporary state.

1. Scouts fan out in parallel over this repository; a summarizer merges their reports (one
   chain run: a parallel step, then a step that reads the reports).
2. Capacity: the session may hold one background run. A second background launch is refused
   with the exhausted error, waits for the first run's terminal proof, and is then admitted.
3. Fan-out: a recursive agent tries to launch 3 + 9 + 27 descendants under a budget of 12 and
   is stopped by the run's fan-out budget, all or nothing per admission group.
It prints live progress and a summary (states, durations, ledgers, outputs), then stops the
node. Everything it reports comes from the node's own counters.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from subagents_node import examples
from subagents_node.cli.following import Progress
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import CapacityExhausted
from subagents_node.messages.supervisor import ChainStep, RunView, TaskItem
from subagents_node.node.node import Node

#: the demo reads the product's own code and runs the example agents shipped with it, so it works
#: the same from a clone and from an installed wheel
SCOUTED = {
    "actors": "subagents_node.actors",
    "messages": "subagents_node.messages",
    "runtime": "subagents_node",
    "examples": "subagents_node.examples",
}
AGENTS = Path(examples.__file__).resolve().parent / "agents"


def source_dir(package: str) -> Path:
    """Where an installed package's files are (the repository's folders in an editable install)."""
    module = importlib.import_module(package)
    assert module.__file__ is not None
    return Path(module.__file__).resolve().parent


LIMITS = {
    "max_active_async_runs_per_session": 1,
    "max_subagent_spawns_per_run": 12,
    "max_subagent_depth": 4,
}


def follow(client: Client, run: RunView, console: Console) -> RunView:
    progress = Progress(live=console.is_terminal)
    try:
        return client.runs.wait(run.run_id, on_event=progress.update)
    finally:
        progress.close()


def scouts_and_summary(client: Client, ctx: LaunchContext, out: Path, console: Console) -> RunView:
    console.rule("1. scouts in parallel, then a summarizer")
    scout = ctx.plan("scout")
    reports = [out / f"scout-{name}.md" for name in SCOUTED]
    step0 = ChainStep(
        parallel=True,
        items=[
            TaskItem(
                agent=scout, task=f"dir={source_dir(package)} pattern=class |def ", output=str(r)
            )
            for package, r in zip(SCOUTED.values(), reports, strict=True)
        ],
    )
    summary = TaskItem(
        agent=ctx.plan("summarizer"),
        task="\n".join(str(r) for r in reports),
        output=str(out / "summary.md"),
    )
    launch = ctx.launch("chain", background=False, chain=[step0, ChainStep(items=[summary])])
    return follow(client, client.runs.launch(launch), console)


def capacity_wait(client: Client, ctx: LaunchContext, console: Console) -> list[RunView]:
    console.rule("2. a background run waits for capacity (limit 1 per session)")
    first = client.runs.launch(ctx.single("sleeper", "seconds=2", True, None))
    console.print(f"background run {first.run_id} holds the session's only slot")
    try:
        client.runs.launch(ctx.single("sleeper", "seconds=1", True, None))
        raise SystemExit("demo: the second background launch should have been refused")
    except CapacityExhausted as err:
        console.print(f"second launch refused: [yellow]{err.message}[/]")
    done = client.runs.wait(first.run_id)  # event-driven: answered when the run settles
    console.print(f"run {first.run_id} {done.state}; its slot was released on proof")
    second = client.runs.launch(ctx.single("sleeper", "seconds=1", True, None))
    console.print(f"second launch admitted as {second.run_id}")
    return [done, client.runs.wait(second.run_id)]


def recursive_fanout(client: Client, ctx: LaunchContext, console: Console) -> RunView:
    console.rule("3. a recursive agent meets its run's fan-out budget (12)")
    launch = ctx.single("recursive", "depth=3 width=3", False, None)
    return follow(client, client.runs.launch(launch), console)


def report(
    client: Client, ctx: LaunchContext, runs: list[RunView], out: Path, console: Console
) -> dict[str, object]:
    console.rule("summary")
    table = Table()
    for column in ("run", "mode", "agent", "state", "children", "duration", "fan-out"):
        table.add_column(column, no_wrap=True)
    for run in runs:
        duration = (run.ended_at or time.time()) - (run.started_at or run.created_at)
        snaps = run.snapshots
        table.add_row(
            run.run_id,
            run.mode,
            run.label,
            run.state,
            str(len(run.children)),
            f"{duration:.1f}s",
            f"{snaps.fanout_used}/{snaps.fanout_limit}",
        )
    console.print(table)
    capacity = client.capacity.snapshot(
        ctx.session_id, limit=LIMITS["max_active_async_runs_per_session"]
    )
    console.print(f"Active async capacity now: {capacity.used}/{capacity.limit} used")
    console.print(client.session.spawn_snapshot(ctx.session_id).text())
    recursive = runs[-1]
    console.print(f"Recursive agent: {recursive.output.strip()}")
    console.print(f"Outputs: {out}")
    outputs = sorted(out.iterdir())
    for path in outputs:
        console.print(f"  {path.name} ({path.stat().st_size} bytes)")
    return {
        "runs": [
            {
                "run_id": r.run_id,
                "mode": r.mode,
                "state": r.state,
                "children": len(r.children),
                "fanout_used": r.snapshots.fanout_used,
                "fanout_limit": r.snapshots.fanout_limit,
                "fanout_descriptor": r.fanout_descriptor,
            }
            for r in runs
        ],
        "capacity": {"used": capacity.used, "limit": capacity.limit},
        "session_id": ctx.session_id,
        "outputs": [str(p) for p in outputs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subagents_node.demo", description=__doc__)
    parser.add_argument("--out", type=Path, help="keep the outputs here (default: a temp dir)")
    parser.add_argument("--summary-json", type=Path, help="also write the summary as JSON here")
    args = parser.parse_args(argv)
    # piped (make demo | tee, CI logs) rich would cut the summary table at 80 columns
    console = Console() if sys.stdout.isatty() else Console(width=120)
    out = args.out or Path(tempfile.mkdtemp(prefix="sa-demo-out-"))
    out.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="sa-demo-"))  # short: the node's socket lives here
    try:
        with Node.embedded(state_dir=state / "state") as node:
            console.print(f"node {node.node_id} at {node.address} (temporary state {state})")
            ctx = LaunchContext.from_environment(
                cwd=out, agents_dirs=[AGENTS], session_id="demo", overrides=LIMITS
            )
            client = node.client()
            runs = [scouts_and_summary(client, ctx, out, console)]
            runs += capacity_wait(client, ctx, console)
            runs.append(recursive_fanout(client, ctx, console))
            summary = report(client, ctx, runs, out, console)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary, indent=2))
    failed = [r.run_id for r in runs if r.state != "complete"]
    if failed:
        console.print(f"[red]runs that did not complete: {failed}[/]")
        return 1
    console.print("[green]demo complete[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
