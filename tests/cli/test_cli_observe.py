"""`logs`, `wait` and terminal sessions, as a user drives them from a shell and from scripts.

Against a real detached node: `logs -f` runs as a real process and is read as its lines come,
`wait`'s exit codes are checked for each way a run ends, and the sessions test starts the CLI
from one Unix session and from two `setsid` sessions (SPEC §0.1). Nothing is mocked; every wait
has a deadline and waits on an event (a gate socket, a pipe, the node's long-poll).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import Result

from subagents_node.client.client import Client, connect
from tests.support.nodes import REPO, NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import detached_run_node as detached_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import (
    EXAMPLE_AGENTS,
    WAIT_S,
    Gate,
    stop_active_runs,
    wait_view,
    write_agent,
)

Cli = Callable[..., Result]
_CLI = (sys.executable, "-m", "subagents_node")

#: Prints a line on each stream, then waits at the gate (its task), then prints its release.
_TALKER = """\
import socket, sys
print("first line", flush=True)
print("a warning", file=sys.stderr, flush=True)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(b"0\\n")
print("released " + sock.recv(64).decode().strip(), flush=True)
"""


@pytest.fixture
def talker(agents: Path) -> Path:
    (agents / "talker.py").write_text(_TALKER)
    write_agent(
        agents,
        "talker",
        "Talks, then waits at a gate.",
        '["{python}", "{agent_dir}/talker.py", "{task}"]',
    )
    return agents


@pytest.fixture
def client(node: NodeProcess) -> Iterator[Client]:
    with connect(node.address) as opened:
        yield opened
        stop_active_runs(opened)


@pytest.fixture
def cli(invoke: Cli, state_dir: Path, agents: Path) -> Cli:
    def call(command: str, *args: str) -> Result:
        extra: list[str] = []
        if command == "run":
            extra = ["--agents-dir", str(agents), "--agents-dir", str(EXAMPLE_AGENTS)]
        return invoke("--state-dir", str(state_dir), command, *extra, *args)

    return call


def started_async(cli: Cli, agent: str, task: str) -> str:
    result = cli("run", "--async", agent, task)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def read_until(proc: subprocess.Popen[bytes], wanted: str, seen: list[str]) -> None:
    """Read proc's stdout (unbuffered, deadline WAIT_S) until a line equals `wanted`."""
    assert proc.stdout is not None
    deadline = time.monotonic() + WAIT_S
    while wanted not in seen:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no {wanted!r} within {WAIT_S}s; saw {seen}"
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, f"logs ended before {wanted!r}; saw {seen}"
        seen.extend(chunk.decode().splitlines())


# -- logs -------------------------------------------------------------------------------------


def test_logs_follow_shows_lines_as_they_are_written_and_returns_when_the_run_ends(
    cli: Cli, node: NodeProcess, gate: Gate, talker: Path, state_dir: Path, client: Client
) -> None:
    run_id = started_async(cli, "talker", str(gate.path))
    (child,) = gate.accept(1)  # it has written its first lines and now waits
    with subprocess.Popen(
        [*_CLI, "--state-dir", str(state_dir), "logs", "-f", run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        cwd=REPO,
    ) as proc:
        try:
            seen: list[str] = []
            read_until(proc, "single stdout | first line", seen)
            read_until(proc, "single stderr | a warning", seen)
            assert proc.poll() is None, "logs -f must keep following a running child"
            child.release(0)  # the child writes one more line, then the run ends
            read_until(proc, "single stdout | released 0", seen)
            assert proc.wait(WAIT_S) == 0, proc.stderr.read() if proc.stderr else b""
        finally:
            proc.kill()
            proc.wait(WAIT_S)
    assert client.runs.show(run_id).state == "complete"


def test_logs_of_an_ended_run_prints_every_line_labelled_and_child_selects_one(
    cli: Cli, node: NodeProcess, client: Client
) -> None:
    result = cli("run", "--parallel", str(_two_echoes(cli, node)))
    assert result.exit_code == 0, result.output
    run_id = re.search(r"run ([0-9a-f]{12}) complete", result.stdout)
    assert run_id
    both = cli("logs", run_id.group(1))
    assert both.exit_code == 0, both.output
    assert set(both.stdout.splitlines()) == {"tasks[0] stdout | one", "tasks[1] stdout | two"}
    one = cli("logs", run_id.group(1), "--child", "tasks[1]")
    assert one.stdout.splitlines() == ["tasks[1] stdout | two"]
    missing = cli("logs", run_id.group(1), "--child", "tasks[7]")
    assert missing.exit_code == 1
    assert missing.stderr.strip().startswith("error: run ") and "tasks[7]" in missing.stderr


def test_r_adm_6_logs_read_only_runs_the_node_recorded_never_a_directory_found_on_disk(
    cli: Cli, node: NodeProcess
) -> None:
    """R-ADM-6: only a run the node registered is trusted for log lookup. A directory under
    runs/ that looks like a run's (a leftover, or planted) is never read as one, and a run id
    that is a path is refused before any file is touched."""
    planted = node.state_dir / "runs" / "0123456789ab"
    planted.mkdir(parents=True, exist_ok=True)
    (planted / "external-0.stdout.log").write_text("planted line\n")
    unknown = cli("logs", "0123456789ab")
    assert unknown.exit_code == 1, unknown.output
    assert "planted line" not in unknown.output
    assert unknown.stderr.startswith("error: ") and "0123456789ab" in unknown.stderr
    for path in ("../runs/0123456789ab", str(planted)):
        refused = cli("logs", path)
        assert refused.exit_code == 2, refused.output  # a usage error: not a run id
        assert "planted line" not in refused.output and "is not a run id" in refused.stderr


def test_logs_into_a_reader_that_goes_away_exits_141_quietly_like_a_unix_tool(
    cli: Cli, node: NodeProcess, agents: Path, state_dir: Path
) -> None:
    """`logs RUN | head`: once the reader is gone, the command ends with 141 (128 + SIGPIPE)
    and says nothing; it used to print "error: Broken pipe" as if the user's path had failed,
    and exit 1."""
    write_agent(
        agents,
        "chatty",
        "Prints many lines.",
        '["{python}", "-c", "for i in range(20000): print(\'line\', i)"]',
    )
    result = cli("run", "chatty", "x")
    assert result.exit_code == 0, result.output
    run_id = re.search(r"run ([0-9a-f]{12}) complete", result.stdout)
    assert run_id
    for extra in ((), ("--json",)):
        with subprocess.Popen(
            [*_CLI, "--state-dir", str(state_dir), "logs", *extra, run_id.group(1)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            cwd=REPO,
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.read(10)  # what `head -c 10` takes, then it exits
            proc.stdout.close()
            assert proc.wait(WAIT_S) == 141
            assert proc.stderr.read() == b""


@pytest.mark.parametrize("command", [["logs", "-f"], ["wait"]])
def test_a_follow_whose_reader_goes_away_ends_at_once_and_leaves_the_run_going(
    cli: Cli, client: Client, state_dir: Path, talker: Path, gate: Gate, command: list[str]
) -> None:
    """`logs -f RUN | grep -m1 "first line"` (or `wait RUN | …`): the reader went, and the
    command went on following a quiet run until its next line or its end, and the pipeline
    (a script's next step) with it. It ends at once now, quietly, with 141; the run is not
    its to stop and goes on."""
    run_id = started_async(cli, "talker", str(gate.path))
    [held] = gate.accept(1)
    with subprocess.Popen(
        [*_CLI, "--state-dir", str(state_dir), *command, run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        cwd=REPO,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            if command[0] == "logs":
                read_until(proc, "single stdout | first line", [])
            proc.stdout.close()  # `grep -m1` has its line; the child says nothing more for now
            assert proc.wait(15) == 141
            assert proc.stderr.read() == b""
        finally:
            proc.kill()
            proc.wait(WAIT_S)
    assert client.runs.show(run_id).state == "running"
    held.release(0)
    assert client.runs.wait(run_id, timeout=WAIT_S).state == "complete"


def _two_echoes(cli: Cli, node: NodeProcess) -> Path:
    path = node.state_dir / "two.toml"
    path.write_text(
        '[[tasks]]\nagent = "echo"\ntask = "one"\n[[tasks]]\nagent = "echo"\ntask = "two"\n'
    )
    return path


# -- wait -------------------------------------------------------------------------------------


def test_wait_exits_0_when_every_run_completed_and_prints_each_end(
    cli: Cli, node: NodeProcess
) -> None:
    first, second = started_async(cli, "echo", "a"), started_async(cli, "echo", "b")
    result = cli("wait", first, second)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"run {first} complete", f"run {second} complete"]


def test_wait_on_a_run_named_twice_prints_its_end_once_in_the_order_first_named(
    cli: Cli, node: NodeProcess
) -> None:
    """`wait R R` (or `wait R PREFIX-OF-R`) printed R's end twice, and listed it twice in
    --json: one run named twice is one run."""
    first, second = started_async(cli, "echo", "a"), started_async(cli, "echo", "b")
    result = cli("wait", first, second, first[:8], first)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"run {first} complete", f"run {second} complete"]
    listed = json.loads(cli("wait", second, second, "--json").stdout)["runs"]
    assert [run["run_id"] for run in listed] == [second]


def test_settle_waits_on_a_run_named_twice_once_and_gives_its_view_for_both(
    cli: Cli, client: Client
) -> None:
    run_id = started_async(cli, "echo", "a")
    ends: list[str] = []
    views = client.runs.settle(
        [run_id, run_id[:8]], timeout=WAIT_S, on_end=lambda view: ends.append(view.run_id)
    )
    assert [v.run_id for v in views] == [run_id, run_id]
    assert ends == [run_id]


def test_wait_exits_1_when_a_run_failed(cli: Cli, node: NodeProcess) -> None:
    ok, failed = started_async(cli, "echo", "fine"), started_async(cli, "fail", "on purpose")
    result = cli("wait", ok, failed)
    assert result.exit_code == 1
    assert f"run {failed} failed: broken: on purpose" in result.stdout.splitlines()


def test_wait_exits_1_when_a_run_was_stopped(cli: Cli, node: NodeProcess, gate: Gate) -> None:
    run_id = started_async(cli, "gate", str(gate.path))
    gate.accept(1)
    assert cli("stop", run_id).exit_code == 0
    result = cli("wait", run_id)
    assert result.exit_code == 1
    assert result.stdout.startswith(f"run {run_id} stopped")


def test_wait_on_a_paused_run_that_went_on_in_another_run_names_that_run(
    cli: Cli, node: NodeProcess, gate: Gate, client: Client
) -> None:
    """A paused run that `resume` (or, after a node restart, `approve`) continued ends
    `stopped` with nobody having stopped it: `wait` said only `stopped` (exit 1), hiding the
    run that went on with its work."""
    run_id = started_async(cli, "gate", str(gate.path))
    gate.accept(1)
    assert cli("pause", run_id).exit_code == 0
    wait_view(client, run_id, lambda v: v.state == "paused")
    resumed = cli("resume", run_id)
    assert resumed.exit_code == 0, resumed.output
    going = resumed.stdout.split()[0]
    (again,) = gate.accept(1)

    result = cli("wait", run_id, "--timeout", str(WAIT_S))

    assert result.exit_code == 1
    assert result.stdout.strip() == f"run {run_id} stopped: continued as run {going}"
    again.release(0)
    assert cli("wait", going, "--timeout", str(WAIT_S)).exit_code == 0


def test_wait_exits_124_on_timeout_and_says_which_run_is_still_running(
    cli: Cli, node: NodeProcess, gate: Gate, client: Client
) -> None:
    run_id = started_async(cli, "gate", str(gate.path))
    (child,) = gate.accept(1)
    result = cli("wait", run_id, "--timeout", "0.3")
    assert result.exit_code == 124
    assert result.stdout.strip() == f"run {run_id} still running"
    child.release(0)
    assert cli("wait", run_id, "--timeout", str(WAIT_S)).exit_code == 0


# -- sessions (SPEC §0.1) ---------------------------------------------------------------------


def _async_run(state_dir: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": "1"}
    command = [*_CLI, "--state-dir", str(state_dir), "run", "--async"]
    command += ["--agents-dir", str(EXAMPLE_AGENTS), "sleeper", "seconds=60"]
    return subprocess.run(
        [*prefix, *command], env=env, capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_session_defaults_to_the_terminal_so_one_shell_shares_its_capacity_and_setsid_does_not(
    node: NodeProcess, state_dir: Path, client: Client
) -> None:
    first = _async_run(state_dir)
    assert first.returncode == 0, first.stderr
    session = re.fullmatch(r"session (term-\S+)", first.stderr.strip())
    assert session, first.stderr  # RUN_ID on stdout, the session on stderr
    assert client.runs.show(first.stdout.strip()).session_id == session.group(1)

    second = _async_run(state_dir)  # the same Unix session: the same ledger session
    assert second.returncode == 1
    assert "Active async run capacity exhausted: 1/1 used." in second.stderr
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": "1"}
    shown = subprocess.run(  # `capacity` with no --session reports this terminal's session
        [*_CLI, "--state-dir", str(state_dir), "capacity"],
        env=env, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert shown.stdout.splitlines()[0] == "Active async capacity: 1/1 used", shown.stdout

    others = [_async_run(state_dir, "setsid", "-w") for _ in range(2)]
    assert [o.returncode for o in others] == [0, 0], [o.stderr for o in others]
    sessions = {client.runs.show(o.stdout.strip()).session_id for o in others}
    assert len(sessions | {session.group(1)}) == 3  # each setsid process is its own session


def test_session_flag_and_variable_win_over_the_terminal_session(
    cli: Cli, node: NodeProcess, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    flagged = cli("run", "--async", "--session", "mine", "echo", "x")
    assert flagged.exit_code == 0, flagged.output
    assert client.runs.show(flagged.stdout.strip()).session_id == "mine"
    monkeypatch.setenv("SUBAGENTS_SESSION", "inherited")
    from_env = cli("run", "--async", "--json", "echo", "y")
    view = __import__("json").loads(from_env.stdout)
    assert (view["session_id"], len(view["run_id"])) == ("inherited", 12)


# -- fixes (issue 14 item 4) --------------------------------------------------------------------


def test_doctor_resolves_an_agents_command_on_the_agents_own_env_path(
    invoke: Cli, state_dir: Path, tmp_path: Path
) -> None:
    private = tmp_path / "private-bin"
    private.mkdir()
    tool = private / "my-private-agent"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    agents_dir = tmp_path / "agents"
    write_agent(agents_dir, "private", "On a private PATH.", '["my-private-agent", "{task}"]')
    text = (agents_dir / "private.md").read_text()
    (agents_dir / "private.md").write_text(
        text.replace("---\nYou", f"env:\n  PATH: {private}\n---\nYou", 1)
    )
    result = invoke("--state-dir", str(state_dir), "doctor", "--agents-dir", str(agents_dir))
    assert "[ok  ] agent private:" in result.stdout, result.stdout


def test_resume_refuses_a_foreground_run_with_a_clear_error(cli: Cli, node: NodeProcess) -> None:
    done = cli("run", "echo", "in the foreground", "--json")
    run_id = __import__("json").loads(done.stdout)["run_id"]
    result = cli("resume", run_id)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: Run '{run_id}' ran in the foreground; only background runs can be resumed. "
        f"Use `rerun {run_id} --task TASK` to run it again."
    )


def test_the_sleeper_resumed_with_a_message_keeps_it_out_of_its_seconds_field(
    cli: Cli, node: NodeProcess
) -> None:
    run_id = started_async(cli, "sleeper", "seconds=0.1")
    assert cli("wait", run_id).exit_code == 0
    resumed = cli("resume", run_id, "-m", "again")
    assert resumed.exit_code == 0, resumed.output
    waited = cli("wait", resumed.stdout.strip())
    assert waited.exit_code == 0, waited.output  # was: could not convert '0.1\n\nagain'


def test_json_errors_are_one_object_on_stderr(cli: Cli, node: NodeProcess) -> None:
    result = cli("show", "fffffffffff0", "--json")
    assert result.exit_code == 1
    error = __import__("json").loads(result.stderr)["error"]
    assert error["code"] == "run_not_found" and "fffffffffff0" in error["message"]


def test_runs_lists_a_header_with_age_and_duration_and_correct_plurals(
    cli: Cli, node: NodeProcess
) -> None:
    run_id = started_async(cli, "echo", "x")
    assert cli("wait", run_id).exit_code == 0
    lines = cli("runs").stdout.splitlines()
    assert lines[0].split() == [
        "RUN", "STATE", "MODE", "AGE", "DURATION", "CHILDREN", "SESSION", "LABEL"
    ]  # fmt: skip
    assert re.match(rf"{run_id}\s+complete\s+single\s+\S+s\s+\S+s\s+1 child\s", lines[1])


def test_a_child_killed_by_a_signal_is_shown_with_the_signal_name(
    cli: Cli, node: NodeProcess, agents: Path
) -> None:
    command = '["{python}", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]'
    write_agent(agents, "selfkill", "Ends itself with SIGTERM.", command)
    result = cli("run", "selfkill", "now")
    assert result.exit_code == 1
    assert "single (selfkill) failed (killed by SIGTERM)" in result.stderr
    run_id = re.search(r"run ([0-9a-f]{12}) failed", result.stdout)
    assert run_id, result.stdout
    assert re.search(
        r"single\s+selfkill\s+failed \(killed by SIGTERM\)", cli("show", run_id[1]).stdout
    )


#: Runs the CLI (its arguments follow) with SIGINT at its default action, as a terminal's
#: foreground command has it: a command a non-interactive shell starts in the background
#: inherits SIGINT ignored (POSIX), and so would this test's CLI when the suite runs that way.
_WITH_DEFAULT_SIGINT = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'subagents_node', *sys.argv[1:]])",
)


@pytest.mark.parametrize(
    ("signum", "exit_code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
    ids=["ctrl-c", "terminated", "terminal closed"],
)
def test_ctrl_c_sigterm_or_sighup_on_a_foreground_run_stops_it_exit_128_plus_signal(
    node: NodeProcess, state_dir: Path, signum: int, exit_code: int
) -> None:
    """Ctrl-C, and as much a CI job's timeout (SIGTERM) or a closed terminal (SIGHUP): the
    foreground run is stopped, not left running without anyone following it."""
    command = [
        *_WITH_DEFAULT_SIGINT,
        "--state-dir",
        str(state_dir),
        "run",
        "--agents-dir",
        str(EXAMPLE_AGENTS),
    ]
    with subprocess.Popen(
        [*command, "sleeper", "seconds=60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        cwd=REPO,
    ) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        seen = b""
        deadline = time.monotonic() + WAIT_S
        while b"started single" not in seen:
            ready, _, _ = select.select([proc.stderr], [], [], max(0, deadline - time.monotonic()))
            assert ready, seen
            seen += os.read(proc.stderr.fileno(), 4096)
        proc.send_signal(signum)
        try:
            code = proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None  # what it printed says how far its stop got
        out = proc.stdout.read()
        err = seen + proc.stderr.read()
        log = state_dir / "node.log"
        node_log = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        assert code == exit_code, (
            f"exit {code}; stdout: {out!r}; stderr: {err!r}; node.log: {node_log}"
        )
        assert re.search(rb"run [0-9a-f]{12} stopped", out)


def test_fleet_without_a_terminal_is_a_usage_error_pointing_at_once(
    cli: Cli, node: NodeProcess
) -> None:
    """Redrawn into a pipe, the live view printed nothing and never ended."""
    result = cli("fleet")  # click's runner: stdout is no terminal
    assert result.exit_code == 2
    assert "the live view needs a terminal on stdout; use --once" in result.stderr
    assert cli("fleet", "--once").exit_code == 0


def test_fleet_once_json_lists_the_runs_with_full_ids(cli: Cli, node: NodeProcess) -> None:
    run_id = started_async(cli, "echo", "x")
    result = cli("fleet", "--once", "--json")
    assert result.exit_code == 0, result.output
    runs = __import__("json").loads(result.stdout)["runs"]
    assert [r["run_id"] for r in runs] == [run_id]


def test_completion_offers_run_ids_from_the_node_and_nothing_without_one(
    cli: Cli, node: NodeProcess, state_dir: Path
) -> None:
    run_id = started_async(cli, "echo", "x")

    def complete(directory: Path) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "_SUBAGENTS_NODE_COMPLETE": "bash_complete",
            "COMP_WORDS": f"subagents-node --state-dir {directory} show {run_id[:3]}",
            "COMP_CWORD": "4",
        }
        return subprocess.run(_CLI, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)

    offered = complete(state_dir)
    assert offered.returncode == 0 and f"plain,{run_id}" in offered.stdout.splitlines()
    silent = complete(state_dir / "no-node-here")
    assert (silent.returncode, silent.stdout.strip(), silent.stderr) == (0, "", "")
