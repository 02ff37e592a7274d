"""`subagents-node mcp` driven by the official SDK's stdio client (`stdio_client` +
`ClientSession`), against real node processes: the tools and their schemas, runs of the
shipped agents, ledger refusals as tool errors (R-FAN-16), and an agent child whose own MCP
server draws on its parent run tree's budget (R-FAN-4/8)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent

from subagents_node import AsyncClient
from subagents_node.launch.launcher import LaunchContext
from subagents_node.mcp.tools import MAX_LOGS_TOTAL
from subagents_node.messages.errors import FanoutLimitExceeded
from subagents_node.messages.inert import printable
from tests.support.nodes import REPO, NodeProcess
from tests.support.runs import read_fifo, wait_view

AGENTS = REPO / "examples" / "agents"
TOOLS = {
    "agents",
    "run",
    "status",
    "logs",
    "wait",
    "stop",
    "resume",
    "rerun",
    "attach",
    "append",
    "pause",
    "approve",
    "reject",
}
#: Longest a single tool call may take in these tests (a foreground run of a short sleeper).
CALL_TIMEOUT_S = 60.0

pytestmark = pytest.mark.processes


def server_env(**extra: str) -> dict[str, str]:
    """The test's environment (already isolated from any real node) plus `extra`."""
    return {**os.environ, **extra}


@asynccontextmanager
async def mcp_session(env: dict[str, str], *args: str) -> AsyncIterator[ClientSession]:
    """`python -m subagents_node mcp ARGS` as a real process, with an initialized session."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "subagents_node", "mcp", "--agents-dir", str(AGENTS), *args],
        env=env,
        cwd=str(REPO),
    )
    with open(os.devnull, "w") as quiet:
        async with (
            stdio_client(params, errlog=quiet) as (read, write),
            ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT_S) as session,
        ):
            await session.initialize()
            yield session


def text_of(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def call(env: dict[str, str], *calls: tuple[str, dict[str, Any]]) -> list[CallToolResult]:
    """Make `calls` in order on one server; their results."""

    async def go() -> list[CallToolResult]:
        async with mcp_session(env) as session:
            return [await session.call_tool(name, arguments) for name, arguments in calls]

    return asyncio.run(go())


def test_tools_are_listed_with_input_schemas_and_descriptions(state_dir: Path) -> None:
    async def go() -> list[Any]:
        async with mcp_session(server_env(SUBAGENTS_STATE_DIR=str(state_dir))) as session:
            return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in asyncio.run(go())}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description, f"{tool.name} has no description"
        assert tool.input_schema["type"] == "object"
    run = tools["run"].input_schema
    assert {"agent", "task", "tasks", "chain", "background", "timeout_ms"} <= set(run["properties"])
    assert all(p.get("description") for p in run["properties"].values())
    assert tools["logs"].input_schema["required"] == ["run_id"]
    assert tools["wait"].input_schema["properties"]["timeout_s"]["exclusiveMinimum"] == 0
    assert tools["append"].input_schema["required"] == ["run_id", "steps"]
    assert tools["status"].annotations is not None and tools["status"].annotations.read_only_hint


def test_a_foreground_run_of_the_sleeper_returns_its_output_on_an_embedded_node(
    state_dir: Path,
) -> None:
    """No node runs: the server embeds one for its lifetime and stops it when it exits."""
    env = server_env(SUBAGENTS_STATE_DIR=str(state_dir))
    ran, status = call(env, ("run", {"agent": "sleeper", "task": "seconds=0.1"}), ("status", {}))
    assert not ran.is_error, text_of(ran)
    assert "slept 0.1" in text_of(ran)
    assert ran.structured_content is not None
    assert ran.structured_content["state"] == "complete"
    assert ran.structured_content["fanout"] == {"used": 1, "limit": 64}
    assert not status.is_error and "Spawn budget" in text_of(status)
    assert not (state_dir / "node.sock").exists(), "the embedded node must stop with the server"


def test_a_tools_text_shows_a_childs_terminal_controls_as_escapes_and_its_data_keeps_them(
    state_dir: Path, tmp_path: Path
) -> None:
    """A host shows a tool's text to a person (often on a terminal): a child's OSC 52 (set the
    clipboard) and screen clear are shown as escapes there; `structured_content` is the data."""
    agents = tmp_path / "agents"
    agents.mkdir()
    hostile = "out \x1b]52;c;cHduZWQ=\x07\x1b[2J end"
    (agents / "loud.py").write_text(f"print({hostile!r})\n")
    (agents / "loud.md").write_text(
        "---\nname: loud\ndescription: prints escapes\n"
        'command: ["{python}", "{agent_dir}/loud.py", "{task}"]\n---\nBody.\n'
    )
    env = server_env(SUBAGENTS_STATE_DIR=str(state_dir))

    async def go() -> CallToolResult:
        async with mcp_session(env, "--agents-dir", str(agents)) as session:
            return await session.call_tool("run", {"agent": "loud", "task": "x"})

    ran = asyncio.run(go())

    assert not ran.is_error, text_of(ran)
    assert r"out \x1b]52;c;cHduZWQ=\x07\x1b[2J end" in text_of(ran)
    assert "\x1b" not in text_of(ran) and "\x07" not in text_of(ran)
    assert ran.structured_content is not None
    assert ran.structured_content["output"].rstrip("\n") == hostile


def test_a_background_run_returns_its_id_and_wait_and_logs_follow_it(node: NodeProcess) -> None:
    env = server_env(SUBAGENTS_NODE=node.address)

    async def go() -> tuple[CallToolResult, ...]:
        async with mcp_session(env) as session:
            started = await session.call_tool(
                "run", {"agent": "sleeper", "task": "seconds=0.2", "background": True}
            )
            assert started.structured_content is not None, text_of(started)
            run_id = started.structured_content["run_id"]
            settled = await session.call_tool("wait", {"run_id": run_id, "timeout_s": 30})
            logs = await session.call_tool("logs", {"run_id": run_id, "max_bytes": 100})
            unknown = await session.call_tool("wait", {"run_id": "no-such-run"})
            return started, settled, logs, unknown

    started, settled, logs, unknown = asyncio.run(go())
    run_id = started.structured_content["run_id"]  # type: ignore[index]
    assert not started.is_error
    assert text_of(started).splitlines()[1].startswith(f"run {run_id} started")
    assert settled.structured_content is not None
    assert settled.structured_content["state"] == "complete"
    assert not settled.structured_content["timed_out"]
    assert "== child 0" in text_of(logs) and "stdout" in text_of(logs)
    assert logs.structured_content is not None
    (child,) = logs.structured_content["children"]
    assert "slept 0.2" in child["stdout"]
    assert node.client().runs.show(run_id).state == "complete"  # the very run, on that node
    assert unknown.is_error and "no-such-run" in text_of(unknown)


def test_logs_cut_to_max_bytes_says_how_many_bytes_it_shows(node: NodeProcess) -> None:
    """docs/mcp.md: `logs` gives the last `max_bytes` of each log, and its label says so with
    the number (it printed the placeholder `{max_bytes}` itself)."""
    env = server_env(SUBAGENTS_NODE=node.address)
    (ran,) = call(env, ("run", {"agent": "sleeper", "task": "seconds=0.1"}))
    assert ran.structured_content is not None, text_of(ran)
    (logs,) = call(env, ("logs", {"run_id": ran.structured_content["run_id"], "max_bytes": 4}))
    assert not logs.is_error, text_of(logs)
    assert "== child 0 single (sleeper) stdout (last 4 bytes) ==" in text_of(logs)
    assert "{max_bytes}" not in text_of(logs)
    assert logs.structured_content is not None
    assert logs.structured_content["children"][0]["stdout_truncated"]


def test_logs_of_many_loud_children_stay_under_the_answers_cap_and_name_those_left_out(
    state_dir: Path, tmp_path: Path
) -> None:
    """docs/mcp.md: one `logs` answer holds at most MAX_LOGS_TOTAL bytes of logs. Ten children
    of 60,000 bytes each answered 600,000 (and an expand step's hundreds, tens of MB): now the
    children past the cap are left out whole, named in a last line and in `left_out`, and one
    of them is still had with `child`."""
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "loud.py").write_text("import sys\nsys.stdout.write('x' * 60_000)\n")
    (agents / "loud.md").write_text(
        "---\nname: loud\ndescription: prints 60,000 bytes\n"
        'command: ["{python}", "{agent_dir}/loud.py", "{task}"]\n---\nBody.\n'
    )
    env = server_env(SUBAGENTS_STATE_DIR=str(state_dir))
    tasks = [{"agent": "loud", "task": str(i)} for i in range(10)]

    async def go() -> tuple[CallToolResult, CallToolResult]:
        async with mcp_session(env, "--agents-dir", str(agents)) as session:
            ran = await session.call_tool("run", {"tasks": tasks})
            assert ran.structured_content is not None, text_of(ran)
            run_id = ran.structured_content["run_id"]
            every = await session.call_tool("logs", {"run_id": run_id, "max_bytes": 64_000})
            last = await session.call_tool("logs", {"run_id": run_id, "child": 9})
            return every, last

    every, last = asyncio.run(go())
    assert not every.is_error, text_of(every)
    assert every.structured_content is not None
    shown = every.structured_content["children"]
    left_out = every.structured_content["left_out"]
    assert sum(len(c["stdout"]) + len(c["stderr"]) for c in shown) <= MAX_LOGS_TOTAL
    assert len(text_of(every)) < MAX_LOGS_TOTAL + 10_000  # the text, labels included
    assert [c["index"] for c in shown] + left_out == list(range(10))
    assert left_out and all(len(c["stdout"]) == 60_000 for c in shown)  # whole, or left out
    assert f"children {left_out[0]} to 9 left out" in text_of(every)
    assert last.structured_content is not None, text_of(last)
    assert last.structured_content["children"][0]["stdout"] == "x" * 16_000  # the default tail


def test_r_fan_25_every_run_result_carries_the_budget_after_its_claims_in_text_and_data(
    node: NodeProcess,
) -> None:
    """Started in the background, complete in the foreground, failed in the foreground, and a
    resume of the background one (it claims nothing, R-FAN-23): each result has the snapshot
    taken after its own launch's claims, as data and as a text line."""
    env = server_env(SUBAGENTS_NODE=node.address, SUBAGENTS_MAX_SPAWNS_PER_RUN="5")
    two = [{"agent": "sleeper", "task": "seconds=0.1"}] * 2

    async def go() -> list[CallToolResult]:
        async with mcp_session(env) as session:
            started = await session.call_tool("run", {"tasks": two, "background": True})
            assert started.structured_content is not None, text_of(started)
            run_id = started.structured_content["run_id"]
            await session.call_tool("wait", {"run_id": run_id, "timeout_s": 30})
            resumed = await session.call_tool("resume", {"run_id": run_id})
            ran = await session.call_tool("run", {"agent": "sleeper", "task": "seconds=0.1"})
            failed = await session.call_tool(
                "run", {"agent": "sleeper", "task": "seconds=30", "timeout_ms": 300}
            )
            return [started, resumed, ran, failed]

    started, resumed, ran, failed = asyncio.run(go())

    for result, used, state in (
        (started, 2, "running"),
        (resumed, 2, "running"),
        (ran, 1, "complete"),
        (failed, 1, "failed"),
    ):
        assert result.structured_content is not None, text_of(result)
        assert result.structured_content["state"] == state
        assert result.structured_content["fanout"] == {"used": used, "limit": 5}
        # R-FAN-25: the first line of the result's text.
        assert text_of(result).splitlines()[0] == f"Run fan-out: {used}/5 used", text_of(result)
    node.client().runs.wait(resumed.structured_content["run_id"], timeout=30)  # type: ignore[index]


def test_a_foreground_run_whose_call_the_client_cancels_is_stopped(node: NodeProcess) -> None:
    """An MCP client that abandons a foreground `run` (its user pressed Esc) sends
    notifications/cancelled: the server stops the run, as Ctrl-C does for the CLI."""
    env = server_env(SUBAGENTS_NODE=node.address)

    async def go() -> None:
        # The loop must stay free while the SDK sends its cancellation: an AsyncClient.
        async with mcp_session(env) as session, AsyncClient(node.address) as client:
            long = {"agent": "sleeper", "task": "seconds=60"}
            # The deadline abandons the call once the run has surely started (R-RUN-3).
            with anyio.move_on_after(2.0) as deadline:
                await session.call_tool("run", long)
            assert deadline.cancelled_caught, "the 60 s run cannot have answered"
            (run,) = await client.runs.list()
            final = await client.runs.wait(run.run_id, timeout=30)
            assert final.state == "stopped"
            status = await session.call_tool("status", {})  # the server still serves
            assert not status.is_error

    asyncio.run(go())


def test_r_fan_16_a_fan_out_refusal_is_a_tool_error_with_the_rejection_text(
    node: NodeProcess,
) -> None:
    env = server_env(SUBAGENTS_NODE=node.address, SUBAGENTS_MAX_SPAWNS_PER_RUN="2")
    tasks = [{"agent": "sleeper", "task": "seconds=0"}] * 3
    (refused,) = call(env, ("run", {"tasks": tasks}))
    assert refused.is_error
    assert text_of(refused).startswith(
        "Run fan-out limit reached at tasks[2] (0/2 used; 3 requested"
    )
    assert refused.structured_content is not None
    assert refused.structured_content["error"]["code"] == FanoutLimitExceeded.code
    assert refused.structured_content["error"]["message"] == text_of(refused)
    assert node.client().runs.list() == [], "a refused launch starts nothing"


def test_bad_arguments_are_a_tool_error_and_launch_nothing(node: NodeProcess) -> None:
    env = server_env(SUBAGENTS_NODE=node.address)
    pair = [{"agent": "sleeper", "task": "y"}] * 2
    beside = {"agent": "sleeper", "task": "dropped", "parallel": pair}
    both, unknown, wide, deadline, mixed, loose, stray = call(
        env,
        ("run", {"agent": "sleeper", "task": "x", "tasks": pair}),
        ("run", {"agent": "no-such-agent", "task": "x"}),
        ("run", {"tasks": pair, "concurrency": 65}),
        ("run", {"agent": "sleeper", "task": "x", "timeout_ms": 0}),
        ("run", {"chain": [beside]}),
        ("run", {"agent": "sleeper", "task": "x", "background": "yes"}),
        ("run", {"tasks": [{"agent": "sleeper", "task": "y", "session": "other"}]}),
    )
    assert both.is_error and "give agent and task" in text_of(both)
    assert unknown.is_error and "Unknown agent 'no-such-agent'" in text_of(unknown)
    assert wide.is_error
    assert "concurrency must be an integer from 1 to 64" in text_of(wide)  # the launcher's rule
    assert deadline.is_error and "timeout" in text_of(deadline).lower()
    # A step's agent and task beside `parallel` are refused, not dropped (the run file's rule).
    assert mixed.is_error and "a parallel step has no other keys" in text_of(mixed)
    for refused in (both, unknown, wide, deadline, mixed):
        assert "\n" not in text_of(refused), "a refusal is one line"
    # Arguments are as strict as a run file: no "yes" for true, no stray keys.
    assert loose.is_error and stray.is_error
    assert node.client().runs.list() == []


def test_an_unknown_argument_or_true_for_a_number_is_a_tool_error_and_launches_nothing(
    node: NodeProcess,
) -> None:
    """A misspelt `background` or a `timeout` for `timeout_ms` would otherwise run in the
    foreground without a deadline, and `timeout_ms: true` would be a 1 ms deadline."""
    env = server_env(SUBAGENTS_NODE=node.address)
    sleeper = {"agent": "sleeper", "task": "seconds=0"}
    misspelt, deadline, wide, waited, status = call(
        env,
        ("run", {**sleeper, "backgrund": True, "timeout": 60}),
        ("run", {**sleeper, "timeout_ms": True}),
        ("run", {**sleeper, "concurrency": True}),
        ("wait", {"run_id": "no-such-run", "timeout_s": True}),
        ("status", {"verbose": 1}),
    )
    assert misspelt.is_error
    assert text_of(misspelt).startswith("run takes no argument 'backgrund', 'timeout' (")
    assert "timeout_ms" in text_of(misspelt)  # the arguments it does take are named
    assert misspelt.structured_content is not None
    assert misspelt.structured_content["error"]["code"] == "bad_request"
    for refused in (deadline, wide, waited):
        assert refused.is_error and "not true or false" in text_of(refused)
    assert status.is_error and "status takes no argument 'verbose'" in text_of(status)
    assert node.client().runs.list() == []


def test_a_cwd_or_agents_dir_no_directory_can_have_is_a_one_line_tool_error_naming_it(
    node: NodeProcess,
) -> None:
    """A NUL byte or a name over 255 bytes in `cwd` or `agents_dirs` was answered with the
    SDK's bare "Error executing tool run" (no reason, no structured error), and a traceback
    (ValueError: embedded null byte; OSError: File name too long) on the server's stderr."""
    env = server_env(SUBAGENTS_NODE=node.address)
    sleeper = {"agent": "sleeper", "task": "seconds=0"}
    long_dir = "/tmp/" + "c" * 300
    nul, long_cwd, long_agents, listed = call(
        env,
        ("run", {**sleeper, "cwd": "/tmp/\0"}),
        ("run", {**sleeper, "cwd": "/tmp/" + "a" * 300}),
        ("run", {**sleeper, "agents_dirs": [long_dir]}),
        ("agents", {"agents_dirs": [long_dir]}),
    )
    for refused in (nul, long_cwd, long_agents, listed):
        assert refused.is_error and "\n" not in text_of(refused), text_of(refused)
        assert refused.structured_content is not None
        # The text shows a control as an escape; the structured error keeps it as it is.
        assert printable(refused.structured_content["error"]["message"]) == text_of(refused)
    assert text_of(nul) == "working directory is not usable: it holds a NUL byte: /tmp/\\x00"
    assert text_of(long_cwd).startswith("working directory is not usable: File name too long: ")
    for refused in (nul, long_cwd):
        assert refused.structured_content is not None
        error = refused.structured_content["error"]
        assert error["code"] == "cwd_missing" and error["details"]["field"] == "cwd"
    for refused in (long_agents, listed):
        assert text_of(refused).startswith(f"Invalid agents directory {long_dir[:100]}")
        assert text_of(refused).endswith("agents directory is not usable: File name too long")
        assert refused.structured_content is not None
        assert refused.structured_content["error"]["code"] == "agent_invalid"
    assert node.client().runs.list() == []


@pytest.mark.parametrize("session", ["", "a\nb", "s" * 257], ids=["empty", "newline", "long"])
def test_mcp_refuses_a_session_id_the_cli_refuses_before_it_serves(
    session: str, state_dir: Path
) -> None:
    """`--session` is checked as `run --session` checks it: an empty one is not the default
    session, one with a newline is no session id, and a long one would fail every call."""
    done = subprocess.run(
        [sys.executable, "-m", "subagents_node", "mcp", "--session", session],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=server_env(SUBAGENTS_STATE_DIR=str(state_dir)),
        cwd=REPO,
        timeout=CALL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: Invalid value for '--session'"), line
    assert "is not a session id" in line


CHILD_SCRIPT = """
import asyncio, os, sys
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

async def main():
    # The child's whole environment, as an agent CLI passes its own to its MCP servers.
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "subagents_node", "mcp", "--agents-dir", sys.argv[1]],
        env=dict(os.environ),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        pair = [{"agent": "sleeper", "task": "seconds=0"}] * 2
        first = await session.call_tool("run", {"tasks": pair})
        print("first", first.is_error, first.structured_content["root_run_id"])
        second = await session.call_tool("run", {"agent": "sleeper", "task": "seconds=0"})
        print("second", second.is_error, second.content[0].text)

asyncio.run(main())
"""


def test_r_fan_8_an_agent_childs_own_mcp_server_claims_from_the_parent_run_tree(
    node: NodeProcess, tmp_path: Path
) -> None:
    """A child agent starts `subagents-node mcp` with its inherited environment: its launches
    join the parent's run tree ($SUBAGENTS_RUN_FANOUT) on the parent's node ($SUBAGENTS_NODE);
    the budget of 3 admits the parent and a parallel pair, then refuses the next launch."""
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "mcp_parent.py").write_text(CHILD_SCRIPT)
    (agents / "mcp-parent.md").write_text(
        "---\nname: mcp-parent\ndescription: Launches sleepers through its own MCP server.\n"
        f'command: ["{{python}}", "{{agent_dir}}/mcp_parent.py", "{AGENTS}"]\n'
        "fanout: true\n---\nLaunch sleepers.\n"
    )
    env = {**os.environ, "SUBAGENTS_NODE": node.address, "SUBAGENTS_MAX_SPAWNS_PER_RUN": "3"}
    ctx = LaunchContext.from_environment(cwd=REPO, env=env, agents_dirs=[agents])
    client = node.client()
    parent = client.runs.launch(ctx.single("mcp-parent", "go", background=False, timeout_ms=None))
    final = client.runs.wait(parent.run_id, timeout=120)
    assert final.state == "complete", final.error
    lines = final.output.splitlines()
    assert lines[0] == f"first False {parent.root_run_id}"
    assert lines[1].startswith("second True Run fan-out limit reached at ")
    assert "(3/3 used" in lines[1]
    assert client.fanout.snapshot(parent.fanout_descriptor).used == 3
    nested = [
        r for r in client.runs.list(root_run_id=parent.root_run_id) if r.run_id != parent.run_id
    ]
    assert [(r.mode, r.depth, r.state) for r in nested] == [("parallel", 1, "complete")]
    assert nested[0].session_id == parent.session_id


@pytest.mark.slow
def test_chain_stop_resume_and_append_through_the_tools(node: NodeProcess) -> None:
    """The rest of the launcher's operations, each through its tool, on one server."""
    env = server_env(SUBAGENTS_NODE=node.address)
    sleep = {"agent": "sleeper", "task": "seconds=0"}

    async def go() -> dict[str, CallToolResult]:
        async with mcp_session(env) as session:
            out: dict[str, CallToolResult] = {}
            out["chain"] = await session.call_tool("run", {"chain": [sleep, {"parallel": [sleep]}]})
            long = {"agent": "sleeper", "task": "seconds=60", "background": True}
            victim = await session.call_tool("run", long)
            out["stop"] = await session.call_tool("stop", {"run_id": run_id(victim)})
            short = await session.call_tool("run", {**sleep, "background": True})
            await session.call_tool("wait", {"run_id": run_id(short)})
            out["resume"] = await session.call_tool("resume", {"run_id": run_id(short)})
            out["resumed"] = await session.call_tool("wait", {"run_id": run_id(out["resume"])})
            first = {"agent": "sleeper", "task": "seconds=1"}
            chain = await session.call_tool("run", {"chain": [first], "background": True})
            out["append"] = await session.call_tool(
                "append", {"run_id": run_id(chain), "steps": [sleep]}
            )
            out["appended"] = await session.call_tool("wait", {"run_id": run_id(chain)})
            out["early"] = await session.call_tool(
                "wait", {"run_id": run_id(victim), "timeout_s": 0.1}
            )
            return out

    out = asyncio.run(go())
    for name, result in out.items():
        assert not result.is_error, f"{name}: {text_of(result)}"
    assert data(out["chain"])["mode"] == "chain" and data(out["chain"])["state"] == "complete"
    assert len(data(out["chain"])["children"]) == 2
    assert data(out["stop"])["state"] == "stopped"
    assert data(out["resumed"])["state"] == "complete"
    assert "resumes" in text_of(out["resume"])
    assert data(out["append"])["steps"] == 1
    assert [c["state"] for c in data(out["appended"])["children"]] == ["complete", "complete"]
    assert data(out["early"])["state"] == "stopped"  # settled already: no waiting


@pytest.mark.slow
def test_r_res_6_and_r_misc_2_attach_and_rerun_through_the_tools(node: NodeProcess) -> None:
    """attach chains steps after a live background run; rerun reruns a finished run's child."""
    env = server_env(SUBAGENTS_NODE=node.address)

    async def go() -> dict[str, CallToolResult]:
        async with mcp_session(env) as session:
            out: dict[str, CallToolResult] = {}
            live = {"agent": "sleeper", "task": "seconds=1", "background": True}
            source = await session.call_tool("run", live)
            after = {"agent": "sleeper", "task": "seconds=0"}
            out["attach"] = await session.call_tool(
                "attach", {"run_id": run_id(source), "steps": [after]}
            )
            out["attached"] = await session.call_tool("wait", {"run_id": run_id(out["attach"])})
            out["rerun"] = await session.call_tool(
                "rerun", {"run_id": run_id(source), "task": "seconds=0"}
            )
            out["late"] = await session.call_tool(
                "attach", {"run_id": run_id(source), "steps": [after]}
            )
            out["source"] = source
            return out

    out = asyncio.run(go())
    for name in ("attach", "attached", "rerun"):
        assert not out[name].is_error, f"{name}: {text_of(out[name])}"
    source = run_id(out["source"])
    assert f"chains after {source}" in text_of(out["attach"])
    attached = data(out["attached"])
    assert (attached["state"], attached["source_kind"]) == ("complete", "attach")
    assert attached["source_run_id"] == source
    assert [c["label"] for c in attached["children"]] == ["chain[1]"]
    rerun = data(out["rerun"])
    assert (rerun["state"], rerun["background"], rerun["source_kind"]) == (
        "complete",
        False,
        "rerun",
    )
    assert out["late"].is_error  # the source has ended: only a live run is attached
    assert "only a live background run can be attached" in text_of(out["late"])


def run_id(result: CallToolResult) -> str:
    return str(data(result)["run_id"])


def data(result: CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), text_of(result)
    return result.structured_content


def test_the_registration_examples_in_docs_mcp_name_this_server() -> None:
    """docs/mcp.md's Claude Code / Gemini CLI JSON and Codex CLI TOML snippets parse, start
    `subagents-node mcp`, and (Codex, which filters the environment) forward every variable a
    child's server needs to stay on its run tree's ledgers."""
    import json
    import tomllib

    from subagents_node.messages import constants
    from tests.support.docs import blocks

    page = blocks(REPO / "docs" / "mcp.md")
    configs = [json.loads(b.text) for b in page if b.lang == "json"]
    assert len(configs) == 2
    for config in configs:
        server = config["mcpServers"]["subagents"]
        assert server["command"] == "subagents-node" and server["args"][0] == "mcp"
    (codex,) = [tomllib.loads(b.text) for b in page if b.text.startswith("[mcp_servers.")]
    server = codex["mcp_servers"]["subagents"]
    assert server["command"] == "subagents-node" and server["args"][0] == "mcp"
    needed = {
        constants.ENV_NODE,
        constants.ENV_STATE_DIR,
        constants.ENV_SESSION,
        constants.ENV_DEPTH,
        constants.ENV_MAX_DEPTH,
        constants.ENV_FANOUT,
        constants.ENV_RUN_ID,
    }
    assert set(server["env_vars"]) == needed


@pytest.mark.slow
def test_r_run_2_checkpoint_approve_reject_and_pause_through_the_tools(node: NodeProcess) -> None:
    """A chain's checkpoint step pauses it; `approve` goes on, `reject` ends it rejected;
    `pause` stops a running background run (R-RUN-2), each through its tool."""
    env = server_env(SUBAGENTS_NODE=node.address)
    client = node.client()
    sleep = {"agent": "sleeper", "task": "seconds=0"}
    gated = {"chain": [sleep, {"checkpoint": "ok?"}, sleep], "background": True}

    async def go() -> dict[str, CallToolResult]:
        async with mcp_session(env) as session:
            out: dict[str, CallToolResult] = {}
            for decision, ended in (("approve", "approved"), ("reject", "rejected")):
                run = await session.call_tool("run", gated)
                await anyio.to_thread.run_sync(
                    lambda r=run: wait_view(client, run_id(r), lambda v: v.state == "paused")
                )
                args = {"run_id": run_id(run)}
                out[decision] = await session.call_tool(decision, args)
                out[ended] = await session.call_tool("wait", args)
            long = {"agent": "sleeper", "task": "seconds=60", "background": True}
            victim = await session.call_tool("run", long)
            out["pause"] = await session.call_tool("pause", {"run_id": run_id(victim)})
            await anyio.to_thread.run_sync(
                lambda: wait_view(client, run_id(victim), lambda v: v.state == "paused")
            )
            out["stop"] = await session.call_tool("stop", {"run_id": run_id(victim)})
            return out

    out = asyncio.run(go())
    for name, result in out.items():
        assert not result.is_error, f"{name}: {text_of(result)}"
    assert data(out["approved"])["state"] == "complete"
    assert data(out["rejected"])["state"] == "rejected"
    assert data(out["stop"])["state"] == "stopped"


#: An agent that puts a FIFO in place of its stdout log and a symlink to another file in place
#: of its stderr log (a prompt-injected child can: the logs are in its run's directory), says
#: so on the FIFO named by its task, then sleeps until it is stopped.
LOG_SWAPPER = """---
name: logswap
description: replaces its own logs with a FIFO and a symlink
command: ["/bin/sh", "{agent_dir}/logswap.sh", "{task}"]
---
x
"""
LOG_SWAPPER_SH = """d="$SUBAGENTS_CHILD_DIR/.."
for f in "$d"/*-0.stdout.log; do rm -f "$f"; mkfifo "$f"; done
for f in "$d"/*-0.stderr.log; do rm -f "$f"; ln -s "$2" "$f"; done
echo ok > "$1"
exec sleep 60
"""


def test_logs_of_a_child_whose_log_is_a_fifo_or_a_symlink_answers_and_never_wedges_the_server(
    node: NodeProcess, tmp_path: Path
) -> None:
    """`logs` opened each log with a plain open(): a FIFO a child put in its log's place made
    it wait for a writer on the server's event loop, so neither it nor any other call (a ping,
    `status`, `stop`) was answered until the child ended; a symlink showed the file it named.
    Now each is read as the CLI's `logs` reads it: a regular file, never through a link."""
    agents = tmp_path / "agents"
    agents.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("not a log\n")
    (agents / "logswap.md").write_text(LOG_SWAPPER)
    (agents / "logswap.sh").write_text(LOG_SWAPPER_SH.replace("$2", str(secret)))
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    env = server_env(SUBAGENTS_NODE=node.address)

    async def go() -> tuple[CallToolResult, CallToolResult, CallToolResult]:
        async with mcp_session(env, "--agents-dir", str(agents)) as session:
            started = await session.call_tool(
                "run", {"agent": "logswap", "task": str(ready), "background": True}
            )
            assert started.structured_content is not None, text_of(started)
            run_id = started.structured_content["run_id"]
            await anyio.to_thread.run_sync(read_fifo, ready)
            with anyio.fail_after(20):  # it waited for the child's end (60 s) before
                logs = await session.call_tool("logs", {"run_id": run_id})
                status = await session.call_tool("status", {})
            stopped = await session.call_tool("stop", {"run_id": run_id})
            return logs, status, stopped

    logs, status, stopped = asyncio.run(go())
    assert not logs.is_error, text_of(logs)
    assert "not a log" not in text_of(logs)  # the link is not followed
    assert logs.structured_content is not None
    (child,) = logs.structured_content["children"]
    assert child["stdout"].startswith("(cannot read ") and "FIFO" in child["stdout"]
    assert child["stderr"].startswith("(cannot read ") and "not a log" not in child["stderr"]
    assert not status.is_error and not stopped.is_error
