"""A foreground `run` killed with -9 takes its whole tree with it, as Ctrl-C does.

With no node running, a foreground `run` embeds one in its own process. Ctrl-C stops the run
(every process of its tree, `setsid()` daemons included) before the command exits; kill -9 gives
the command no such chance, and the child shims, which outlive their node by design so that the
next node adopts them, used to keep the whole tree running until its deadline (30 minutes by
default), with nobody following it. The shims of the command's own run are now bound to its
process at spawn: when it dies they stop the tree as `stop` does, record the end, and exit; a
later node on the state dir settles the run `stopped`, never `complete`. So do the runs that run
launched (nested runs), and so does a foreground run of `subagents-node mcp` on the node it
embeds, and every run of a program's `Node.embedded()` with a temporary state dir, which nobody
could adopt. Another command's run on the killed node is not bound: the next node adopts it, as
after any node's loss. A detached node's children still outlive it
(tests/actors/runs/test_runs_recovery.py,
`test_r_run_5_node_kill_9_and_restart_settles_exited_children_with_their_exit_status`), and so
do the runs of a program that embeds a node on a named state dir
(`test_a_program_embedding_a_node_exits_while_a_background_child_runs_on`). Real CLI processes,
real nodes, real children; every wait is on an event or a condition, with a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from subagents_node.node.node import Node
from tests.support.foreground import cli_command
from tests.support.nodes import REPO
from tests.support.runs import (
    EXAMPLE_AGENTS,
    WAIT_S,
    Gate,
    process_gone,
    script_agents,
    wait_until,
    write_agent,
)
from tests.support.sleepers import (
    SLEEPER_TASK,
    assert_gone,
    foreground_sleeper,
    read_pids,
    shim_pids,
)
from tests.support.sleepers import orphans_dir as orphans_dir

pytestmark = pytest.mark.slow

#: A program that embeds a node with a temporary state dir, launches the sleeper in the
#: background and waits (until it is killed): nobody could adopt that child, the directory's
#: name being known to this process only. Prints the state dir once the child runs.
_EMBED_AND_WAIT = """\
import sys, threading
import subagents_node
from tests.support.runs import launch_context

with subagents_node.Node.embedded() as node:
    ctx = launch_context()
    node.client().runs.launch(ctx.single("sleeper", sys.argv[1], True, None))
    print(node.state_dir, flush=True)
    threading.Event().wait()
"""


#: A fan-out agent that launches the sleeper (its task) as a nested background run on its node
#: (`run --async`: that launcher exits at once; only the nested run's shim holds the sleeper),
#: then sleeps until it is ended.
_NESTING_AGENT = """\
import subprocess, sys, time
subprocess.run(
    [sys.executable, "-m", "subagents_node", "run", "--async", "--agents-dir", sys.argv[2],
     "sleeper", sys.argv[1]],
    check=True, stdout=subprocess.DEVNULL,
)
time.sleep(600)
"""


def test_a_foreground_run_killed_with_9_ends_its_child_grandchild_and_setsid_daemon(
    orphans_dir: Path,
) -> None:
    """They used to run on until the child's deadline (the sleeper's: 10 minutes), and a node
    started later on the state dir adopted them as a run still going."""
    command, pids = foreground_sleeper(orphans_dir)
    shims = shim_pids(orphans_dir)
    assert len(shims) == 1, shims

    command.kill()
    command.communicate(timeout=WAIT_S)
    assert_gone([*pids, *shims])

    with Node.embedded(state_dir=orphans_dir) as node:  # the next node reads what they left
        client = node.client()
        [run] = client.runs.list(limit=10)
        final = client.runs.wait(run.run_id, timeout=WAIT_S)
    assert (final.state, final.children[0].state) == ("stopped", "stopped"), final
    assert "killed" in (final.children[0].error or ""), final.children[0]


def test_a_foreground_run_killed_with_9_ends_the_runs_its_child_launched_too(
    orphans_dir: Path,
) -> None:
    """Ctrl-C stops a run and the runs it launched (R-WF-10); so does kill -9 now. The nested
    run's sleeper used to run on under its shim, with its launcher long gone."""
    agents = orphans_dir / "agents"
    write_agent(
        agents,
        "nesting",
        "Launches its task as a nested background sleeper, then sleeps.",
        f'["{{python}}", "{{agent_dir}}/nesting.py", "{{task}}", "{EXAMPLE_AGENTS}"]',
        fanout="true",
    )
    (agents / "nesting.py").write_text(_NESTING_AGENT)
    command, pids = foreground_sleeper(orphans_dir, "nesting", agents)
    shims = shim_pids(orphans_dir)
    assert len(shims) == 2, shims  # the nesting agent's and the nested sleeper's

    command.kill()
    command.communicate(timeout=WAIT_S)
    assert_gone([*pids, *shims])

    with Node.embedded(state_dir=orphans_dir) as node:
        client = node.client()
        runs = client.runs.list(limit=10)
        finals = [client.runs.wait(run.run_id, timeout=WAIT_S) for run in runs]
    assert sorted(run.state for run in finals) == ["stopped", "stopped"], finals


def test_a_program_killed_with_9_inside_an_embedded_node_with_a_temporary_dir_ends_its_runs(
    tmp_path: Path,
) -> None:
    """Nothing can adopt those children (the directory's name died with the program); they
    used to run on, unsupervised, until their deadline."""
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    program = subprocess.Popen(
        [sys.executable, "-c", _EMBED_AND_WAIT, SLEEPER_TASK.format(fifo=fifo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    pids = read_pids(fifo, program)
    assert program.stdout is not None
    state_dir = Path(program.stdout.readline().strip())  # printed once the launch returned
    try:
        shims = wait_until(lambda: shim_pids(state_dir), what="the child's shim record")

        program.kill()
        program.communicate(timeout=WAIT_S)
        assert_gone([*pids, *shims])
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)  # the program died before removing it


def test_another_commands_background_run_on_a_killed_foreground_runs_node_runs_on_for_the_next(
    orphans_dir: Path,
) -> None:
    """Only the killed command's own run ends with it: a `run --async` that found its node
    serving keeps running (its shim outlives the node as any shim does) and the next node on
    the state dir adopts it and settles it from its true end."""
    gate = Gate(orphans_dir)
    try:
        command, pids = foreground_sleeper(orphans_dir)
        agents = script_agents(orphans_dir / "agents")
        background = cli_command(
            orphans_dir, "run", "--agents-dir", str(agents), "--async", "gate", str(gate.path)
        )
        out, err = background.communicate(timeout=WAIT_S)
        assert background.returncode == 0, err
        [held] = gate.accept(1)
        run_id = out.strip()
        [held_shim] = shim_pids(orphans_dir, run_id)
        own_shims = [pid for pid in shim_pids(orphans_dir) if pid != held_shim]

        command.kill()
        command.communicate(timeout=WAIT_S)
        assert_gone([*pids, *own_shims])
        assert not process_gone(held.pid) and not process_gone(held_shim)

        with Node.embedded(state_dir=orphans_dir) as node:
            client = node.client()
            held.release(0)
            final = client.runs.wait(run_id, timeout=WAIT_S)
        assert final.state == "complete" and "released 0" in final.output, final
    finally:
        gate.close()


def _mcp_frame(server: subprocess.Popen[str], frame: dict[str, object]) -> None:
    assert server.stdin is not None
    server.stdin.write(json.dumps({"jsonrpc": "2.0", **frame}) + "\n")
    server.stdin.flush()


def test_an_mcp_server_killed_with_9_ends_the_tree_of_its_foreground_run_on_its_own_node(
    orphans_dir: Path,
) -> None:
    """With no node to use, `subagents-node mcp` embeds one; TERM, HUP and INT stop its
    foreground run first, but an agent CLI that crashes (or is killed) takes the server with
    it at once: the run's child, grandchild and setsid() daemon used to run on."""
    fifo = orphans_dir.parent / f"{orphans_dir.name}.mcp-ready"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if k != "SUBAGENTS_NODE"}
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "subagents_node", "--state-dir", str(orphans_dir)),
            *("mcp", "--agents-dir", str(EXAMPLE_AGENTS)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}
        _mcp_frame(server, {"id": 0, "method": "initialize", "params": init})
        _mcp_frame(server, {"method": "notifications/initialized"})
        task = SLEEPER_TASK.format(fifo=fifo)
        call = {"name": "run", "arguments": {"agent": "sleeper", "task": task}}
        _mcp_frame(server, {"id": 1, "method": "tools/call", "params": call})
        pids = read_pids(fifo, server)
    finally:
        fifo.unlink()
    shims = shim_pids(orphans_dir)

    server.kill()
    server.communicate(timeout=WAIT_S)
    assert_gone([*pids, *shims])
