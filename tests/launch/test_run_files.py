"""Run files (`run --parallel` / `--chain`, `append`, `attach`, and the MCP tools' `tasks` /
`chain`) refuse what they would otherwise drop: a key that means nothing in its place is a
one-line RunFileInvalid naming it, never a launch that silently does less than was written
(SPEC §0.4: a typo must not pass silently); an inherited session id is held to the rule its
option follows. No node: LaunchContext only builds the request."""

from __future__ import annotations

from typing import Any

import pytest

from subagents_node.launch.launcher import resolve_session
from subagents_node.messages.errors import ConfigError, RunFileInvalid
from tests.support.runs import launch_context

SLEEP = {"agent": "sleeper", "task": "seconds=0"}


@pytest.mark.parametrize(
    ("mode", "data", "reason"),
    [
        ("parallel", {"tasks": [SLEEP], "concurency": 2}, "unknown keys ['concurency']"),
        ("chain", {"steps": [SLEEP], "tasks": [SLEEP]}, "unknown keys ['tasks'] in a chain"),
        ("parallel", {"tasks": [SLEEP], "steps": [SLEEP]}, "unknown keys ['steps']"),
        (
            "chain",
            {"steps": [{**SLEEP, "parallel": [SLEEP]}]},
            "a parallel step has no other keys: ['agent', 'task']",
        ),
        ("chain", {"steps": [{"parallel": [SLEEP], "bogus": 1}]}, "no other keys: ['bogus']"),
        (
            "chain",
            {"steps": [SLEEP, {**SLEEP, "expand": True, "max_items": True}]},
            "'max_items' is a positive integer",
        ),
        (
            "chain",
            {"steps": [SLEEP, {**SLEEP, "expand": True, "max_items": 2.0}]},
            "'max_items' is a positive integer",
        ),
        ("parallel", {"tasks": [{**SLEEP, "cwd": 5}]}, "a task's 'cwd' is a string, not 5"),
        ("chain", {"steps": [{**SLEEP, "output": True}]}, "a task's 'output' is a string"),
        (
            "parallel",
            {"tasks": [{**SLEEP, "cwd": "/tmp/" + "a" * 256}]},
            "a task's cwd: ",
        ),
    ],
    ids=[
        "typo at the top",
        "tasks in a chain file",
        "steps in a parallel file",
        "agent and task beside parallel",
        "unknown key beside parallel",
        "max_items true",
        "max_items float",
        "cwd a number",
        "output a bool",
        "cwd past NAME_MAX",
    ],
)
def test_a_key_a_run_file_would_drop_is_refused_naming_it(
    mode: Any, data: dict[str, Any], reason: str
) -> None:
    ctx = launch_context()
    with pytest.raises(RunFileInvalid) as caught:
        ctx.from_mapping(mode, data, True, None, path="run.toml")
    assert caught.value.message.startswith("run.toml: ")
    assert reason in caught.value.message


def test_the_documented_shapes_still_launch() -> None:
    ctx = launch_context()
    parallel = ctx.from_mapping("parallel", {"tasks": [SLEEP, SLEEP], "concurrency": 2}, True, None)
    assert len(parallel.items) == 2 and parallel.concurrency == 2
    chain = ctx.from_mapping(
        "chain",
        {
            "steps": [
                SLEEP,
                {"parallel": [SLEEP, SLEEP]},
                {"checkpoint": "look"},
                {**SLEEP, "expand": True, "max_items": 3},
            ]
        },
        True,
        None,
    )
    assert [s.kind for s in chain.chain] == ["run", "run", "checkpoint", "expand"]
    assert chain.chain[1].parallel and chain.chain[3].max_items == 3


@pytest.mark.parametrize("raw", ["a\nb", "tab\there", "x" * 257])
def test_an_inherited_session_id_is_held_to_the_session_options_rule(raw: str) -> None:
    """$SUBAGENTS_SESSION with a newline was accepted (and split every `runs` row in two)
    while `--session` with the same value was refused."""
    with pytest.raises(ConfigError) as caught:
        resolve_session(None, {"SUBAGENTS_SESSION": raw})
    assert caught.value.source == "SUBAGENTS_SESSION"
    assert "\n" not in caught.value.message
    assert resolve_session("given", {"SUBAGENTS_SESSION": raw}) == "given"
    assert resolve_session(None, {"SUBAGENTS_SESSION": " ok "}) == "ok"
