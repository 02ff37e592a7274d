"""The pause and checkpoint commands: `pause`, `approve`, `reject`, and a chain file's
`expand` and `checkpoint` steps (R-RUN-2, R-FAN-21); text and --json, and their exit codes.

Commands run in this process through click's CliRunner against a real detached node. The rules
behind them are tested in tests/actors/runs/test_pause.py and test_expansion.py; this module
checks the commands and how `show` and `debug-run` display a paused run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from subagents_node.client.client import Client
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import detached_run_node as detached_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, wait_view

Invoke = Callable[..., Result]
Cli = Callable[..., Result]
RUN_ID = re.compile(r"^[0-9a-f]{12}$")

CHAIN = """\
[[steps]]
agent = "echo"
task = "alpha\\nbeta"

[[steps]]
expand = true
max_items = 5
agent = "echo"
task = "saw {item}"

[[steps]]
checkpoint = "check the items"

[[steps]]
agent = "echo"
task = "last: {previous}"
"""


@pytest.fixture
def client(node: NodeProcess) -> Client:
    return node.client(timeout=20)


@pytest.fixture
def cli(invoke: Invoke, state_dir: Path, agents: Path) -> Cli:
    def call(command: str, *args: str) -> Result:
        extra: list[str] = []
        if command == "run":
            extra = ["--agents-dir", str(agents), "--cwd", str(state_dir)]
        return invoke("--state-dir", str(state_dir), *command.split(), *extra, *args)

    return call


def started(cli: Cli, *args: str) -> str:
    result = cli("run", "--async", *args)
    assert result.exit_code == 0, result.output
    run_id = result.stdout.strip()
    assert RUN_ID.match(run_id), result.stdout
    return run_id


def test_r_run_2_a_chain_file_with_expand_and_checkpoint_steps_pauses_and_approve_goes_on(
    cli: Cli, client: Client, state_dir: Path
) -> None:
    chain = state_dir / "chain.toml"
    chain.write_text(CHAIN)
    run_id = started(cli, "--chain", str(chain))
    waiting = wait_view(client, run_id, lambda v: v.state == "paused")
    assert [c.label for c in waiting.children] == [
        "chain[0]",
        "chain[3]",
        "chain[1].expand[0]",
        "chain[1].expand[1]",
    ]

    shown = cli("show", run_id)
    assert shown.exit_code == 0, shown.output
    assert (
        f"paused at checkpoint chain[2]: check the items (approve {run_id} / reject {run_id} "
        "--reason TEXT)"
    ) in shown.stdout
    debug = cli("debug-run", run_id, "--json")
    assert debug.exit_code == 0, debug.output
    assert json.loads(debug.stdout)["paused"] == "checkpoint"

    approved = cli("approve", run_id)
    assert approved.exit_code == 0, approved.output
    assert approved.stdout.strip() == run_id
    done = client.runs.wait(run_id, timeout=20)
    assert done.state == "complete"
    assert done.output == "last: saw alpha\n\nsaw beta"


def test_r_run_2_reject_ends_the_run_rejected_with_the_reason(
    cli: Cli, client: Client, state_dir: Path
) -> None:
    chain = state_dir / "chain.toml"
    chain.write_text(CHAIN)
    run_id = started(cli, "--chain", str(chain))
    wait_view(client, run_id, lambda v: v.state == "paused")

    rejected = cli("reject", run_id, "--reason", "not these")

    assert rejected.exit_code == 0, rejected.output
    assert rejected.stdout.strip() == f"{run_id} rejected"  # its end, not the state it left
    done = client.runs.wait(run_id, timeout=20)
    assert (done.state, done.error) == ("rejected", "Checkpoint rejected: not these")


def test_r_run_2_pause_then_resume_through_the_cli(
    cli: Cli, client: Client, gate: Gate, state_dir: Path
) -> None:
    chain = state_dir / "gated.toml"
    chain.write_text(f'[[steps]]\nagent = "gate"\ntask = "{gate.path}"\n')
    run_id = started(cli, "--chain", str(chain))
    [child] = gate.accept(1)

    paused = cli("pause", run_id, "--json")
    assert paused.exit_code == 0, paused.output
    assert json.loads(paused.stdout)["run_id"] == run_id
    child.wait_exit()
    view = wait_view(client, run_id, lambda v: v.state == "paused")
    assert view.paused == "interrupt"
    assert f"paused at chain[0] (resume {run_id} goes on from there)" in cli("show", run_id).stdout

    resumed = cli("resume", run_id)
    assert resumed.exit_code == 0, resumed.output
    [again] = gate.accept(1)
    again.release(0)
    assert client.runs.wait(resumed.stdout.strip(), timeout=20).state == "complete"


def test_r_run_2_approve_of_a_run_at_no_checkpoint_is_one_error_line(
    cli: Cli, client: Client, state_dir: Path
) -> None:
    chain = state_dir / "one.toml"
    chain.write_text('[[steps]]\nagent = "echo"\ntask = "x"\n')
    run_id = started(cli, "--chain", str(chain))
    client.runs.wait(run_id, timeout=20)

    result = cli("approve", run_id)

    assert result.exit_code == 1, result.output
    assert result.stderr == (f"error: Run '{run_id}' is complete, not waiting at a checkpoint.\n")


@pytest.mark.parametrize(("mode", "again"), [("single", "its task"), ("parallel", "its tasks")])
def test_r_run_2_show_names_no_chain_step_for_a_paused_run_of_one_step(
    cli: Cli, client: Client, gate: Gate, state_dir: Path, mode: str, again: str
) -> None:
    """A single or parallel run has no chain: `show` says a resume runs its step again."""
    tasks = state_dir / "tasks.toml"
    tasks.write_text(f'[[tasks]]\nagent = "gate"\ntask = "{gate.path}"\n')
    spec = ("gate", str(gate.path)) if mode == "single" else ("--parallel", str(tasks))
    run_id = started(cli, *spec)
    [child] = gate.accept(1)

    assert cli("pause", run_id).exit_code == 0
    child.wait_exit()
    wait_view(client, run_id, lambda v: v.state == "paused")

    shown = cli("show", run_id).stdout
    assert f"paused (resume {run_id} runs {again} again)" in shown
    assert "chain[" not in shown
