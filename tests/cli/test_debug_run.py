"""`debug-run`: a run's lifecycle, proof and capacity verdict, and nothing secret (R-DBG-1..3).

The header is R-STS-1's (`Debug run`, the spawn budget, the session's capacity); then the
lifecycle lines and the capacity verdict with its owner record of R-DBG-3, for a run that holds
its slot, one that released it, and a resume's source and successor (R-CAP-27's relations).
Secrets are planted where a run keeps them (its task text, its launcher's environment, both a
SUBAGENTS_* variable and a custom one, and its child's stdout and stderr, which become the run's
output and error): the tests first check that the node really has each one, then that neither
the text nor the --json output shows any of them. Ids resolve exactly or by unique prefix; an
ambiguous prefix and an unknown id are errors (R-DBG-2).

The CLI runs in this process (click's CliRunner) against an embedded node's ipc socket.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from subagents_node.actors.runs.recovery import RECOVERY
from subagents_node.client.client import Client
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import LaunchResult, RunView
from subagents_node.node.node import Node
from tests.support.manage import hold_with_unknown_proof, leaky_agent
from tests.support.nodes import new_state_dir
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, script_agents, wait_until

LIMIT = 2
Debug = Callable[..., Result]


def secret(kind: str) -> str:
    return f"{kind}-secret-{uuid.uuid4().hex}"


@pytest.fixture
def secrets() -> dict[str, str]:
    return {k: secret(k) for k in ("task", "subagents-env", "custom-env", "stdout", "stderr")}


@pytest.fixture
def agents(secrets: dict[str, str]) -> Iterator[Path]:
    directory = new_state_dir()
    found = script_agents(directory / "agents")
    yield leaky_agent(found, secrets["stdout"], secrets["stderr"])
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def debug(invoke: Callable[..., Result], state_dir: Path, node: Node) -> Debug:
    """`debug("RUN", "--json")`: the command against this test's node, with capacity limit 2."""

    def call(*args: str) -> Result:
        return invoke("--state-dir", str(state_dir), "debug-run", "--limit", str(LIMIT), *args)

    return call


def lines_of(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def details_of(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def assert_no_secret(result: Result, secrets: dict[str, str]) -> None:
    shown = result.stdout + result.stderr
    leaked = [kind for kind, value in secrets.items() if value in shown]
    assert leaked == [], f"debug-run printed the {leaked} secret(s)"


def test_r_dbg_3_a_runner_run_shows_lifecycle_proof_verdict_and_owner_but_no_planted_secret(
    client: Client, agents: Path, gate: Gate, secrets: dict[str, str], debug: Debug
) -> None:
    env = {
        "SUBAGENTS_UNRELATED_TOKEN": secrets["subagents-env"],
        "MY_CUSTOM_API_KEY": secrets["custom-env"],
    }
    ctx = launch_context(agents, env=env, max_active_async_runs_per_session=LIMIT)
    task = f"{gate.path} {secrets['task']}"
    run = client.runs.launch(ctx.single("leaky", task, True, None))
    [child] = gate.accept(1)

    running = debug(run.run_id)
    running_json = debug(run.run_id[:8], "--json")  # a unique prefix resolves (R-DBG-2)

    lines = lines_of(running)
    assert lines[:3] == ["Debug run", "Spawn budget: unlimited", "Active async capacity: 1/2 used"]
    for line in (
        "Run lifecycle debug",
        f"run: {run.run_id}",
        f"dir: {run.run_dir}",
        f"session: {ctx.session_id}",
        "state: running",
        "mode: single (background)",
        f"Status process terminal: pending · runner {run.runner_id}",
        "Active capacity: retained — run is still running",
        "Capacity owner: current slot 0, runner, generation 0",
        f"  owner session: {ctx.session_id}",
        f"  async dir: {run.run_dir}",
    ):
        assert line in lines, line
    assert any(x.startswith(f"  runner: {run.runner_id} started ") for x in lines)
    details = details_of(running_json)
    assert details["lines"] == lines
    assert details["active_async_capacity"] == {"used": 1, "limit": LIMIT}
    assert details["spawn_budget"]["used"] == 0
    assert details["capacity"]["relation"] == "current"
    assert details["capacity"]["owner"]["runner_id"] == run.runner_id
    assert details["lifecycle_status"]["process_terminal"]["state"] == "pending"

    # The environment secrets reached the child (the node passed them on) ...
    environ = Path(f"/proc/{child.pid}/environ").read_bytes().decode(errors="replace")
    assert secrets["subagents-env"] in environ and secrets["custom-env"] in environ
    child.release(3)
    done = client.runs.wait(run.run_id, timeout=20)
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, LIMIT).used == 0, what="release")
    ended, ended_json = debug(run.run_id), debug(run.run_id, "--json")

    lines = lines_of(ended)
    assert lines[2] == "Active async capacity: 0/2 used"
    for line in (
        "state: failed",
        f"Status process terminal: observed · runner {run.runner_id}",
        "Active capacity: not-owned — no active-capacity slot records this run",
        "error: the child reported an error (see `subagents-node show` or its stderr log)",
    ):
        assert line in lines, line
    assert not any(x.startswith("Capacity owner:") for x in lines)
    child_line = (
        f"  single · leaky · failed · async yes · pid {child.pid} · exit 3 · proof observed"
    )
    assert child_line in lines
    details = details_of(ended_json)
    assert details["lifecycle_status"]["process_terminal"] == {
        "state": "observed",
        "runner_id": run.runner_id,
    }
    assert details["capacity"] == {
        "relation": "none",
        "verdict": "not-owned",
        "reason": "no active-capacity slot records this run",
        "owner": None,
    }

    # Every secret is really held by the node (so its absence below means something) ...
    assert (done.output, done.error) == (secrets["stdout"], secrets["stderr"])
    recovery = (Path(run.run_dir) / RECOVERY).read_text()
    assert secrets["task"] in recovery
    # ... though the launcher's environment is never written to disk ...
    assert secrets["subagents-env"] not in recovery and secrets["custom-env"] not in recovery
    # ... and debug-run shows none of them, in text or JSON, running or ended.
    for result in (running, running_json, ended, ended_json):
        assert_no_secret(result, secrets)


def test_r_cap_27_debug_run_of_a_resumes_source_and_successor_shows_the_transferred_slot(
    client: Client, agents: Path, gate: Gate, debug: Debug
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    gate.accept(1)[0].release(0)
    source = client.runs.wait(source.run_id, timeout=20)
    hold_with_unknown_proof(client, source, LIMIT)
    held = lines_of(debug(source.run_id))
    assert "Active capacity: retained — process-terminal proof is unknown" in held
    assert "Capacity owner: current slot 0, runner, generation 0" in held

    resumed: RunView = client.ask(
        Resume(run_id=source.run_id, capacity_limit=LIMIT), LaunchResult
    ).run
    [resumed_child] = gate.accept(1)  # the resumed run holds the slot until released
    source_lines, resumed_lines = lines_of(debug(source.run_id)), lines_of(debug(resumed.run_id))

    assert f"Active capacity: not-owned — slot was transferred to {resumed.run_id}" in source_lines
    assert "Capacity owner: source slot 0, runner, generation 1" in source_lines
    assert f"resumed from: {source.run_id}" in resumed_lines
    assert "Capacity owner: current slot 0, runner, generation 1" in resumed_lines
    assert f"  source run: {source.run_id}" in resumed_lines
    assert resumed_lines[2] == "Active async capacity: 1/2 used"  # one slot, not two
    resumed_child.release(0)
    assert client.runs.wait(resumed.run_id, timeout=20).state == "complete"


def test_r_dbg_2_an_ambiguous_prefix_and_an_unknown_id_are_errors(
    client: Client, agents: Path, debug: Debug
) -> None:
    ctx = launch_context(agents)
    ids: list[str] = []
    # Run ids are random hex: among 17 runs two must share a first character (pigeonhole).
    while len({i[0] for i in ids}) == len(ids) and len(ids) <= 16:
        run = client.runs.launch(ctx.single("echo", "x", False, None))
        ids.append(client.runs.wait(run.run_id, timeout=20).run_id)
    prefix = ids[-1][0]

    ambiguous, unknown = debug(prefix), debug("nosuchrun", "--json")

    assert ambiguous.exit_code == 1
    assert (
        ambiguous.stderr == f"error: Run id prefix '{prefix}' is ambiguous; give more characters.\n"
    )
    assert unknown.exit_code == 1
    assert json.loads(unknown.stderr)["error"]["message"] == "Run not found: nosuchrun"
    assert ambiguous.stdout == unknown.stdout == ""
