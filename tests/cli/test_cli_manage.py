"""The run-management commands: `resume`, `rerun`, `attach`, `append`, `intercom send`,
`debug-run`, and `run --intercom`; text and --json, and their exit codes (0 done, 1 refused or
failed, 2 usage, 3 no node).

Commands run in this process through click's CliRunner against a real detached node (every
request crosses the node's ipc socket), except one real `python -m subagents_node` process that
shows a refusal is one line on stderr, not a traceback. The rules behind each command are tested
in test_resume, test_append, test_intercom and test_debug_run; this module checks the commands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from subagents_node.client.client import Client
from tests.support.nodes import NodeProcess, run_cli
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import detached_run_node as detached_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context

Invoke = Callable[..., Result]
Cli = Callable[..., Result]
RUN_ID = re.compile(r"^[0-9a-f]{12}$")


@pytest.fixture
def client(node: NodeProcess) -> Client:
    return node.client(timeout=20)


@pytest.fixture
def cli(invoke: Invoke, state_dir: Path, agents: Path) -> Cli:
    """`cli("intercom send", ...)`: the command with this test's state dir (and agents)."""

    def call(command: str, *args: str) -> Result:
        extra: list[str] = []
        if command in ("run", "append", "attach"):
            extra = ["--agents-dir", str(agents)]
        if command == "run":
            extra += ["--cwd", str(state_dir)]
        return invoke("--state-dir", str(state_dir), *command.split(), *extra, *args)

    return call


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refused(result: Result, message: str) -> None:
    """Exit 1 and exactly one `error: ...` line on stderr, nothing on stdout."""
    assert result.exit_code == 1, result.output
    assert (result.stdout, result.stderr) == ("", f"error: {message}\n")


def started(cli: Cli, *args: str) -> str:
    """`run --async ARGS`; returns the run id it printed."""
    result = cli("run", "--async", *args)
    assert result.exit_code == 0, result.output
    run_id = result.stdout.strip()
    assert RUN_ID.match(run_id), result.stdout
    return run_id


def steps_file(directory: Path, *tasks: str, agent: str = "echo") -> Path:
    path = directory / f"steps-{len(list(directory.glob('steps-*')))}.toml"
    path.write_text("".join(f'[[steps]]\nagent = "{agent}"\ntask = "{t}"\n' for t in tasks))
    return path


# -- resume ----------------------------------------------------------------------------------------


def test_cli_resume_relaunches_a_finished_run_in_the_background_and_prints_its_id(
    cli: Cli, client: Client
) -> None:
    source = started(cli, "echo", "first")
    client.runs.wait(source, timeout=20)

    as_text = cli("resume", source, "--message", "second")
    as_json = ok_json(cli("resume", source[:8], "--json"))

    assert as_text.exit_code == 0, as_text.output
    resumed = as_text.stdout.strip()
    assert RUN_ID.match(resumed) and resumed != source
    assert client.runs.wait(resumed, timeout=20).output.split() == ["first", "second"]
    assert (as_json["source_run_id"], as_json["background"]) == (source, True)
    assert as_json["fanout_descriptor"] == client.runs.show(source).fanout_descriptor
    assert client.runs.wait(as_json["run_id"], timeout=20).output == "first"


def test_cli_resume_of_a_stopped_running_or_unknown_run_exits_1_with_the_reason(
    cli: Cli, client: Client, gate: Gate
) -> None:
    stopped = started(cli, "gate", str(gate.path))
    gate.accept(1)
    assert cli("stop", stopped).exit_code == 0
    client.runs.wait(stopped, timeout=20)
    running = started(cli, "gate", str(gate.path))
    [child] = gate.accept(1)

    refused(
        cli("resume", stopped),
        f"Run '{stopped}' was stopped and cannot be resumed. Start a new run instead.",
    )
    as_json = cli("resume", running, "--json")  # the same refusal, as one JSON object
    assert (as_json.exit_code, as_json.stdout) == (1, "")
    assert json.loads(as_json.stderr)["error"] == {
        "code": "run_not_resumable",
        "message": f"Run '{running}' is still running; it cannot be resumed while it runs.",
        "details": {"reason": "running", "run_id": running},
    }
    refused(cli("resume", "nosuchrun"), "Run not found: nosuchrun")
    child.release(0)
    assert client.runs.wait(running, timeout=20).state == "complete"


# -- rerun -----------------------------------------------------------------------------------------


def test_cli_rerun_runs_the_child_again_with_a_new_task_in_the_foreground(
    cli: Cli, client: Client
) -> None:
    source = started(cli, "echo", "old task")
    client.runs.wait(source, timeout=20)

    as_text = cli("rerun", source, "--task", "new task")
    as_json = ok_json(cli("rerun", source, "--task", "json task", "--json"))

    assert as_text.exit_code == 0, as_text.output
    assert re.search(r"run [0-9a-f]{12} complete \(single, 1 child\)", as_text.stdout)
    assert as_text.stdout.rstrip().endswith("new task")
    assert (as_json["state"], as_json["background"], as_json["output"]) == (
        "complete",
        False,
        "json task",
    )
    refused(
        cli("rerun", source, "--task", "x", "--child", "3"),
        f"run '{source}' has 1 child; there is no child 3",
    )


def test_cli_rerun_exits_1_when_the_rerun_fails(cli: Cli, client: Client) -> None:
    source = started(cli, "fail", "first")
    client.runs.wait(source, timeout=20)

    result = cli("rerun", source, "--task", "again")

    assert result.exit_code == 1
    assert re.search(r"run [0-9a-f]{12} failed \(single, 1 child\)", result.stdout)
    assert "error: broken: again" in result.stdout


# -- attach (R-RES-6) and the links show and debug-run print ---------------------------------------


def test_cli_attach_chains_steps_after_a_live_run_and_show_prints_the_links(
    cli: Cli, client: Client, gate: Gate, state_dir: Path
) -> None:
    source = started(cli, "gate", str(gate.path))
    [held] = gate.accept(1)

    result = cli("attach", source, str(steps_file(state_dir, "after {previous}")))

    assert result.exit_code == 0, result.output
    chain = result.stdout.strip()
    assert RUN_ID.match(chain), result.stdout
    shown = cli("show", chain)
    assert shown.exit_code == 0, shown.output
    assert f"chain attached to live run: {source}" in shown.stdout
    held.release(0)
    assert client.runs.wait(chain, timeout=20).output.strip() == "after released 0"
    refused(
        cli("attach", source, str(steps_file(state_dir, "late"))),
        f"Run '{source}' is complete; only a live background run can be attached as a chain "
        "root. Resume it, or start a chain, instead.",
    )


def test_cli_rerun_of_a_live_foreground_run_is_linked_in_show_and_debug_run(
    cli: Cli, client: Client, gate: Gate, agents: Path
) -> None:
    old = client.runs.launch(launch_context(agents).single("gate", str(gate.path), False, None))
    [first] = gate.accept(1)

    new = client.runs.rerun(old.run_id, str(gate.path))  # the Python API (R-MISC-2)
    [second] = gate.accept(1)
    assert client.runs.wait(old.run_id, timeout=20).state == "stopped"

    shown = cli("show", old.run_id)
    debug = cli("debug-run", new.run_id)
    assert shown.exit_code == 0 and debug.exit_code == 0, shown.output + debug.output
    assert f"superseded by rerun: {new.run_id}" in shown.stdout
    assert f"rerun of: {old.run_id}" in debug.stdout
    first.wait_exit()
    second.release(0)
    assert client.runs.wait(new.run_id, timeout=20).state == "complete"


# -- append ----------------------------------------------------------------------------------------


def test_cli_append_queues_steps_on_a_running_background_chain(
    cli: Cli, client: Client, gate: Gate, state_dir: Path
) -> None:
    chain = steps_file(state_dir, str(gate.path), agent="gate")
    run_id = started(cli, "--chain", str(chain))
    [child] = gate.accept(1)

    as_json = ok_json(cli("append", run_id, str(steps_file(state_dir, "one", "two")), "--json"))
    as_text = cli("append", run_id, str(steps_file(state_dir, "three")))

    assert (as_json["run_id"], as_json["steps"], as_json["pending_appends"]) == (run_id, 2, 0)
    assert as_json["text"].startswith(f"Append queued for chain run {run_id}: 2 step(s).")
    assert as_text.exit_code == 0, as_text.output
    assert as_text.stdout.startswith(f"Append queued for chain run {run_id}: 1 step(s).")
    child.release(0)
    done = client.runs.wait(run_id, timeout=20)
    assert [c.output for c in done.children[1:]] == ["one", "two", "three"]

    refused(
        cli("append", run_id, str(steps_file(state_dir, "late"))),
        f"Failed to append step to chain run {run_id}: the run is complete",
    )


def test_cli_append_with_a_bad_steps_file_exits_1_before_asking_any_node(
    cli: Cli, state_dir: Path
) -> None:
    """No node runs: reaching for one would exit 3."""
    empty = state_dir / "empty.toml"
    empty.write_text("title = 'no steps'\n")
    missing = state_dir / "missing.toml"

    refused(
        cli("append", "0123456789ab", str(empty)), f"{empty}: expected one or more [[steps]] tables"
    )
    result = cli("append", "0123456789ab", str(missing))
    assert result.exit_code == 1 and result.stderr.startswith(f"error: cannot read {missing}")


# -- intercom --------------------------------------------------------------------------------------


def test_cli_intercom_send_reaches_a_run_unless_it_was_started_with_intercom_off(
    cli: Cli, client: Client, gate: Gate
) -> None:
    heard = started(cli, "--intercom", "on", "gate", str(gate.path))
    quiet = started(cli, "--intercom", "off", "gate", str(gate.path))
    children = gate.accept(2)

    sent = ok_json(cli("intercom send", "--run", heard, "status: halfway", "--json"))
    as_text = cli("intercom send", "--run", heard[:8], "done soon")
    off = cli("intercom send", "--run", quiet, "anyone?")

    assert (sent["run_id"], sent["child_id"], sent["text"]) == (heard, "", "status: halfway")
    assert (as_text.exit_code, as_text.stdout) == (0, f"sent to run {heard}\n")
    refused(off, f"Intercom is off for run {quiet}.")
    shown = ok_json(cli("show", heard, "--json"))
    assert [m["text"] for m in shown["intercom"]] == ["status: halfway", "done soon"]
    assert ok_json(cli("show", quiet, "--json"))["intercom"] == []
    for child in children:
        child.release(0)
    for run_id in (heard, quiet):
        assert client.runs.wait(run_id, timeout=20).state == "complete"


def test_r_res_7_cli_resume_intercom_overrides_the_sources_setting_and_refuses_a_bad_one(
    cli: Cli, client: Client, gate: Gate
) -> None:
    source = started(cli, "--intercom", "on", "gate", str(gate.path))
    [first] = gate.accept(1)
    first.release(0)
    assert client.runs.wait(source, timeout=20).state == "complete"

    bad = cli("resume", source, "--intercom", "maybe")
    resumed = cli("resume", source, "--intercom", "off")
    [again] = gate.accept(1)

    assert bad.exit_code == 2 and "'maybe' is not one of 'on', 'off'" in bad.stderr
    assert resumed.exit_code == 0, resumed.output
    quiet = resumed.stdout.strip()
    refused(cli("intercom send", "--run", quiet, "anyone?"), f"Intercom is off for run {quiet}.")
    # On still (a message to a run that ended is refused, but not as off).
    refused(
        cli("intercom send", "--run", source, "still on"),
        f"Run {source} has ended (complete): intercom reaches a run only while it goes on.",
    )
    again.release(0)
    assert client.runs.wait(quiet, timeout=20).state == "complete"


def test_cli_intercom_send_outside_a_child_without_run_is_a_usage_error(cli: Cli) -> None:
    result = cli("intercom send", "hello")

    assert result.exit_code == 2
    assert "not inside a child: give --run RUN_ID" in result.stderr


def test_cli_run_refuses_an_intercom_mode_other_than_on_or_off(cli: Cli) -> None:
    result = cli("run", "--intercom", "maybe", "echo", "x")

    assert result.exit_code == 2
    assert "'maybe' is not one of 'on', 'off'" in result.stderr


# -- debug-run -------------------------------------------------------------------------------------


def test_cli_debug_run_prints_the_lifecycle_and_json_details(cli: Cli, client: Client) -> None:
    run_id = started(cli, "echo", "x")
    client.runs.wait(run_id, timeout=20)

    as_text = cli("debug-run", run_id)
    details = ok_json(cli("debug-run", run_id, "--json"))

    assert as_text.exit_code == 0, as_text.output
    assert as_text.stdout.splitlines()[:4] == [
        "Debug run",
        "Spawn budget: unlimited",
        "Active async capacity: 0/unlimited used",
        "Run lifecycle debug",
    ]
    assert details["lines"] == as_text.stdout.splitlines()
    assert (details["run_id"], details["state"], details["mode"]) == (run_id, "complete", "single")
    assert details["active_async_capacity"] == {"used": 0, "limit": 0}
    assert details["lifecycle_status"]["process_terminal"]["state"] == "observed"
    assert set(details) >= {"spawn_budget", "capacity", "children"}
    refused(cli("debug-run", "nosuchrun"), "Run not found: nosuchrun")


# -- every command without a node, and as a real process -------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ("resume", "0123456789ab"),
        ("rerun", "0123456789ab", "--task", "x"),
        ("append", "0123456789ab", "STEPS"),
        ("intercom", "send", "--run", "0123456789ab", "hi"),
        ("debug-run", "0123456789ab", "--limit", "1"),
    ],
    ids=lambda c: c[0],
)
def test_cli_management_commands_exit_3_when_no_node_is_running(
    invoke: Invoke, agents: Path, state_dir: Path, command: tuple[str, ...]
) -> None:
    args = [str(steps_file(state_dir, "x")) if a == "STEPS" else a for a in command]
    if command[0] == "append":
        args += ["--agents-dir", str(agents)]

    result = invoke("--state-dir", str(state_dir), *args)

    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("error: no node is running at ")


def test_cli_a_refused_resume_is_one_line_on_stderr_not_a_traceback(node: NodeProcess) -> None:
    done = run_cli("resume", "nosuchrun", state_dir=node.state_dir)

    assert done.returncode == 1
    assert (done.stdout, done.stderr) == ("", "error: Run not found: nosuchrun\n")
