"""What a launch carries from the caller's environment and working directory: text only.

A request carries the environment, the working directory and the session as UTF-8 text. A
variable, a directory name or a session whose bytes are not UTF-8 (Python holds them as lone
surrogates) used to fail every launch with "invalid Launch request: env.OLDPWD: Input should
be a valid string, unable to parse raw data as a unicode string". Real processes, a real node.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.support.nodes import NodeProcess, run_cli
from tests.support.run_fixtures import agents as agents

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
