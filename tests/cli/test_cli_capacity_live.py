"""Capacity views show the whole pool as it is now (R-CAP-26, R-STS-1).

A real detached node runs background runs that hold slots of one session. `capacity` must name
every holder, however many pages the active-run listing takes (the listing answers at most
`limit` runs a request; the command follows its cursor). `fleet --once` (text and `--json`),
`runs --json` and `show --json` must show a session's capacity as the owner counts it now, not
the figure each run recorded at its admission: once a run ended and its slot was freed, the
others no longer show it as used.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from rich.console import Console

import subagents_node.client.listing as listing
from subagents_node.cli.fleet import render
from subagents_node.client.capacity import snapshot_plan
from subagents_node.client.capacity_views import live_capacity_plan
from subagents_node.client.client import Client
from subagents_node.client.fanout_views import RECORDED
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import NodeError
from subagents_node.messages.supervisor import RunView, TaskItem
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import detached_run_node as detached_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import (
    Gate,
    launch_context,
    stop_active_runs,
    stopped,
    wait_until,
    write_agent,
)

#: More background runs than one page of the active-run listing's default (50).
HOLDERS = 60

Cli = Callable[..., Result]


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def background(client: Client, ctx: LaunchContext, agent: str, task: str) -> RunView:
    item = TaskItem(agent=ctx.plan(agent), task=task)
    return client.runs.launch(ctx.launch("single", True, items=[item]))


@pytest.fixture
def client(node: NodeProcess) -> Iterator[Client]:
    """The node's client; whatever still runs is stopped (and settled) before the node stops."""
    connected = node.client()
    yield connected
    stop_active_runs(connected)


@pytest.fixture
def cli(invoke: Cli, state_dir: Path) -> Cli:
    return lambda *args: invoke("--state-dir", str(state_dir), *args)


def test_r_cap_26_capacity_names_every_holder_beyond_the_first_page_of_the_run_listing(
    client: Client, cli: Cli, agents: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_agent(agents, "sleeper", "Sleeps until stopped.", '["sleep", "600"]')
    ctx = launch_context(agents, max_active_async_runs_per_session=HOLDERS)
    launched = {background(client, ctx, "sleeper", "zz").run_id for _ in range(HOLDERS)}
    assert client.capacity.snapshot(ctx.session_id, HOLDERS).used == HOLDERS

    args = ("capacity", "--session", ctx.session_id, "--limit", str(HOLDERS))
    whole = as_json(cli(*args, "--json"))
    assert (whole["used"], whole["limit"]) == (HOLDERS, HOLDERS)
    assert {h["run_id"] for h in whole["holders"]} == launched
    assert all(h["owner"] is not None for h in whole["holders"])
    assert "holders_cut_at" not in whole
    text = cli(*args)
    assert text.exit_code == 0, text.output
    assert f"Active async capacity: {HOLDERS}/{HOLDERS} used" in text.stdout
    assert all(run_id in text.stdout for run_id in launched)

    # Small pages: the cursor walks the listing without skipping or repeating a run.
    monkeypatch.setattr(listing, "PAGE", 7)
    paged = as_json(cli(*args, "--json"))
    assert sorted(h["run_id"] for h in paged["holders"]) == sorted(launched)


def test_r_sts_1_fleet_runs_and_show_read_a_sessions_capacity_live_after_a_slot_is_freed(
    client: Client, cli: Cli, agents: Path, gate: Gate
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=3)
    first = background(client, ctx, "gate", str(gate.path))
    second = background(client, ctx, "gate", str(gate.path))
    ending, staying = gate.accept(2)
    assert (first.snapshots.capacity_used, second.snapshots.capacity_used) == (1, 2)
    pids = {client.runs.show(r.run_id).children[0].pid: r for r in (first, second)}
    ended, going = pids[ending.pid], pids[staying.pid]
    ending.release(0)
    assert client.runs.wait(ended.run_id, timeout=30).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 3).used == 1, what="freed")

    for command in (("fleet", "--once", "--json"), ("runs", "--json")):
        listed = {r["run_id"]: r for r in as_json(cli(*command))["runs"]}
        for run in (going, ended):
            shown = listed[run.run_id]
            assert shown["snapshots"]["capacity_used"] == 1, (command, shown["snapshots"])
            assert shown["snapshots"]["capacity_limit"] == 3
            assert "capacity_recorded" not in shown
    for run in (going, ended):
        shown = as_json(cli("show", run.run_id, "--json"))
        assert shown["snapshots"]["capacity_used"] == 1 == shown["active_async_capacity"]["used"]
    frame = cli("fleet", "--once")
    assert frame.exit_code == 0, frame.output
    for run in (going, ended):
        [row] = [line for line in frame.stdout.splitlines() if run.run_id in line]
        assert " 1/3 " in row and "recorded" not in row, row


def unread(client: Client, session: str) -> bool:
    """Whether the capacity owner leaves a snapshot of `session` unanswered for 0.2 s."""
    try:
        client.perform(snapshot_plan(session, 3, timeout=0.2))
    except NodeError:
        return True
    return False


def test_r_sts_1_a_pool_that_cannot_be_read_keeps_the_recorded_figure_marked_and_the_view_goes_on(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    """The capacity owner is kept busy past the frame's wait: each run shows what it recorded,
    marked, with the reason under the table; the sessions not yet read are not asked."""
    node = start_node("--faults", state_dir=state_dir)
    client = node.client()
    contexts = [launch_context(agents, max_active_async_runs_per_session=3) for _ in range(2)]
    runs = [background(client, ctx, "gate", str(gate.path)) for ctx in contexts]
    children = gate.accept(2)
    # Stopped until the frame is read (a 3 s sleep of the owner could end first, loaded).
    capacity = next(a.pid for a in client.status().actors if a.name == "capacity")
    assert capacity is not None
    try:
        with stopped(capacity):
            wait_until(lambda: unread(client, contexts[0].session_id), what="a busy capacity owner")
            live = client.perform(live_capacity_plan(runs, timeout=0.5))
    finally:
        for child in children:
            child.release(0)
        for run in runs:
            client.runs.wait(run.run_id, timeout=30)

    assert [r.snapshots.capacity_used for r in live.runs] == [1, 1]  # as each recorded it
    assert set(live.recorded) == {r.run_id for r in runs}
    [why] = set(live.recorded.values())
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(render(live.runs, time.time(), "", {}, live.recorded))
    frame = console.export_text().splitlines()
    for run in runs:
        [row] = [line for line in frame if run.run_id in line]
        assert f"1/3 ({RECORDED})" in row, row
    assert f"capacity ({RECORDED}): not read live: {why}" in frame


def test_capacity_names_a_slot_no_run_of_this_node_holds_without_a_host_on_a_plain_node(
    client: Client, cli: Cli
) -> None:
    """A slot held outside this node's runs (a program's acquire through the API) used to be
    listed `RUN on home slot 0 ...` on a node that is no home: a multi-host word on a node
    with no workers. Only a worker's slot names its host ("on w1")."""
    handle = client.capacity.acquire("api-held", 2, "api-run", ttl_s=600)
    assert handle is not None
    try:
        done = cli("capacity", "--session", "api-held", "--limit", "2")
        assert done.exit_code == 0, done.output
        [line] = [row for row in done.stdout.splitlines() if "api-run" in row]
        assert line.split()[:3] == ["api-run", "slot", "0,"], line
    finally:
        handle.rollback()
