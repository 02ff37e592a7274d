"""Usage errors exit 2, as the exit-code table of docs/cli.md says, and change nothing.

A careless user's values (a timeout of 1e-300 seconds, a deadline of 0 ms, `start --home`
without a tcp endpoint) used to be taken, or refused with exit 1 (a ledger's refusal or a
run that failed, to a script) after the command had gone some way. Each is a one-line usage
error now, before any node is asked or started, and the state dir is not even created.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.nodes import CLI, REPO, NodeProcess, new_state_dir, run_cli
from tests.support.runs import EXAMPLE_AGENTS

USAGE = 2


@pytest.fixture
def unused_state_dir() -> Iterator[Path]:
    """A state dir path that does not exist: a usage error must not create it."""
    parent = new_state_dir()
    yield parent / "state"
    shutil.rmtree(parent, ignore_errors=True)


def _usage_error(done: subprocess.CompletedProcess[str], option: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == USAGE, (done.returncode, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert option in lines[0], lines[0]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--timeout", "1e-300", "ping"],
        ["--timeout", "1e-9", "status"],
        ["--timeout", "0.0009", "runs"],
        ["wait", "000000000000", "--timeout", "1e-300"],
        ["logs", "000000000000", "-f", "--node-wait", "1e-300"],
        ["start", "--home", "--listen", "tcp://127.0.0.1:1", "--heartbeat", "1e-300"],
        ["start", "--home", "--listen", "tcp://127.0.0.1:1", "--heartbeat-timeout", "0.01"],
    ],
)
def test_a_duration_too_small_to_be_a_wait_is_a_usage_error(
    args: list[str], unused_state_dir: Path
) -> None:
    """`--timeout 1e-300` was taken: every request then timed out at once with a message
    blaming a node that was fine (exit 4), or with no node, exit 3; a home's `--heartbeat
    1e-300` would have had every worker spin on its home. A millisecond is the least wait
    (a tenth of a second the least heartbeat)."""
    option = args[-2] if args[0] != "--timeout" else "--timeout"
    done = run_cli(*args, state_dir=unused_state_dir, timeout=30)
    _usage_error(done, option)
    assert not unused_state_dir.exists()


@pytest.mark.parametrize("value", ["0", "-5", "99999999999"])
def test_an_out_of_range_timeout_ms_is_a_usage_error(value: str, unused_state_dir: Path) -> None:
    """`run … --timeout-ms 0` and `workflow … --timeout-ms 0` exited 1 (the table's "refused
    by a ledger, invalid input, or a run that did not complete"), unlike every other option
    out of its range, which exits 2."""
    agents = ("--agents-dir", str(EXAMPLE_AGENTS))
    done = run_cli(
        "run", *agents, "sleeper", "seconds=0", "--timeout-ms", value, state_dir=unused_state_dir
    )
    _usage_error(done, "--timeout-ms")
    script = Path(__file__)  # any readable file: the option is refused before it is read
    done = run_cli("workflow", str(script), "--timeout-ms", value, state_dir=unused_state_dir)
    _usage_error(done, "--timeout-ms")
    assert not unused_state_dir.exists()


def test_start_home_without_a_tcp_endpoint_is_a_usage_error(unused_state_dir: Path) -> None:
    """`start --home` without `--listen tcp://…` exited 1 (the node's own options check, a
    ConfigError), while `--join` without `--home-key` and the other flag mistakes exit 2."""
    done = run_cli("start", "--home", state_dir=unused_state_dir)
    _usage_error(done, "--listen tcp://")
    done = run_cli("start", "--home", "--listen", "ipc:///tmp/x.sock", state_dir=unused_state_dir)
    _usage_error(done, "--listen tcp://")
    assert not (unused_state_dir / "node.pid").exists()


def test_logs_node_wait_without_follow_is_a_usage_error(unused_state_dir: Path) -> None:
    """`logs RUN --node-wait 60` printed the logs once and ignored the wait it was given."""
    done = run_cli("logs", "000000000000", "--node-wait", "60", state_dir=unused_state_dir)
    _usage_error(done, "--node-wait: only with -f")
    assert not unused_state_dir.exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--heartbeat", "2"], "--heartbeat: only with --home"),
        (["--heartbeat", "10"], "--heartbeat: only with --home"),  # not "timeout must be longer"
        (["--heartbeat-timeout", "9"], "--heartbeat-timeout: only with --home"),
        (
            ["--join", "tcp://127.0.0.1:1", "--home-key", "k", "--name", "w", "--heartbeat", "2"],
            "--heartbeat: only with --home",
        ),
    ],
)
def test_a_homes_heartbeat_flag_on_another_node_is_a_usage_error(
    args: list[str], said: str, unused_state_dir: Path
) -> None:
    """`start --heartbeat 2` without --home started a node that ignored it (a worker beats at
    its home's rate), while `--name` without --join was refused; `--heartbeat 10` alone said
    "--heartbeat-timeout must be longer than --heartbeat", of flags the node would not use."""
    # In the foreground: a start that is not refused serves until this timeout kills it.
    done = run_cli("start", *args, state_dir=unused_state_dir, timeout=15)
    _usage_error(done, said)
    assert not (unused_state_dir / "node.pid").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--agents-dir", str(EXAMPLE_AGENTS), "sleeper", "seconds=0", "--cwd", ""],
        ["run", "--parallel", ""],
        ["run", "--chain", " "],
        ["append", "000000000000", ""],
        ["workflow", "", "--cwd", "/"],
        ["workflow", str(Path(__file__)), "--cwd", ""],
    ],
)
def test_an_empty_path_is_a_usage_error_not_the_working_directory(
    args: list[str], unused_state_dir: Path
) -> None:
    """click took an empty path as `.`: `run … --cwd "$DIR"` with DIR unset ran the agent in
    the working directory (exit 0), and `--chain ""` said "cannot read ." (exit 1). As with
    `--state-dir ""`, an empty or blank path is refused before anything runs."""
    done = run_cli(*args, state_dir=unused_state_dir)
    assert done.returncode == USAGE, (done.returncode, done.stderr)
    assert "is empty or blank: give a path" in done.stderr, done.stderr
    assert not unused_state_dir.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["rerun", "000000000000", "--task", ""],
        ["keys", "revoke", ""],
        ["nodes", "forget", "w1", "--reason", ""],
        ["intercom", "send", "", "--run", "000000000000"],
        # `--on "$WORKER"` with WORKER unset ran the run on the home itself (exit 0)
        ["run", "--agents-dir", str(EXAMPLE_AGENTS), "--on", "", "sleeper", "seconds=0"],
    ],
)
def test_an_empty_text_is_a_usage_error_naming_the_option(
    args: list[str], unused_state_dir: Path
) -> None:
    """An empty task, reason, message or key name went to the node (or the allow-list) and came
    back as "invalid runs.rerun request: task: String should have at least 1 character" (exit
    1): a request's name and field the user never typed. It is the option's usage error now."""
    done = run_cli(*args, state_dir=unused_state_dir)
    assert done.returncode == USAGE, (done.returncode, done.stderr)
    assert "is empty" in done.stderr and "request" not in done.stderr, done.stderr
    assert not unused_state_dir.exists()


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_closed_standard_stream_is_dev_null_not_a_traceback(
    closed: str, start_node: Callable[..., NodeProcess]
) -> None:
    """`subagents-node runs >&-` (stdout closed, as some cron and daemon setups leave it) ended
    in a Python traceback (sys.stdout was None), and a foreground `run … 2>&-` exited 1 after
    its run completed. A closed stream is /dev/null from the start."""
    node = start_node()
    agents = ("--agents-dir", str(EXAMPLE_AGENTS))
    if closed == "stdout":  # `runs` has one to list (its table asked stdout if it is a tty)
        ran = run_cli("run", *agents, "sleeper", "seconds=0", state_dir=node.state_dir)
        assert ran.returncode == 0, ran.stderr
    command = ("runs",) if closed == "stdout" else ("run", *agents, "sleeper", "seconds=0")
    done = subprocess.run(
        ["sh", "-c", f'exec "$@" {">&-" if closed == "stdout" else "2>&-"}', "sh", *CLI,
         "--state-dir", str(node.state_dir), *command],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    if closed == "stderr":
        assert re.search(r"run [0-9a-f]{12} complete", done.stdout), done.stdout


@pytest.mark.parametrize("command", [["doctor"], ["agents"], ["config", "show"]])
def test_a_removed_working_directory_is_named_not_a_traceback(
    command: list[str], unused_state_dir: Path
) -> None:
    """In a shell whose directory was removed, `doctor` ended in a traceback
    (`FileNotFoundError` from Path.cwd()) and `agents`, `run`, `config show` said only
    "error: No such file or directory", naming no file."""
    gone = new_state_dir()
    try:
        done = subprocess.run(
            ["sh", "-c", f'cd {shlex.quote(str(gone))} && rmdir "$PWD" && exec "$@"', "sh",
             *CLI, "--state-dir", str(unused_state_dir), *command],
            capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        shutil.rmtree(gone, ignore_errors=True)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: the working directory no longer exists (removed or renamed under this shell); "
        "cd to one that does"
    ]
