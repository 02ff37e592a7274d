"""The run commands: `run` (single, --async, --parallel, --chain), `runs`, `show`, `stop RUN`,
`agents`; text and --json, and their exit codes (0 done, 1 refused/failed, 2 usage, 3 no node).

Commands run in this process through click's CliRunner against a real detached node (so every
request crosses the node's ipc socket), except where the process itself is the point: the
embedded node of a `run` with no node running, and the absence of tracebacks for user errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from subagents_node.messages.fanout import decode_descriptor, extend
from tests.support.nodes import NodeProcess, run_cli
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import detached_run_node as detached_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import EXAMPLE_AGENTS, Gate, launch_context, write_agent

Invoke = Callable[..., Result]
ECHO_COMMAND = '["{python}", "-c", "import sys; print(sys.argv[1])", "{task}"]'


@pytest.fixture
def cli(invoke: Invoke, state_dir: Path, agents: Path) -> Callable[..., Result]:
    """`cli("run", ...)`: the command with this test's state dir (and agents, for `run`)."""

    def call(command: str, *args: str) -> Result:
        extra = []
        if command == "run":
            extra = ["--agents-dir", str(agents), "--agents-dir", str(EXAMPLE_AGENTS)]
            extra += ["--cwd", str(state_dir)]
        return invoke("--state-dir", str(state_dir), command, *extra, *args)

    return call


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- run ------------------------------------------------------------------------------------------


def test_cli_run_in_the_foreground_follows_the_run_and_prints_its_summary(
    cli: Callable[..., Result], node: NodeProcess
) -> None:
    """R-FAN-25: a foreground result's text has the `Run fan-out` line."""
    result = cli("run", "echo", "hello from the cli")

    assert result.exit_code == 0, result.output
    run_id = re.search(r"run ([0-9a-f]{12}) complete \(single, 1 child\)", result.stdout)
    assert run_id, result.stdout
    assert "Run fan-out: 1/64 used" in result.stdout
    assert result.stdout.rstrip().endswith("hello from the cli")
    assert re.search(r"started single \(echo\) pid \d+", result.stderr)  # plain progress lines
    assert "single (echo) complete (exit 0)" in result.stderr


def test_cli_run_json_prints_the_final_run_view(
    cli: Callable[..., Result], node: NodeProcess
) -> None:
    view = as_json(cli("run", "echo", "json please", "--json"))

    assert (view["state"], view["mode"], view["output"]) == ("complete", "single", "json please")
    assert view["children"][0]["proof_state"] == "observed"


def test_cli_run_exits_1_when_the_run_fails(cli: Callable[..., Result], node: NodeProcess) -> None:
    result = cli("run", "fail", "on purpose")

    assert result.exit_code == 1
    assert re.search(r"run [0-9a-f]{12} failed", result.stdout)
    assert "error: broken: on purpose" in result.stdout


def test_r_cfg_5_an_omitted_async_takes_a_single_agents_setting_else_runs_in_the_foreground(
    cli: Callable[..., Result], node: NodeProcess, agents: Path, state_dir: Path
) -> None:
    """R-CFG-5 as adapted here: a single launch that omits --async/--foreground takes its
    agent's `async` (R-AGT-3) and an explicit flag wins over it; a parallel or chain launch
    that omits it runs in the foreground whatever its agents say (our default is foreground:
    there is no `async_by_default`, tests/launch/test_config.py)."""
    write_agent(agents, "bgecho", "Prints its task.", ECHO_COMMAND, **{"async": "true"})
    background = cli("run", "bgecho", "to the background")
    assert background.exit_code == 0, background.output
    run_id = background.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{12}", run_id), background.stdout
    assert as_json(cli("show", run_id, "--json"))["background"] is True
    assert cli("wait", run_id).exit_code == 0

    foreground = cli("run", "--foreground", "bgecho", "in the foreground")
    assert foreground.exit_code == 0, foreground.output
    assert re.search(r"run [0-9a-f]{12} complete \(single, 1 child\)", foreground.stdout)

    two = state_dir / "two.toml"
    two.write_text('[[tasks]]\nagent = "bgecho"\ntask = "a"\n' * 2)
    parallel = cli("run", "--parallel", str(two))
    assert parallel.exit_code == 0, parallel.output
    assert re.search(r"run [0-9a-f]{12} complete \(parallel, 2 children\)", parallel.stdout)


def test_cli_run_async_prints_the_run_id_and_show_runs_and_stop_find_it(
    cli: Callable[..., Result], node: NodeProcess, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION", "1")
    monkeypatch.setenv("SUBAGENTS_MAX_SPAWNS_PER_SESSION", "5")
    started = cli("run", "--async", "--session", "cli-s", "gate", str(gate.path))
    assert started.exit_code == 0, started.output
    run_id = started.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{12}", run_id)
    gate.accept(1)

    shown = as_json(cli("show", run_id[:5], "--json"))
    assert (shown["run_id"], shown["state"], shown["background"]) == (run_id, "running", True)
    assert (shown["active_async_capacity"], shown["spawn_budget"]["used"]) == (
        {"used": 1, "limit": 1},
        1,
    )
    header = cli("show", run_id).stdout.splitlines()[:3]
    assert header == [  # R-STS-1
        f"Status target: run {run_id}",
        "Spawn budget: 1/5 used, 4 remaining (configured 5; granted 0; grant allowance 5)",
        "Active async capacity: 1/1 used",
    ]
    listed = as_json(cli("runs", "--json"))
    assert [r["run_id"] for r in listed["runs"]] == [run_id]
    active = cli("runs", "--active")
    assert active.exit_code == 0 and run_id in active.stdout and "running" in active.stdout

    stopped = as_json(cli("stop", run_id, "--json"))
    assert stopped["state"] == "stopped" and stopped["error"] == ""
    assert stopped["children"][0]["state"] == "stopped"
    text = cli("show", run_id)
    assert text.exit_code == 0
    assert "Active async capacity: 0/1 used" in text.stdout  # the stop's proof freed the slot
    assert f"run {run_id} stopped" in text.stdout
    assert re.search(r"single\s+gate\s+stopped \(killed by SIGTERM\)", text.stdout)
    assert cli("runs", "--active").stdout.strip() == "no runs"


def test_cli_run_timeout_ms_fails_the_run_with_the_timeout_message(
    cli: Callable[..., Result], node: NodeProcess
) -> None:
    result = cli("run", "sleeper", "seconds=60", "--timeout-ms", "300", "--json")

    assert result.exit_code == 1
    view = json.loads(result.stdout)
    assert (view["state"], view["error"]) == ("failed", "Subagent timed out after 300 ms.")


def test_cli_run_parallel_and_chain_files(
    cli: Callable[..., Result], node: NodeProcess, state_dir: Path
) -> None:
    parallel = state_dir / "parallel.toml"
    parallel.write_text(
        "concurrency = 2\n"
        + "".join(f'[[tasks]]\nagent = "echo"\ntask = "item {i}"\n' for i in range(3))
    )
    chain = state_dir / "chain.toml"
    chain.write_text(
        "[[steps]]\n"
        'parallel = [{agent = "echo", task = "left"}, {agent = "echo", task = "right"}]\n'
        '[[steps]]\nagent = "echo"\ntask = "joined: {previous}"\n'
    )

    fanned = as_json(cli("run", "--parallel", str(parallel), "--json"))
    chained = as_json(cli("run", "--chain", str(chain), "--json"))

    assert (fanned["mode"], fanned["state"]) == ("parallel", "complete")
    assert [c["output"] for c in fanned["children"]] == ["item 0", "item 1", "item 2"]
    assert fanned["snapshots"]["fanout_used"] == 3
    assert (chained["mode"], chained["state"]) == ("chain", "complete")
    assert chained["output"] == "joined: left\n\nright"
    labels = [c["label"] for c in chained["children"]]
    assert labels == ["chain[0].parallel[0]", "chain[0].parallel[1]", "chain[1]"]


# -- show, runs, agents ---------------------------------------------------------------------------


def test_r_fan_26_show_of_a_running_background_run_reads_its_fan_out_budget_live(
    cli: Callable[..., Result], node: NodeProcess, gate: Gate
) -> None:
    """The status view's fan-out line is a live snapshot of the run's persisted budget: claims
    its children's nested launches made since admission count at once, not when it ends."""
    started = cli("run", "--async", "gate", str(gate.path))
    assert started.exit_code == 0, started.output
    run_id = started.stdout.strip()
    [child] = gate.accept(1)
    budget = decode_descriptor(as_json(cli("show", run_id, "--json"))["fanout_descriptor"])
    # Two nested launches of the child, as its own `subagents-node run` would claim them.
    node.client().fanout.claim(extend(budget, "0123abcd"), ["single"])
    node.client().fanout.claim(extend(budget, "4567cdef"), ["tasks[0]", "tasks[1]"])

    shown = cli("show", run_id)
    data = as_json(cli("show", run_id, "--json"))

    assert shown.exit_code == 0, shown.output
    assert "Run fan-out: 4/64 used" in shown.stdout.splitlines()
    assert (data["snapshots"]["fanout_used"], data["snapshots"]["fanout_remaining"]) == (4, 60)
    child.release(0)
    assert node.client().runs.wait(run_id, timeout=20).snapshots.fanout_used == 4
    assert "Run fan-out: 4/64 used" in cli("show", run_id).stdout.splitlines()


def test_cli_show_resolves_a_unique_prefix_and_refuses_an_ambiguous_or_unknown_one(
    cli: Callable[..., Result], node: NodeProcess, agents: Path
) -> None:
    client = node.client()
    ctx = launch_context(agents)
    by_first: dict[str, list[str]] = {}
    # Sixteen hex digits: the 17th run at the latest shares its first character with another.
    while all(len(ids) < 2 for ids in by_first.values()):
        run = client.runs.launch(ctx.single("echo", "x", True, None))
        by_first.setdefault(run.run_id[0], []).append(run.run_id)
        client.runs.wait(run.run_id, timeout=20)
    first, pair = next((c, ids) for c, ids in by_first.items() if len(ids) == 2)

    ambiguous = cli("show", first)
    unknown = cli("show", "zzzz")
    exact = as_json(cli("show", pair[0], "--json"))

    assert ambiguous.exit_code == 1
    assert f"Run id prefix '{first}' is ambiguous" in ambiguous.stderr
    assert unknown.exit_code == 1 and "Run not found: zzzz" in unknown.stderr
    assert exact["run_id"] == pair[0] and exact["state"] == "complete"
    assert len(as_json(cli("runs", "--json", "--limit", "100"))["runs"]) == sum(
        len(ids) for ids in by_first.values()
    )


def test_cli_agents_lists_every_agent_directory_with_json_and_reports_broken_files(
    invoke: Invoke, agents: Path
) -> None:
    write_agent(agents, "broken", "has no command", "[]")

    listing = invoke("agents", "--agents-dir", str(agents), "--agents-dir", str(EXAMPLE_AGENTS))
    data = as_json(
        invoke("agents", "--agents-dir", str(agents), "--agents-dir", str(EXAMPLE_AGENTS), "--json")
    )

    names = {a["name"]: a for a in data["agents"]}
    assert {"echo", "fail", "gate", "recursive", "scout", "sleeper", "summarizer"} <= set(names)
    assert names["recursive"]["fanout"] and not names["echo"]["fanout"]
    assert names["echo"]["scope"] == "explicit"
    assert any("broken.md" in problem for problem in data["problems"])
    assert listing.exit_code == 0
    assert re.search(r"^recursive\s+explicit\s+.*\[fanout\]$", listing.stdout, re.MULTILINE)
    assert "warning: Invalid agent file" in listing.stderr


def test_cli_agents_searches_the_configured_agent_dirs_as_run_does(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SUBAGENTS_AGENT_DIRS", raising=False)
    (tmp_path / "subagents.toml").write_text(f'agent_dirs = ["{EXAMPLE_AGENTS}"]\n')
    names = {a["name"] for a in as_json(invoke("agents", "--json"))["agents"]}
    assert {"sleeper", "scout"} <= names

    (tmp_path / "subagents.toml").write_text('agent_dirs = ["nonexistent"]\n')
    missing = invoke("agents")
    assert missing.exit_code == 1
    assert "agents directory does not exist" in missing.stderr

    (tmp_path / "subagents.toml").unlink()
    monkeypatch.setenv("SUBAGENTS_AGENT_DIRS", str(EXAMPLE_AGENTS))
    names = {a["name"] for a in as_json(invoke("agents", "--json"))["agents"]}
    assert "sleeper" in names


# -- errors and exit codes ------------------------------------------------------------------------


def test_a_run_id_refusal_states_the_whole_rule(invoke: Invoke) -> None:
    """`_` is made of allowed characters: the message must say why it is still no run id."""
    result = invoke("show", "_")
    assert result.exit_code == 2
    assert "starting with a letter or digit" in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("no-such-agent", "x"), 1, "error: Unknown agent 'no-such-agent'."),
        (("echo", "x", "--timeout-ms", "0"), 2, "'--timeout-ms': 0 is not in the range 1<="),
        (("echo",), 2, "give AGENT and TASK"),
        (("echo", "x", "--parallel", "tasks.toml"), 2, "give AGENT and TASK"),
        (("--chain", "missing.toml"), 1, "error: cannot read missing.toml"),
    ],
    ids=["unknown agent", "timeout", "no task", "agent and file", "unreadable file"],
)
def test_cli_run_user_errors_are_one_line_with_their_exit_code(
    cli: Callable[..., Result], node: NodeProcess, args: tuple[str, ...], code: int, message: str
) -> None:
    result = cli("run", *args)

    assert result.exit_code == code
    assert message in result.stderr
    assert cli("runs", "--json").stdout.count('"run_id"') == 0  # nothing was launched


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read /dev/zero: not a regular file"),
        (b"\xff\xfe", "is not UTF-8 text (byte 0)"),
        (b"x = " + b"[" * 3000 + b"]" * 3000, "is not valid TOML: arrays or tables nested too"),
    ],
    ids=["endless device", "not utf-8", "nested too deeply"],
)
def test_cli_run_file_that_cannot_be_a_run_file_is_one_line_and_launches_nothing(
    cli: Callable[..., Result],
    node: NodeProcess,
    tmp_path: Path,
    content: bytes | None,
    message: str,
) -> None:
    path = Path("/dev/zero")
    if content is not None:
        path = tmp_path / "tasks.toml"
        path.write_bytes(content)
    for flag in ("--parallel", "--chain"):
        result = cli("run", flag, str(path))
        assert result.exit_code == 1, result.output
        assert result.stderr.count("\n") == 1 and message in result.stderr
        assert "Traceback" not in result.stderr
    assert cli("runs", "--json").stdout.count('"run_id"') == 0


def test_cli_run_commands_without_a_node_exit_3_and_show_stop_of_unknown_runs_exit_1(
    cli: Callable[..., Result], start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    for command in (("runs",), ("show", "abc"), ("stop", "abc")):
        result = cli(*command)
        assert result.exit_code == 3, command
        assert "error: " in result.stderr
    start_node(state_dir=state_dir)
    for command in (("show", "abc"), ("stop", "abc")):
        result = cli(*command)
        assert result.exit_code == 1 and "Run not found: abc" in result.stderr


def test_cli_foreground_run_with_no_node_running_uses_an_embedded_node_for_its_duration(
    cli: Callable[..., Result], state_dir: Path
) -> None:
    result = cli("run", "echo", "embedded", "--json")

    assert as_json(result)["output"] == "embedded"
    assert cli("runs").exit_code == 3  # the embedded node stopped with the command


def test_cli_user_errors_never_show_a_traceback_from_a_real_process(
    agents: Path, state_dir: Path
) -> None:
    done = run_cli(
        "run", "--agents-dir", str(agents), "echo", "x", "--timeout-ms", "-5", state_dir=state_dir
    )

    assert done.returncode == 2  # out of its range: a usage error (docs/cli.md, exit codes)
    assert done.stderr.strip() == (
        "error: Invalid value for '--timeout-ms': -5 is not in the range 1<=x<=2147483647. "
        "(see 'subagents-node run --help')"
    )


def test_run_with_a_missing_cwd_says_so_not_that_its_project_agent_is_unknown(
    state_dir: Path,
) -> None:
    """The project's agents are looked up under --cwd: with a --cwd that does not exist, an
    agent found only there was "Unknown agent 'echo'. Available agents: none.", which sent the
    user to look at the agent file instead of at the directory named."""
    project = state_dir / "project"
    write_agent(project / ".subagents" / "agents", "echo", "says it", ECHO_COMMAND)
    missing = project / "gone"

    done = run_cli("run", "--cwd", str(missing), "echo", "hi", state_dir=state_dir)

    assert done.returncode == 1
    assert done.stderr.strip() == f"error: working directory does not exist: {missing}"


def test_run_on_a_worker_with_a_cwd_only_there_says_agents_are_looked_up_here(
    state_dir: Path,
) -> None:
    """`run --on NAME --cwd DIR` where DIR exists only on the worker: the agents are looked up
    where the command runs (the launch carries their definitions), so an agent found only
    under DIR/.subagents/agents/ on the worker was "Unknown agent 'echo'. Available agents:
    none.", as if the worker did not have it. The message now says where agents were looked
    up, that DIR was not searched here, and how to name the agent (no node is asked)."""
    missing = state_dir / "only-on-the-worker"

    done = run_cli("run", "--on", "w1", "--cwd", str(missing), "echo", "hi", state_dir=state_dir)

    assert done.returncode == 1
    message = done.stderr.strip()
    assert message.startswith("error: Unknown agent 'echo'."), message
    assert "looked up on this host, not on worker w1" in message, message
    assert f"--cwd {missing} does not exist on this host" in message, message
    assert "--agents-dir" in message and message.count("\n") == 0, message
