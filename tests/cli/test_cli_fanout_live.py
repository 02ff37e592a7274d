"""Views of many runs show each run's fan-out budget live (R-FAN-26), as `budget` reads it.

A real detached node runs a background `nester`: a `fanout: true` agent that launches nested
runs of its own through `subagents-node run` (each claims on the run tree's budget), then waits
at a gate. Its run recorded the budget at admission (1 used); while it waits, `fleet --once`,
`fleet --once --json`, `runs --json` and the MCP `wait` tool (timed out: the run still going)
must show what the fan-out owner says, as `budget` does. A budget the owner cannot read keeps
the recorded figure, marked, and the view goes on (`show` too).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from mcp.types import CallToolResult
from rich.console import Console

from subagents_node.cli.fleet import render
from subagents_node.client.client import Client
from subagents_node.client.fanout_views import RECORDED, live_fanout_plan
from subagents_node.messages.fanout import FanoutDescriptor, decode_descriptor, encode_descriptor
from subagents_node.messages.supervisor import RunView
from tests.mcp.test_mcp_server import mcp_session, server_env, text_of
from tests.node.test_quarantine import corrupt, echo_runs, stop
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import detached_run_node as detached_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, write_agent

#: Launches one nested `echo` run per word of its second argument (each a real `run` of the
#: CLI, so each claims on the inherited budget), then becomes a gate agent on its first.
_NESTER = """\
import os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
gate, words = sys.argv[1].split(" ", 1)
for word in words.split():
    cmd = [sys.executable, "-m", "subagents_node", "run", "--agents-dir", here, "echo", word]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"nested launch of {word} failed: {done.stderr}")
os.execv(sys.executable, [sys.executable, os.path.join(here, "gate.py"), gate])
"""

Cli = Callable[..., Result]


@pytest.fixture
def cli(invoke: Cli, state_dir: Path, agents: Path) -> Cli:
    (agents / "nester.py").write_text(_NESTER)
    write_agent(
        agents,
        "nester",
        "Launches nested echo runs, then waits at a gate.",
        '["{python}", "{agent_dir}/nester.py", "{task}"]',
        fanout="true",
    )

    def call(command: str, *args: str) -> Result:
        extra = ["--agents-dir", str(agents), "--cwd", str(state_dir)] if command == "run" else []
        return invoke("--state-dir", str(state_dir), command, *extra, *args)

    return call


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def nesting(cli: Cli, node: NodeProcess, gate: Gate) -> Iterator[tuple[RunView, int]]:
    """The waiting background nester after two nested launches, and its budget's used count
    as `budget ROOT` reads it from the owner; released (and its end awaited) afterwards."""
    started = cli("run", "--async", "nester", f"{gate.path} one two")
    assert started.exit_code == 0, started.output
    run_id = started.stdout.strip()
    [waiting] = gate.accept(1)  # it connects only after both nested runs were admitted
    client = node.client()
    recorded = client.runs.show(run_id)
    used = as_json(cli("budget", run_id, "--json"))["used"]
    assert (recorded.snapshots.fanout_used, used) == (1, 3)  # the record lags the owner
    yield recorded, used
    waiting.release(0)
    assert client.runs.wait(run_id, timeout=30).state == "complete"


def test_r_fan_26_fleet_once_shows_the_live_fan_out_of_a_run_whose_child_launches_nested_runs(
    cli: Cli, nesting: tuple[RunView, int]
) -> None:
    run, used = nesting
    shown = cli("fleet", "--once")
    assert shown.exit_code == 0, shown.output
    [row] = [line for line in shown.stdout.splitlines() if run.run_id in line]
    assert f" {used}/64 " in row, row
    assert RECORDED not in shown.stdout


def test_r_fan_26_fleet_and_runs_json_show_each_run_of_the_tree_at_its_budgets_live_count(
    cli: Cli, nesting: tuple[RunView, int]
) -> None:
    run, used = nesting
    for command in (("fleet", "--once", "--json"), ("runs", "--json")):
        listed = as_json(cli(*command))["runs"]
        tree = [r for r in listed if r["root_run_id"] == run.root_run_id]
        assert len(tree) == 3, command  # the nester and its two nested runs
        assert {r["snapshots"]["fanout_used"] for r in tree} == {used}, command
        assert {r["snapshots"]["fanout_remaining"] for r in tree} == {64 - used}, command
        assert not any("fanout_recorded" in r for r in tree), command


def test_r_fan_26_a_budget_that_cannot_be_read_keeps_its_recorded_figure_marked_and_alone(
    node: NodeProcess, nesting: tuple[RunView, int]
) -> None:
    """One request reads every budget; an unknown one spoils its own run's reading only, and
    the fleet frame shows that run's recorded figure marked, with the reason under the table."""
    run, used = nesting
    ghost = FanoutDescriptor(root_run_id=run.root_run_id, budget_id="gone-0123", limit=64)
    encoded = encode_descriptor(ghost)
    lost = run.model_copy(update={"run_id": "0123456789ab", "fanout_descriptor": encoded})
    client: Client = node.client()

    live = client.perform(live_fanout_plan([run, lost]))

    why = "Run fan-out budget directory is unavailable: unknown budget gone-0123"
    assert [r.snapshots.fanout_used for r in live.runs] == [used, 1]
    assert live.recorded == {lost.run_id: why}
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(render(live.runs, time.time(), "", live.recorded))
    frame = console.export_text().splitlines()
    [mine, other] = [next(line for line in frame if r.run_id in line) for r in (run, lost)]
    assert f" {used}/64 " in mine and f"1/64 ({RECORDED})" in other, frame
    assert f"fan-out ({RECORDED}): not read live: {why}" in frame


def test_r_fan_26_mcp_wait_that_times_out_on_a_running_run_shows_its_budget_live(
    node: NodeProcess, nesting: tuple[RunView, int]
) -> None:
    """The MCP `wait` tool, when the run is still going, is a status view of it."""
    run, used = nesting
    env = server_env(SUBAGENTS_NODE=node.address)

    async def go() -> CallToolResult:
        async with mcp_session(env) as session:
            return await session.call_tool("wait", {"run_id": run.run_id, "timeout_s": 0.2})

    waited = asyncio.run(go())
    assert waited.structured_content is not None, text_of(waited)
    assert waited.structured_content["timed_out"]
    assert waited.structured_content["fanout"] == {"used": used, "limit": 64}


def test_r_fan_26_a_quarantined_budget_leaves_show_and_fleet_its_runs_recorded_figure_marked(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, invoke: Cli
) -> None:
    """Its owner refuses to read a broken budget: the views show what the run recorded, say so
    and why, and still show every other run live."""
    first = start_node(state_dir=state_dir)
    broken, healthy = echo_runs(first.client(), agents, 2)
    budget = decode_descriptor(first.client().runs.show(broken).fanout_descriptor)
    stop(first)
    sql = "UPDATE fanout_budgets SET used = 'lots' WHERE budget_id = ?"
    corrupt(state_dir, "fanout", sql, budget.budget_id)
    start_node(state_dir=state_dir)

    def cli(*args: str) -> Result:
        return invoke("--state-dir", str(state_dir), *args)

    shown = cli("show", broken)
    fleet = cli("fleet", "--once")
    listed = {r["run_id"]: r for r in as_json(cli("fleet", "--once", "--json"))["runs"]}

    assert shown.exit_code == 0, shown.output
    [line] = [line for line in shown.stdout.splitlines() if line.startswith("Run fan-out:")]
    assert line.startswith(f"Run fan-out: 1/64 used ({RECORDED}: ") and "quarantined" in line
    assert "quarantined" in as_json(cli("show", broken, "--json"))["fanout_recorded"]
    assert fleet.exit_code == 0, fleet.output
    rows = {r: next(x for x in fleet.stdout.splitlines() if r in x) for r in (broken, healthy)}
    assert f"1/64 ({RECORDED})" in rows[broken] and RECORDED not in rows[healthy], fleet.stdout
    assert f"fan-out ({RECORDED}): not read live: " in fleet.stdout
    assert "quarantined" in listed[broken]["fanout_recorded"]
    assert "fanout_recorded" not in listed[healthy]
    assert listed[healthy]["snapshots"]["fanout_used"] == 1
