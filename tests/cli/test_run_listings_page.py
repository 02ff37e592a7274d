"""Listings that must name every run read the run listing page by page.

One `runs.list` request answers at most 1,000 runs. `budget ROOT` names every run of the tree,
a resumed workflow reads every child of the run it resumes (R-WF-5) and the workflow command
awaits every background child its script left running: each follows the listing's
`after_run_id` cursor (client/listing.py) to the end, not its first page. A real detached node
serves runs.db rows copied from a real run (SQLite, written where its node does not drive
them: launching over a thousand runs would take minutes), one of them unreadable so a page
comes back short.
"""

from __future__ import annotations

import io
import json
import sqlite3
import sys
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

import subagents_node.client.listing as listing
from subagents_node.cli.workflow import drain_children
from subagents_node.client.client import Client
from subagents_node.client.paths import owner_db
from subagents_node.messages.supervisor import RunView, TaskItem
from subagents_node.workflow.resumed import children
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runrows import copy_run
from tests.support.runs import WAIT_S, Gate, launch_context

#: More runs than one page of the listing holds (its request's maximum, 1,000).
RUNS = 1_010

StartNode = Callable[..., NodeProcess]


def finished_run(client: Client, agents: Path) -> RunView:
    ctx = launch_context(agents)
    item = TaskItem(agent=ctx.plan("echo"), task="seed")
    run = client.runs.launch(ctx.launch("single", True, items=[item]))
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "complete", done.error
    return done


def seeded(
    start_node: StartNode, state_dir: Path, agents: Path, **columns: Any
) -> tuple[NodeProcess, RunView, list[str]]:
    """A node serving a finished run and RUNS copies of it with `columns` (the source's run id
    stands for `{source}` in their values, its tree's root id for `{root}`)."""
    first = start_node(state_dir=state_dir)
    source = finished_run(first.client(), agents)
    first.close_clients()
    assert first.stop().returncode == 0
    ids = {"source": source.run_id, "root": source.root_run_id}
    values = {k: v.format(**ids) for k, v in columns.items()}
    copies = copy_run(state_dir, source.run_id, RUNS, **values)
    return start_node(state_dir=state_dir), source, copies


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("page", [listing.PAGE, 7])
def test_budget_names_every_run_of_a_tree_larger_than_one_listing_page(
    start_node: StartNode,
    state_dir: Path,
    agents: Path,
    invoke: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
    page: int,
) -> None:
    node, root, copies = seeded(
        start_node, state_dir, agents, root_run_id="{root}", parent_run_id="{source}"
    )
    monkeypatch.setattr(listing, "PAGE", page)
    shown = as_json(invoke("--state-dir", str(state_dir), "budget", root.root_run_id, "--json"))
    assert shown["root_run_id"] == root.root_run_id
    assert sorted(shown["runs"]) == sorted([root.run_id, *copies])
    assert "runs_cut_at" not in shown
    text = invoke("--state-dir", str(state_dir), "budget", root.run_id)  # any run of the tree
    assert text.exit_code == 0, text.output
    assert f"{RUNS} runs in the tree" in text.stdout  # the source, less the unreadable copy
    node.close_clients()


def test_r_wf_5_a_resumed_workflow_reads_every_child_of_its_source_past_a_short_page(
    start_node: StartNode, state_dir: Path, agents: Path
) -> None:
    """A page left short by an unreadable child is not the last: the children older than it
    are read too (else their finished keys would run again)."""
    node, source, copies = seeded(start_node, state_dir, agents, parent_run_id="{source}")
    found = [run.run_id for run in children(node.client(), source.run_id)]
    assert found == list(reversed(copies))  # newest first, each once
    node.close_clients()


class Announced(io.StringIO):
    """stderr that sets `said` once anything is written to it (the drain's announcement)."""

    def __init__(self) -> None:
        super().__init__()
        self.said = threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if "\n" in self.getvalue():  # a whole line, not a first part of one
            self.said.set()
        return written


def test_a_workflow_command_awaits_its_background_child_behind_a_page_of_other_runs(
    start_node: StartNode,
    state_dir: Path,
    agents: Path,
    gate: Gate,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workflow command's embedded node waits for the background children its script left
    running. They are found among the node's active runs whatever their number: here more
    than a page of other sessions' runs (rows the node reads, not runs it drives) are newer."""
    node = start_node(state_dir=state_dir)
    client = node.client()
    ctx = launch_context(agents)
    item = TaskItem(agent=ctx.plan("gate"), task=str(gate.path))
    child = client.runs.launch(ctx.launch("single", True, items=[item]))
    [waiting] = gate.accept(1)
    workflow = "wf-drained"
    with closing(sqlite3.connect(owner_db(state_dir, "supervisor"), timeout=30)) as db, db:
        db.execute("UPDATE runs SET parent_run_id=? WHERE run_id=?", (workflow, child.run_id))
    others = copy_run(state_dir, child.run_id, RUNS, session_id="other", parent_run_id=None)
    announced = Announced()
    monkeypatch.setattr(sys, "stderr", announced)
    seen: dict[str, str] = {}

    def drain() -> None:
        try:
            drain_children(client, workflow)
            seen["state"] = client.runs.show(child.run_id).state
        except Exception as err:  # shown by the assertions below
            seen["error"] = repr(err)
        finally:
            announced.said.set()  # returned: the main thread waits no longer

    drainer = threading.Thread(target=drain)
    try:
        drainer.start()
        assert announced.said.wait(WAIT_S)
        assert "error" not in seen, seen["error"]
        assert "waiting for 1 background child run of" in announced.getvalue()
    finally:
        waiting.release(0)
        if drainer.is_alive():
            drainer.join(WAIT_S)
        with closing(sqlite3.connect(owner_db(state_dir, "supervisor"), timeout=30)) as db, db:
            for table in ("run_children", "runs"):
                db.executemany(
                    f"DELETE FROM {table} WHERE run_id=?",
                    [(run_id,) for run_id in [*others, f"{child.run_id}-copy{RUNS // 2:05d}"]],
                )
        client.runs.wait(child.run_id, timeout=WAIT_S)
        node.close_clients()
    assert seen.get("state") == "complete"  # drained: it returned once the child had ended
