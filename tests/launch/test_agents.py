"""Agents: parsing, discovery and priority, errors, task delivery (SPEC §0.2, R-AGT-1..3,
R-EXT-3, R-TSK-1), and the shipped example agents doing real work in real processes."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from subagents_node.launch.agents import (
    AUTO_FILE_THRESHOLD,
    Agent,
    Invocation,
    child_environment,
    discover_agents,
    find_agent,
    parse_agent,
    prepare_invocation,
    stdin_text,
)
from subagents_node.launch.launcher import agent_plan
from subagents_node.messages.constants import ENV_FANOUT
from subagents_node.messages.domains import MAX_ARG_BYTES, MAX_TASK_CHARS
from subagents_node.messages.errors import (
    AgentCommandNotFound,
    AgentInvalid,
    AgentNotFound,
    BadRequest,
    SubagentsError,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"
REPO = EXAMPLES.parent.parent


def agent_file(directory: Path, name: str, front: str, body: str = "Be useful.") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.md"
    path.write_text(f"---\n{textwrap.dedent(front).strip()}\n---\n{body}\n")
    return path


def simple(name: str, description: str = "d", command: str = '["echo", "{task}"]') -> str:
    return f"name: {name}\ndescription: {description}\ncommand: {command}\n"


def parse(front: str, body: str = "Be useful.", path: Path = Path("/x/a.md")) -> Agent:
    return parse_agent(f"---\n{textwrap.dedent(front).strip()}\n---\n{body}", path)


def invocation(
    agent: Agent, task: str, run_dir: Path, env: Mapping[str, str] | None = None, **kw: Any
) -> Invocation:
    return prepare_invocation(agent, task, run_dir, environ=env or os.environ, **kw)


# -- parsing ---------------------------------------------------------------------------------------


def test_r_agt_1_front_matter_fields_and_the_body_as_system_prompt() -> None:
    agent = parse(
        """
        name: scout
        description: Finds things.
        command: ["{python}", "{agent_dir}/scout.py", "{task}"]
        task_delivery: argv
        timeout_ms: 120000
        env: {LEVEL: "3"}
        output: report.md
        fanout: true
        async: false
        max_subagent_depth: 1
        cwd: sub
        """,
        body="\n  You are a scout.\n\n",
    )
    assert agent.name == "scout" and agent.description == "Finds things."
    assert agent.command == ("{python}", "{agent_dir}/scout.py", "{task}")
    assert agent.task_delivery == "argv" and agent.timeout_ms == 120000
    assert dict(agent.env) == {"LEVEL": "3"} and agent.output == "report.md"
    assert agent.fanout is True and agent.run_async is False
    assert agent.max_subagent_depth == 1 and agent.cwd == "sub"
    assert agent.system_prompt == "You are a scout."
    assert agent.agent_dir == "/x" and agent.extras == {}


def test_defaults_auto_delivery_no_fanout_no_output() -> None:
    agent = parse(simple("a"))
    assert (agent.task_delivery, agent.fanout, agent.output, agent.timeout_ms) == (
        "auto",
        False,
        None,
        None,
    )


def test_a_command_string_is_split_like_a_shell_would_with_no_shell() -> None:
    agent = parse(simple("a", command="""python3 -c 'print("a b")' {task}"""))
    assert agent.command == ("python3", "-c", 'print("a b")', "{task}")


def test_output_false_means_no_output_file() -> None:
    assert parse(simple("a") + "output: false").output is None


def test_r_agt_2_unknown_keys_are_kept_as_extras_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        agent = parse(simple("a") + "model: big\ntools: [read, subagent]")
    assert agent.extras == {"model": "big", "tools": ["read", "subagent"]}
    assert "unknown keys kept as extras" in caplog.text and "model" in caplog.text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("name: a\ncommand: [x]", "description"),
        ("description: d\ncommand: [x]", "name"),
        ("name: a\ndescription: d", "command"),
        ("name: a\ndescription: d\ncommand: []", "command"),
        ('name: a\ndescription: d\ncommand: ["", "{task}"]', "the program (its first item)"),
        ("name: a\ndescription: d\ncommand: ['  ']", "the program (its first item) is empty"),
        ("name: a\ndescription: d\ncommand: [echo, 3]", "command.1"),
        (simple("a") + "timeout_ms: 0", "timeout_ms"),
        (simple("a") + "timeout_ms: 2147483648", "timeout_ms"),
        (simple("a") + "timeout_ms: '1000'", "timeout_ms"),
        (simple("a") + "async: maybe", "async"),  # R-AGT-3: strictly true/false
        (simple("a") + "fanout: 'yes'", "fanout"),
        (simple("a") + "max_subagent_depth: -1", "max_subagent_depth"),
        (simple("a") + "env: {PORT: 8080}", "env"),
        (simple("a") + "output: true", "output"),
        # YAML's unquoted booleans, numbers and dates, where a text is expected: said so.
        (
            "name: yes\ndescription: d\ncommand: [x]",
            "name: Input should be a valid string "
            "(YAML reads this unquoted value as a boolean: put it in quotes)",
        ),
        ("name: a\ndescription: 2024\ncommand: [x]", "as a number: put it in quotes"),
        ("name: a\ndescription: 2024-06-01\ncommand: [x]", "as a date: put it in quotes"),
        (
            "name: a\ndescription: d\ncommand: [echo, 3]",
            "command.1: Input should be a valid string (YAML reads this unquoted value as a number",
        ),
        (simple("a") + "task_delivery: carrier-pigeon", "task_delivery"),
        (simple("a", command='["tool"]') + "task_delivery: argv", "needs a {task}"),
        (simple("a") + "task_delivery: stdin", "cannot use a {task}"),
        ("name: [unclosed\ndescription: d", "bad YAML front matter"),
        ("- just\n- a list", "not a mapping"),
        ("name: 'bad name!'\ndescription: d\ncommand: [x]", "name"),
        # What the wire's domains refuse is refused here too, as this file's own error
        # (never a traceback when the launcher turns the agent into a request).
        (simple("a") + "env: {'A=B': x}", "env.A=B.[key]: Value error, an environment variable"),
        (simple("a") + 'env: {A: "nul\\0byte"}', "env.A"),
        (simple("a", command='["echo", "nul\\0byte"]'), "command.1"),
        (simple("a") + "max_subagent_depth: 1099511627776", "max_subagent_depth"),
        (simple("a") + 'output: "out\\0put"', "output"),
        (simple("a") + "cwd: " + "d" * 300, "cwd"),
        (simple("a") + "env: {A: 1}", "env.A"),
        (simple("a") + "x: " + "[" * 3000 + "]" * 3000, "bad YAML front matter: nested too deeply"),
    ],
)
def test_r_agt_1_invalid_front_matter_is_a_clear_error_naming_file_and_reason(
    text: str, reason: str
) -> None:
    """R-EXT-1 too, for what it says of a command: present, a non-empty program name, and
    arguments that are strings; the delivery is one this product knows."""
    with pytest.raises(AgentInvalid) as caught:
        parse_agent(f"---\n{text}\n---\nbody\n", Path("/agents/a.md"))
    assert caught.value.path == "/agents/a.md"
    assert reason in caught.value.reason
    assert caught.value.message.startswith("Invalid agent file /agents/a.md: ")


def test_a_description_is_one_line_whatever_the_yaml_said() -> None:
    agent = parse('name: a\ndescription: "line one\\n  line two\\t end"\ncommand: [x]')
    assert agent.description == "line one line two end"


def test_a_system_prompt_over_the_task_size_cap_is_an_invalid_agent_file() -> None:
    with pytest.raises(AgentInvalid, match=r"the body \(system prompt\) is longer than"):
        parse_agent(f"---\n{simple('a')}---\n{'x' * (MAX_TASK_CHARS + 1)}\n", Path("/a.md"))


def test_every_agent_the_parser_accepts_becomes_a_wire_agent_plan() -> None:
    """The launcher turns a parsed agent into an AgentPlan without validating again: the
    parser's bounds must be the wire's, at their largest."""
    front = (
        simple("a" * 128, command=f'["echo", "{"y" * (MAX_ARG_BYTES - 1)}", "{{task}}"]')
        + f"env: {{{'N' * 1024}: {'v' * (MAX_ARG_BYTES - 1)}}}\n"
        + f"max_subagent_depth: {2**31 - 1}\ntimeout_ms: {2**31 - 1}\n"
        + f"output: {'o' * 255}\ncwd: {'c' * 255}\n"
    )
    agent = parse_agent(f"---\n{front}---\n{'p' * MAX_TASK_CHARS}\n", Path("/agents/a.md"))
    plan = agent_plan(agent)
    assert plan.command[1] == "y" * (MAX_ARG_BYTES - 1)
    assert len(plan.system_prompt) == MAX_TASK_CHARS


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no front matter at all\n", "no YAML front matter"),
        ("---\nname: a\ndescription: d\n", "not closed"),
    ],
)
def test_a_file_without_closed_front_matter_is_invalid(text: str, reason: str) -> None:
    with pytest.raises(AgentInvalid, match=reason):
        parse_agent(text, Path("/agents/a.md"))


def test_bad_yaml_names_the_line_of_the_file() -> None:
    with pytest.raises(AgentInvalid) as caught:
        parse_agent("---\nname: a\ndescription: d\ncommand: [x\n---\n", Path("/a.md"))
    assert "(line 5)" in caught.value.reason


def test_a_character_yaml_refuses_is_one_line_naming_the_files_line(
    tmp_path: Path,
) -> None:
    """An escape in the front matter gave PyYAML's two-line text (`in "<unicode string>",
    position 6`): the loader's log line (every command that discovers agents prints it) and
    `agents`' own warning (docs/agents.md) each spilled onto a second line."""
    with pytest.raises(AgentInvalid) as caught:
        parse_agent("---\nname: a\ndescription: \x1b[31mred\n---\n", Path("/a.md"))
    assert caught.value.reason == "bad YAML front matter: character #x001b is not allowed (line 3)"
    agent_file(tmp_path / "agents", "red", "name: red\ndescription: \x1b[31mred")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "subagents_node",
            "--state-dir",
            str(tmp_path / "s"),
            "agents",
            "--agents-dir",
            str(tmp_path / "agents"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.endswith("not allowed (line 3)") for line in lines), lines


def test_agent_errors_cross_the_wire_as_their_own_type() -> None:
    err = AgentNotFound.of("ghost", ["b", "a"])
    again = SubagentsError.from_wire(err.to_wire())
    assert isinstance(again, AgentNotFound)
    assert again.available == ["a", "b"] and again.name == "ghost"


# -- discovery -------------------------------------------------------------------------------------


@pytest.fixture
def dirs(tmp_path: Path, isolated_env: Path) -> dict[str, Path]:
    """A project (cwd) with .subagents/agents, the user dir under $XDG_CONFIG_HOME, one
    explicit dir."""
    project = tmp_path / "project"
    return {
        "cwd": project,
        "project": project / ".subagents" / "agents",
        "user": isolated_env / "config" / "subagents-node" / "agents",
        "explicit": tmp_path / "explicit",
        "explicit2": tmp_path / "explicit2",
    }


def test_r_agt_1_project_overrides_user_and_explicit_overrides_project(
    dirs: dict[str, Path],
) -> None:
    for scope in ("user", "project", "explicit"):
        agent_file(dirs[scope], "same", simple("same", description=scope))
    agent_file(dirs["user"], "only-user", simple("only-user"))
    cwd, explicit = dirs["cwd"], [dirs["explicit"]]

    assert find_agent("same", cwd, explicit).description == "explicit"
    assert find_agent("same", cwd).description == "project"
    assert find_agent("same", dirs["explicit"]).scope == "user"  # no project dir there
    catalog = discover_agents(cwd, explicit)
    assert catalog.names() == ["only-user", "same"]
    assert catalog.get("only-user").scope == "user"


def test_the_first_explicit_agents_dir_wins_over_later_ones(dirs: dict[str, Path]) -> None:
    agent_file(dirs["explicit"], "a", simple("a", description="first"))
    agent_file(dirs["explicit2"], "a", simple("a", description="second"))
    assert find_agent("a", dirs["cwd"], [dirs["explicit"], dirs["explicit2"]]).description == (
        "first"
    )


def test_an_agents_dir_named_twice_is_searched_once_where_it_ranks_highest(
    dirs: dict[str, Path],
) -> None:
    """An MCP call naming one directory 20,000 times (`agents_dirs`) read its agents 20,000
    times, 14 s on the server's event loop with every other call waiting, and listed each
    broken file once per mention. Searched once, it ranks where it was first named."""
    agent_file(dirs["explicit"], "a", simple("a", description="first"))
    agent_file(dirs["explicit"], "broken", "name: broken\ncommand: [x]")  # no description
    agent_file(dirs["explicit2"], "a", simple("a", description="second"))
    again = [dirs["explicit"], dirs["explicit2"], *[dirs["explicit"]] * 500]
    catalog = discover_agents(dirs["cwd"], again)
    assert catalog.get("a").description == "first"
    assert [Path(p.path).name for p in catalog.problems] == ["broken.md"]
    assert [d.path for d in catalog.directories][:2] == [dirs["explicit"], dirs["explicit2"]]
    assert len(catalog.directories) == 4  # and the project's and the user's


def test_r_agt_1_chain_files_are_not_agents_and_subdirectories_are_searched(
    dirs: dict[str, Path],
) -> None:
    agent_file(dirs["project"], "review.chain", simple("review"))
    agent_file(dirs["project"] / "team", "nested", simple("nested"))
    assert discover_agents(dirs["cwd"]).names() == ["nested"]


def test_unknown_agent_error_lists_the_names_that_exist(dirs: dict[str, Path]) -> None:
    agent_file(dirs["project"], "scout", simple("scout"))
    agent_file(dirs["user"], "writer", simple("writer"))
    with pytest.raises(AgentNotFound) as caught:
        find_agent("ghost", dirs["cwd"])
    assert caught.value.available == ["scout", "writer"]
    assert caught.value.message == "Unknown agent 'ghost'. Available agents: scout, writer."


def test_r_agt_1_an_invalid_file_is_skipped_but_raised_when_asked_for_by_name(
    dirs: dict[str, Path],
) -> None:
    agent_file(dirs["project"], "good", simple("good"))
    agent_file(dirs["project"], "broken", "name: broken\ncommand: [x]")  # no description
    catalog = discover_agents(dirs["cwd"])
    assert catalog.names() == ["good"]
    assert [Path(p.path).name for p in catalog.problems] == ["broken.md"]
    with pytest.raises(AgentInvalid, match="description"):
        catalog.get("broken")


def test_an_explicit_agents_dir_that_does_not_exist_is_an_error(dirs: dict[str, Path]) -> None:
    with pytest.raises(AgentInvalid) as refused:
        discover_agents(dirs["cwd"], [dirs["cwd"] / "nope"])
    # It names a directory, not an "agent file" (docs/agents.md: an explicit directory).
    assert refused.value.message == (
        f"Invalid agents directory {dirs['cwd'] / 'nope'} "
        "(--agents-dir, SUBAGENTS_AGENT_DIRS or agent_dirs): agents directory does not exist"
    )
    assert refused.value.reason == "agents directory does not exist"


def test_an_explicit_agents_dir_that_is_a_file_is_named_as_not_a_directory(
    dirs: dict[str, Path],
) -> None:
    """A file given as --agents-dir was refused as "agents directory does not exist" although
    it was right there: the user went looking for a missing path."""
    plain = dirs["cwd"] / "notes.md"
    plain.parent.mkdir(parents=True, exist_ok=True)
    plain.write_text("not a directory\n")
    with pytest.raises(AgentInvalid) as refused:
        discover_agents(dirs["cwd"], [plain])
    assert refused.value.reason == "agents directory is not a directory"


def test_the_shipped_examples_are_valid_agents() -> None:
    catalog = discover_agents(EXAMPLES, [EXAMPLES])
    assert catalog.problems == ()
    assert {"scout", "summarizer", "recursive", "sleeper"} <= set(catalog.names())
    assert catalog.get("recursive").fanout is True
    assert catalog.get("scout").fanout is False


# -- command resolution ----------------------------------------------------------------------------


def test_command_not_on_path_is_a_clear_error(tmp_path: Path) -> None:
    agent = parse(simple("a", command='["no-such-agent-cli-xyz", "{task}"]'))
    with pytest.raises(AgentCommandNotFound) as caught:
        invocation(agent, "t", tmp_path / "run", cwd=tmp_path)
    assert caught.value.command == "no-such-agent-cli-xyz"
    assert "not on PATH" in caught.value.message
    assert not (tmp_path / "run").exists()  # nothing written before the checks passed


def test_a_dot_slash_command_is_found_beside_the_agent_file_and_must_be_executable(
    tmp_path: Path,
) -> None:
    agents = tmp_path / "agents"
    path = agent_file(agents, "local", simple("local", command='["./tool.sh", "{task}"]'))
    tool = agents / "tool.sh"
    tool.write_text('#!/bin/sh\necho "$1"\n')
    agent = parse_agent(path.read_text(), path)
    with pytest.raises(AgentCommandNotFound, match="no executable file"):
        invocation(agent, "t", tmp_path / "run", cwd=tmp_path)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert invocation(agent, "t", tmp_path / "run", cwd=tmp_path).argv[0] == str(tool)


def test_the_python_placeholder_is_this_interpreter_and_agent_dir_the_file_dir(
    tmp_path: Path,
) -> None:
    agent = parse(simple("a", command='["{python}", "{agent_dir}/x.py", "{task}"]'))
    inv = invocation(agent, "t", tmp_path, cwd=tmp_path)
    assert inv.argv == (sys.executable, "/x/x.py", "t")


def test_a_relative_agents_dir_gives_its_agents_an_absolute_agent_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--agents-dir agents` kept `{agent_dir}` relative: a command `{agent_dir}/tool.sh` was
    looked for at `agents/agents/tool.sh`, and an argument `{agent_dir}/x.py` resolved against
    the child's `--cwd` (the README's own `--agents-dir examples/agents` under `--cwd`)."""
    directory = tmp_path / "agents"
    agent_file(directory, "tool", simple("tool", command='["{agent_dir}/tool.sh", "{task}"]'))
    agent_file(directory, "py", simple("py", command='["{python}", "{agent_dir}/x.py"]'))
    tool = directory / "tool.sh"
    tool.write_text('#!/bin/sh\necho "$1"\n')
    tool.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)

    catalog = discover_agents(elsewhere, ["agents"])
    assert catalog.get("tool").agent_dir == str(directory)
    inv = invocation(catalog.get("tool"), "t", tmp_path / "run", cwd=elsewhere)
    assert inv.argv == (str(tool), "t")
    inv = invocation(catalog.get("py"), "t", tmp_path / "run2", cwd=elsewhere)
    assert inv.argv == (sys.executable, str(directory / "x.py"))


def test_a_cwd_that_does_not_exist_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    agent = parse(simple("a"))
    with pytest.raises(BadRequest, match="does not exist"):
        invocation(agent, "t", tmp_path / "run", cwd=tmp_path / "gone")
    with pytest.raises(AgentInvalid, match="cwd"):
        invocation(parse(simple("a") + "cwd: nowhere"), "t", tmp_path / "run", cwd=tmp_path)
    assert not (tmp_path / "run").exists()


# -- task delivery ---------------------------------------------------------------------------------


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_argv_delivery_substitutes_the_task_as_one_argument_in_a_single_pass(
    tmp_path: Path,
) -> None:
    agent = parse(simple("a", command='["echo", "--task={task}"]') + "task_delivery: argv")
    task = "find {task_file} and {python} literally"
    inv = invocation(agent, task, tmp_path, cwd=tmp_path)
    assert inv.delivery == "argv"
    assert inv.argv[1:] == (f"--task={task}",)
    assert inv.stdin_path is None and inv.task_file is None


def test_r_ext_3_stdin_delivery_feeds_exactly_system_instructions_then_the_task(
    tmp_path: Path,
) -> None:
    agent = parse(simple("a", command='["cat"]'), body="\n\n  Be brief.  \n\n")
    inv = invocation(agent, "Summarize x.", tmp_path / "run", cwd=tmp_path)
    assert inv.delivery == "stdin" and inv.stdin_path is not None
    expected = "<System instructions>\nBe brief.\n\n<Task>\nSummarize x."
    assert inv.stdin_path.read_text() == expected == stdin_text("  Be brief. ", "Summarize x.")
    assert mode_of(inv.stdin_path) == 0o600
    assert mode_of(tmp_path / "run") == 0o700


def test_file_delivery_writes_a_private_task_md_and_substitutes_task_file(
    tmp_path: Path,
) -> None:
    agent = parse(simple("a", command='["cat", "{task_file}"]'))
    inv = invocation(agent, "the task", tmp_path, cwd=tmp_path, label="child-0")
    assert inv.delivery == "file"
    assert inv.task_file == tmp_path / "child-0.task.md"
    assert inv.argv[1:] == (str(inv.task_file),)
    assert inv.task_file.read_text() == "the task"
    assert mode_of(inv.task_file) == 0o600
    assert inv.env["SUBAGENTS_TASK_FILE"] == str(inv.task_file)


@pytest.mark.parametrize(
    ("length", "delivery"), [(AUTO_FILE_THRESHOLD, "argv"), (AUTO_FILE_THRESHOLD + 1, "file")]
)
def test_r_tsk_1_auto_switches_to_a_task_file_over_8000_characters(
    tmp_path: Path, length: int, delivery: str
) -> None:
    agent = parse(simple("a"))
    task = "x" * length
    inv = invocation(agent, task, tmp_path, cwd=tmp_path)
    assert inv.delivery == delivery
    if delivery == "file":
        assert inv.task_file is not None and inv.task_file.read_text() == task
        assert inv.argv[1:] == (f"@{inv.task_file}",)  # R-TSK-1's @path form
    else:
        assert inv.argv[1:] == (task,)


@pytest.mark.parametrize(
    ("value", "delivery"), [(" File ", "file"), ("argv", "argv"), ("", "argv")]
)
def test_r_tsk_1_subagents_task_delivery_file_forces_the_file_and_other_values_mean_auto(
    tmp_path: Path, value: str, delivery: str
) -> None:
    agent = parse(simple("a"))
    env = {**os.environ, "SUBAGENTS_TASK_DELIVERY": value}
    assert invocation(agent, "short", tmp_path, env).delivery == delivery


def test_file_forced_by_the_environment_also_overrides_an_explicit_setting(tmp_path: Path) -> None:
    agent = parse(simple("a", command='["cat"]') + "task_delivery: stdin")
    env = {**os.environ, "SUBAGENTS_TASK_DELIVERY": "file"}
    inv = invocation(agent, "t", tmp_path, env)
    assert inv.delivery == "file" and inv.stdin_path is None


@pytest.mark.parametrize(
    ("command", "delivery"),
    [('["tool", "{task}"]', "argv"), ('["tool", "{task_file}"]', "file"), ('["tool"]', "stdin")],
)
def test_auto_takes_the_form_the_command_asks_for(
    tmp_path: Path, command: str, delivery: str
) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o700)
    agent = parse(simple("a", command=command.replace("tool", str(tool))))
    assert invocation(agent, "t", tmp_path, cwd=tmp_path).delivery == delivery


def test_output_is_resolved_against_the_working_dir_and_exported(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    agent = parse(simple("a") + "output: out/report.md\ncwd: sub\nenv: {A: b}")
    inv = invocation(agent, "t", tmp_path / "run", cwd=tmp_path)
    assert inv.cwd == tmp_path / "sub"
    assert inv.output_path == tmp_path / "sub" / "out" / "report.md"
    assert inv.env == {
        "A": "b",
        "SUBAGENTS_AGENT": "a",
        "SUBAGENTS_OUTPUT": str(inv.output_path),
    }


def test_system_prompt_file_placeholder_gets_the_trimmed_body(tmp_path: Path) -> None:
    agent = parse(
        simple("a", command='["echo", "--system", "{system_prompt_file}", "{task}"]'),
        body="\n  Act carefully.\n",
    )
    inv = invocation(agent, "t", tmp_path, cwd=tmp_path)
    prompt = Path(inv.argv[2])
    assert prompt.read_text() == "Act carefully." and mode_of(prompt) == 0o600


def test_r_misc_1_task_text_never_reaches_the_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "TOP-SECRET-TASK-TEXT"
    with caplog.at_level(logging.DEBUG):
        for command in ('["echo", "{task}"]', '["cat"]', '["cat", "{task_file}"]'):
            invocation(parse(simple("a", command=command)), secret, tmp_path, cwd=tmp_path)
    assert caplog.records and secret not in caplog.text


# -- the child's environment ---------------------------------------------------------------------


def test_r_fan_4_only_fanout_agents_get_the_descriptor_and_node_variables_win(
    tmp_path: Path,
) -> None:
    agent = parse(simple("a") + "env: {SUBAGENTS_NODE: 'ipc:///fake', MINE: '1'}")
    inv = invocation(agent, "t", tmp_path, cwd=tmp_path)
    base = {
        "PATH": "/bin",
        ENV_FANOUT: "inherited-descriptor",
        "SUBAGENTS_TASK_FILE": "/parent/task.md",
        "SUBAGENTS_OUTPUT": "/parent/out.md",
    }
    common: dict[str, Any] = {
        "node_address": "ipc:///real/node.sock",
        "session_id": "s1",
        "run_id": "r1",
        "child_id": "r1-0",
        "depth": 1,
        "max_depth": 2,
        "fanout_descriptor": "child-descriptor",
    }
    plain = child_environment(base, inv, fanout=False, **common)
    assert ENV_FANOUT not in plain
    assert "SUBAGENTS_TASK_FILE" not in plain and "SUBAGENTS_OUTPUT" not in plain
    assert plain["SUBAGENTS_NODE"] == "ipc:///real/node.sock" and plain["MINE"] == "1"
    assert (plain["SUBAGENTS_DEPTH"], plain["SUBAGENTS_MAX_DEPTH"]) == ("1", "2")
    assert (plain["SUBAGENTS_SESSION"], plain["SUBAGENTS_RUN_ID"]) == ("s1", "r1")
    fanning = child_environment(base, inv, fanout=True, **common)
    assert fanning[ENV_FANOUT] == "child-descriptor"


# -- the example agents, run for real ------------------------------------------------------------


def run_agent(
    name: str, task: str, run_dir: Path, cwd: Path, env: Mapping[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Invocation]:
    """Run an example agent the way its child shim would: its argv, stdin file, env and cwd."""
    agent = find_agent(name, cwd, [EXAMPLES])
    base = dict(env if env is not None else os.environ)
    inv = prepare_invocation(agent, task, run_dir, cwd=cwd, environ=base)
    full = {**base, **inv.env}
    stdin = inv.stdin_path.open("rb") if inv.stdin_path else subprocess.DEVNULL
    try:
        done = subprocess.run(
            inv.argv, cwd=inv.cwd, env=full, stdin=stdin, capture_output=True, timeout=60
        )
    finally:
        if inv.stdin_path:
            stdin.close()  # type: ignore[union-attr]
    text = subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )
    return text, inv


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "a.py").write_text("class A:\n    pass  # TODO: more\n")
    (src / "pkg" / "b.py").write_text("# TODO one\n# TODO two\nclass B:\n    pass\n")
    (src / "notes.txt").write_text("nothing here\n")
    (src / "blob.bin").write_bytes(b"\xff\xfe TODO \x00")
    return src


def test_scout_searches_a_tree_and_writes_a_markdown_report(tmp_path: Path, tree: Path) -> None:
    done, inv = run_agent("scout", f"dir={tree} pattern=TODO|class ", tmp_path / "run", tmp_path)
    assert done.returncode == 0, done.stderr
    assert inv.output_path == tmp_path / "scout-report.md"
    report = inv.output_path.read_text()
    assert "5 matches in 2 files." in report
    assert "| pkg/b.py | 3 |" in report and "| a.py | 2 |" in report
    assert "- L2: `# TODO two`" in report
    assert done.stdout.strip() == (
        f"scout: 5 matches in 2 files under {tree} (report: {inv.output_path})"
    )


def test_scout_reads_a_long_task_from_its_task_file(tmp_path: Path, tree: Path) -> None:
    task = "Look carefully. " * 600 + f" dir={tree} pattern=TODO"
    done, inv = run_agent("scout", task, tmp_path / "run", tmp_path)
    assert inv.delivery == "file" and done.returncode == 0, done.stderr
    assert "3 matches in 2 files" in done.stdout


def test_scout_refuses_a_task_without_a_directory(tmp_path: Path) -> None:
    done, _ = run_agent("scout", "pattern=x", tmp_path / "run", tmp_path)
    assert done.returncode == 1 and "dir=DIR" in done.stderr


def test_summarizer_merges_reports_delivered_on_stdin(tmp_path: Path, tree: Path) -> None:
    first, _ = run_agent("scout", f"dir={tree} pattern=TODO", tmp_path / "r1", tmp_path)
    (tmp_path / "scout-report.md").rename(tmp_path / "todo.md")
    second, _ = run_agent("scout", f"dir={tree} pattern=class", tmp_path / "r2", tmp_path)
    assert first.returncode == second.returncode == 0
    done, inv = run_agent("summarizer", "todo.md, scout-report.md", tmp_path / "r3", tmp_path)
    assert inv.delivery == "stdin" and done.returncode == 0, done.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "5 matches in 2 files." in summary
    assert "| pkg/b.py | 3 |" in summary
    assert "## From todo.md" in summary and "\n## Scout report: `TODO`" in summary
    assert "merged 2 reports (5 matches in 2 files)" in done.stdout


def test_summarizer_fails_on_a_missing_report(tmp_path: Path) -> None:
    done, _ = run_agent("summarizer", "missing.md", tmp_path / "run", tmp_path)
    assert done.returncode == 1 and "missing reports: missing.md" in done.stderr


def launcher(tmp_path: Path, script: str) -> str:
    path = tmp_path / "launch.py"
    path.write_text(textwrap.dedent(script))
    return f"{sys.executable} {path}"


def test_recursive_launches_its_children_and_adds_up_the_subtree(tmp_path: Path) -> None:
    # A stand-in for `run`: runs the agent directly (`--agents-dir D AGENT TASK`).
    launch = launcher(
        tmp_path,
        """
        import subprocess, sys
        agents_dir, agent, task = sys.argv[2], sys.argv[3], sys.argv[4]
        sys.exit(subprocess.run([sys.executable, f"{agents_dir}/{agent}.py", task]).returncode)
        """,
    )
    env = {**os.environ, "SUBAGENTS_LAUNCH": launch}
    done, _ = run_agent("recursive", "depth=2 width=2", tmp_path / "run", tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "recursive: depth=2 width=2 admitted=2 refused=0 failed=0 "
        "subtree_admitted=6 subtree_refused=0"
    )


@pytest.mark.parametrize(
    "refusal",
    [
        "Run fan-out limit reached: 'tasks[0]' needs 1, 4/4 used.",
        "Nested subagent call blocked (depth=2, max=2).",
    ],
    ids=["fanout-budget", "depth-guard"],
)
def test_recursive_counts_launches_refused_at_admission(tmp_path: Path, refusal: str) -> None:
    launch = launcher(
        tmp_path,
        f"""
        import sys
        sys.stderr.write({refusal!r})
        sys.exit(1)
        """,
    )
    env = {**os.environ, "SUBAGENTS_LAUNCH": launch}
    done, _ = run_agent("recursive", "depth=1 width=3", tmp_path / "run", tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "admitted=0 refused=3 failed=0" in done.stdout


def test_recursive_counts_other_launch_errors_as_failed(tmp_path: Path) -> None:
    launch = launcher(tmp_path, "import sys; sys.stderr.write('boom'); sys.exit(2)")
    env = {**os.environ, "SUBAGENTS_LAUNCH": launch}
    done, _ = run_agent("recursive", "depth=1 width=2", tmp_path / "run", tmp_path, env)
    assert "admitted=0 refused=0 failed=2" in done.stdout and "boom" in done.stderr


def test_sleeper_sleeps_and_reports(tmp_path: Path) -> None:
    done, _ = run_agent("sleeper", "seconds=0.1 exit=3", tmp_path / "run", tmp_path)
    assert done.returncode == 3 and done.stdout.strip() == "slept 0.1"


def test_the_default_launch_command_is_this_interpreter_running_the_cli(tmp_path: Path) -> None:
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import recursive; "
        "print(recursive.launch_command())"
    )
    env = {k: v for k, v in os.environ.items() if k != "SUBAGENTS_LAUNCH"}
    out = subprocess.run(
        [sys.executable, "-c", probe, str(EXAMPLES)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=REPO,
    ).stdout
    assert out.strip() == str([sys.executable, "-m", "subagents_node", "run"])
