"""A `SUBAGENTS_*` variable nothing reads is said, one line on stderr, with the known name
closest to it (docs/configuration.md).

Before, a typo such as `SUBAGENTS_MAX_SPAWN_PER_RUN=5` was ignored without a word: the setting
it meant kept its default (64 spawns per run tree), and nothing told the user why. Now every
command (and a detached node's log) says so, and `doctor` lists it among its checks; nothing
is refused (another tool may use a variable of this prefix), and the value, which may be a
secret, is never shown. Real CLI processes and a real detached node.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from subagents_node.client.paths import LOG_NAME
from subagents_node.launch.envnames import ENV_NAMES, known_names, unknown_warnings
from tests.support.nodes import REPO, run_cli

SECRET = "s3cr3t-value-never-shown"
TYPO_WARNING = (
    "warning: unknown environment variable SUBAGENTS_MAX_SPAWN_PER_RUN is ignored "
    "(did you mean SUBAGENTS_MAX_SPAWNS_PER_RUN?)"
)


def typo_env(**more: str) -> dict[str, str]:
    return {**os.environ, "SUBAGENTS_MAX_SPAWN_PER_RUN": SECRET, **more}


def test_a_misspelt_setting_variable_is_named_with_the_closest_known_name_on_stderr(
    state_dir: Path,
) -> None:
    done = run_cli("config", "show", state_dir=state_dir, env=typo_env())

    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [TYPO_WARNING]
    assert SECRET not in done.stdout + done.stderr
    assert "max_subagent_spawns_per_run        64" in done.stdout


def test_with_json_the_warning_is_an_object_as_an_error_is(state_dir: Path) -> None:
    done = run_cli("config", "show", "--json", state_dir=state_dir, env=typo_env())

    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    assert json.loads(line) == {
        "warning": {
            "code": "unknown_variable",
            "message": TYPO_WARNING.removeprefix("warning: "),
            "details": {
                "variable": "SUBAGENTS_MAX_SPAWN_PER_RUN",
                "closest": "SUBAGENTS_MAX_SPAWNS_PER_RUN",
            },
        }
    }
    assert json.loads(done.stdout)["settings"]["max_subagent_spawns_per_run"] == 64


def test_every_known_variable_and_the_tests_own_pass_without_a_word(state_dir: Path) -> None:
    env = {name: "" for name in known_names()}
    env.update(SUBAGENTS_TEST_ANYTHING="1", SUBAGENTS_LAUNCH="x")
    assert unknown_warnings(env) == []
    assert set(ENV_NAMES.values()) <= known_names()

    done = run_cli("config", "show", state_dir=state_dir, env={**os.environ, **env})

    assert done.returncode == 0, done.stderr
    assert "unknown environment variable" not in done.stderr


def test_a_name_close_to_none_gets_no_guess() -> None:
    """The shared prefix made any name look close: `SUBAGENTS_FOO` got "did you mean
    SUBAGENTS_NODE?"."""
    assert unknown_warnings({"SUBAGENTS_FOO": "1", "SUBAGENTS_MAX_DEPHT": "3"}) == [
        "unknown environment variable SUBAGENTS_FOO is ignored (no setting has this name)",
        "unknown environment variable SUBAGENTS_MAX_DEPHT is ignored "
        "(did you mean SUBAGENTS_MAX_DEPTH?)",
    ]


def test_every_variable_the_docs_name_is_known() -> None:
    """A documented variable must never be called unknown (`_SUBAGENTS_NODE_COMPLETE`, click's
    completion variable, has another prefix)."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = {
        match
        for path in docs
        for match in re.findall(r"(?<![A-Z_])SUBAGENTS_[A-Z0-9_]*[A-Z0-9]", path.read_text())
    }
    # The typo the pages show as an example, and the tests' own switches, are no settings.
    examples = {"SUBAGENTS_MAX_SPAWN_PER_RUN", "SUBAGENTS_TEST"}
    named = {n for n in named if not n.startswith("SUBAGENTS_TEST_")} - examples
    assert named and named <= known_names(), named - known_names()


def test_doctor_lists_a_misspelt_variable_as_a_warning_and_does_not_repeat_it_on_stderr(
    state_dir: Path,
) -> None:
    done = run_cli("doctor", state_dir=state_dir, env=typo_env())

    assert TYPO_WARNING.replace("warning: ", "[warn] environment: ") in done.stdout.splitlines()
    assert "unknown environment variable" not in done.stderr
    assert SECRET not in done.stdout + done.stderr


def test_a_detached_node_started_with_a_misspelt_variable_says_so_and_logs_it(
    state_dir: Path,
) -> None:
    done = run_cli("start", "--detach", state_dir=state_dir, env=typo_env())
    try:
        assert done.returncode == 0, done.stderr
        assert TYPO_WARNING in done.stderr.splitlines()
        log = (state_dir / LOG_NAME).read_text()
        assert TYPO_WARNING.removeprefix("warning: ") in log
        assert SECRET not in done.stderr + log
    finally:
        assert run_cli("stop", state_dir=state_dir).returncode == 0
