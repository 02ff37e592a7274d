"""What a launch carries from the caller's environment and working directory: text only.

A request carries the environment, the working directory and the session as UTF-8 text. A
variable, a directory name or a session whose bytes are not UTF-8 (Python holds them as lone
surrogates) used to fail every launch with "invalid Launch request: env.OLDPWD: Input should
be a valid string, unable to parse raw data as a unicode string". Real processes, a real node.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.support.nodes import NodeProcess, run_cli
from tests.support.run_fixtures import agents as agents
from tests.support.runs import EXAMPLE_AGENTS

#: What `cd` into a Latin-1 directory leaves in OLDPWD: bytes that are not UTF-8.
LATIN1_DIR = "caf\udce9"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def test_a_variable_that_is_not_utf8_is_left_out_of_a_launch_with_a_warning(
    node: NodeProcess, agents: Path
) -> None:
    env = _env(OLDPWD=f"/tmp/{LATIN1_DIR}", SUBAGENTS_TEST_OK="kept")
    ran = run_cli(
        "run", "--agents-dir", str(agents), "echo", "hello", state_dir=node.state_dir, env=env
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.rstrip().endswith("hello")
    assert (
        "the children do not get 1 environment variable(s) whose name or value is not UTF-8 "
        "text (a launch carries text only): 'OLDPWD'"
    ) in ran.stderr
    assert "Traceback" not in ran.stderr and "invalid Launch request" not in ran.stderr
    run_id = re.search(r"run ([0-9a-f]{12}) complete", ran.stdout)
    assert run_id, ran.stdout
    again = run_cli("rerun", "-t", "again", run_id.group(1), state_dir=node.state_dir, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.rstrip().endswith("again")


def test_a_working_directory_whose_name_is_not_utf8_is_a_one_line_error_naming_it(
    node: NodeProcess, agents: Path
) -> None:
    where = node.state_dir / LATIN1_DIR
    where.mkdir()
    ran = run_cli(
        "run",
        "--agents-dir",
        str(agents),
        "--cwd",
        str(where),
        "echo",
        "hello",
        state_dir=node.state_dir,
    )
    assert ran.returncode == 1
    assert ran.stderr == (
        f"error: working directory is not usable: its name is not UTF-8 text: {str(where)!a}\n"
    )


def test_a_session_variable_that_is_not_utf8_is_refused_naming_the_variable(
    node: NodeProcess, agents: Path
) -> None:
    env = _env(SUBAGENTS_SESSION="s\udcff")
    ran = run_cli(
        "run", "--agents-dir", str(agents), "echo", "hello", state_dir=node.state_dir, env=env
    )
    assert ran.returncode == 1
    assert ran.stderr.startswith("error: $SUBAGENTS_SESSION is not a session id"), ran.stderr
    assert ran.stderr.count("\n") == 1


def test_a_leftover_run_id_variable_at_depth_0_is_no_parent_for_capacity_or_stop(
    node: NodeProcess, agents: Path
) -> None:
    """R-TOP-1: with $SUBAGENTS_RUN_ID set in a top-level shell (exported for `intercom
    send`, copied from a child's environment) every launch was sent as that run's nested
    launch: a background run took no capacity slot, so the session's limit let any number in,
    and when that run had been stopped every new run was stopped at once."""
    dirs = ["--agents-dir", str(agents), "--agents-dir", str(EXAMPLE_AGENTS)]

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli("run", *dirs, *args, state_dir=node.state_dir, env=env)

    stopped = run("--async", "sleeper", "seconds=60")
    assert stopped.returncode == 0, stopped.stderr
    old = stopped.stdout.strip()
    assert run_cli("stop", old, state_dir=node.state_dir).returncode == 0
    env = _env(
        SUBAGENTS_RUN_ID=old,
        SUBAGENTS_SESSION="leftover-run-id",
        SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION="1",
    )
    env.pop("SUBAGENTS_DEPTH", None)
    ran = run("echo", "hello", env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.rstrip().endswith("hello")
    launched = [run("--async", "sleeper", "seconds=60", env=env) for _ in range(2)]
    try:
        assert launched[0].returncode == 0, launched[0].stderr
        assert launched[1].returncode == 1, launched[1].stdout
        assert "capacity exhausted: 1/1 used" in launched[1].stderr
    finally:
        for done in launched:
            if done.returncode == 0:
                run_cli("stop", done.stdout.strip(), state_dir=node.state_dir)


def test_an_argument_that_is_not_utf8_is_named_as_such(node: NodeProcess) -> None:
    """A task, a reason or a message holding a byte that is no UTF-8 character was refused as
    "Input should be a valid string, unable to parse raw data as a unicode string"."""
    done = run_cli("reject", "--reason", "bad \udcff byte", "zzzz", state_dir=node.state_dir)
    assert done.returncode == 1
    assert done.stderr == (
        "error: invalid runs.reject request: reason: not UTF-8 text (it holds a byte that is "
        "no UTF-8 character)\n"
    )
