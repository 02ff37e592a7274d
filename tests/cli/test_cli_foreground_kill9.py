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

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.actors.child.process import NODE_GONE
from subagents_node.node.node import Node
from tests.support.foreground import StderrLines, cli_command
from tests.support.nodes import REPO
from tests.support.runs import (
    EXAMPLE_AGENTS,
    WAIT_S,
    Gate,
    process_gone,
    script_agents,
    wait_gone,
    wait_until,
    write_agent,
)

pytestmark = pytest.mark.slow

#: The sleeper's task: a long sleep, a grandchild in its group and a `setsid()` daemon, their
#: pids written to the FIFO once all three run (examples/agents/sleeper.py).
_TASK = "seconds=600 grandchild=1 daemon=600 ready={fifo}"

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


@pytest.fixture
def orphans_dir() -> Iterator[Path]:
    """A short state dir of this test's own (ipc socket paths must stay under 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="orphans-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _read_pids(fifo: Path, proc: subprocess.Popen[str]) -> list[int]:
    """The sleeper's three pids, once it wrote them; fails (bounded) when it never does."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    reader.join(WAIT_S)
    if reader.is_alive():  # unblock the reader: it must not outlive the test
        with open(fifo, "w"):
            pass
        proc.kill()
        raise AssertionError(f"the sleeper never wrote its pids: {proc.communicate()}")
    pids = [int(p) for p in got[0].split()]
    assert len(pids) == 3 and all(pids), got
    return pids


def _shim_pids(state_dir: Path, run_id: str = "*") -> list[int]:
    """Every shim that claimed a child of the run(s) (runs/<id>/child-<i>/shim.json)."""
    return [
        int(json.loads(path.read_text())["shim_pid"])
        for path in (state_dir / "runs").glob(f"{run_id}/child-*/shim.json")
    ]


def _assert_gone(pids: list[int]) -> None:
    try:
        for pid in pids:
            wait_gone(pid, WAIT_S)
    finally:
        for pid in pids:  # a failed check must not leave sleepers behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _foreground_sleeper(
    state_dir: Path, agent: str = "sleeper", agents: Path = EXAMPLE_AGENTS, ready: str = "ready"
) -> tuple[subprocess.Popen[str], list[int]]:
    """A foreground `run` of `agent` with the sleeper's task (its node embedded, none serving
    the dir before), and the pids of the sleeper, its grandchild and its setsid() daemon once
    they all run. `ready` names the sleeper's FIFO (one per sleeper running at once)."""
    fifo = state_dir.parent / f"{state_dir.name}.{ready}"
    os.mkfifo(fifo)
    try:
        task = _TASK.format(fifo=fifo)
        command = cli_command(state_dir, "run", "--agents-dir", str(agents), agent, task)
        return command, _read_pids(fifo, command)
    finally:
        fifo.unlink()


def test_a_foreground_run_killed_with_9_ends_its_child_grandchild_and_setsid_daemon(
    orphans_dir: Path,
) -> None:
    """They used to run on until the child's deadline (the sleeper's: 10 minutes), and a node
    started later on the state dir adopted them as a run still going."""
    command, pids = _foreground_sleeper(orphans_dir)
    shims = _shim_pids(orphans_dir)
    assert len(shims) == 1, shims

    command.kill()
    command.communicate(timeout=WAIT_S)
    _assert_gone([*pids, *shims])

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
    command, pids = _foreground_sleeper(orphans_dir, "nesting", agents)
    shims = _shim_pids(orphans_dir)
    assert len(shims) == 2, shims  # the nesting agent's and the nested sleeper's

    command.kill()
    command.communicate(timeout=WAIT_S)
    _assert_gone([*pids, *shims])

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
        [sys.executable, "-c", _EMBED_AND_WAIT, _TASK.format(fifo=fifo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    pids = _read_pids(fifo, program)
    assert program.stdout is not None
    state_dir = Path(program.stdout.readline().strip())  # printed once the launch returned
    try:
        shims = wait_until(lambda: _shim_pids(state_dir), what="the child's shim record")

        program.kill()
        program.communicate(timeout=WAIT_S)
        _assert_gone([*pids, *shims])
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
        command, pids = _foreground_sleeper(orphans_dir)
        agents = script_agents(orphans_dir / "agents")
        background = cli_command(
            orphans_dir, "run", "--agents-dir", str(agents), "--async", "gate", str(gate.path)
        )
        out, err = background.communicate(timeout=WAIT_S)
        assert background.returncode == 0, err
        [held] = gate.accept(1)
        run_id = out.strip()
        [held_shim] = _shim_pids(orphans_dir, run_id)
        own_shims = [pid for pid in _shim_pids(orphans_dir) if pid != held_shim]

        command.kill()
        command.communicate(timeout=WAIT_S)
        _assert_gone([*pids, *own_shims])
        assert not process_gone(held.pid) and not process_gone(held_shim)

        with Node.embedded(state_dir=orphans_dir) as node:
            client = node.client()
            held.release(0)
            final = client.runs.wait(run_id, timeout=WAIT_S)
        assert final.state == "complete" and "released 0" in final.output, final
    finally:
        gate.close()


def _watched_by(shim: int) -> set[int]:
    """The processes the shim holds a pidfd of: the one its tree ends with, when bound."""
    found: set[int] = set()
    for info in Path(f"/proc/{shim}/fdinfo").iterdir():
        with contextlib.suppress(OSError):  # a descriptor closed meanwhile
            found.update(
                int(line.split()[1])
                for line in info.read_text().splitlines()
                if line.startswith("Pid:")
            )
    return found


def test_a_foreground_run_its_command_took_over_after_a_lost_node_ends_with_it_killed_with_9(
    orphans_dir: Path,
) -> None:
    """A foreground run launched on another command's node is not bound (that node is not its
    command's). Killed with -9, that command takes its own run with it; the follower takes the
    state dir over with a node of its own, which adopts its run. That node used to adopt it
    as it was, unbound: a later kill -9 of the follower left the run's tree running until its
    deadline. It now binds the run to the follower's process (the rebind message), as if the
    run had been launched there; a `run --async` adopted with it stays unbound and runs on."""
    gate = Gate(orphans_dir)
    procs: list[subprocess.Popen[str]] = []
    pids: list[int] = []
    try:
        first, first_pids = _foreground_sleeper(orphans_dir)  # embeds the node
        procs.append(first)
        command, pids = _foreground_sleeper(orphans_dir, ready="second")  # on first's node
        procs.append(command)
        stderr = StderrLines(command)
        started = re.search(r"run ([0-9a-f]+) started", stderr.wait_for(r"run \w+ started"))
        assert started is not None
        run_id = started.group(1)
        agents = script_agents(orphans_dir / "agents")
        background = cli_command(
            orphans_dir, "run", "--agents-dir", str(agents), "--async", "gate", str(gate.path)
        )
        out, err = background.communicate(timeout=WAIT_S)
        assert background.returncode == 0, err
        [held] = gate.accept(1)
        [held_shim] = _shim_pids(orphans_dir, out.strip())
        [shim] = _shim_pids(orphans_dir, run_id)
        assert _watched_by(shim) == set()  # not bound: first's node is not its command's
        first_shims = [pid for pid in _shim_pids(orphans_dir) if pid not in (shim, held_shim)]

        first.kill()
        first.communicate(timeout=WAIT_S)
        _assert_gone([*first_pids, *first_shims])
        stderr.wait_for("the node stopped under")  # it took the state dir over
        wait_until(lambda: _watched_by(shim) == {command.pid}, what="the shim rebound")
        assert _watched_by(held_shim) == set()  # adopted in the same pass, left unbound

        command.kill()
        command.communicate(timeout=WAIT_S)
        _assert_gone([*pids, shim])
        assert not process_gone(held.pid) and not process_gone(held_shim)

        with Node.embedded(state_dir=orphans_dir) as node:  # the next node reads what they left
            client = node.client()
            final = client.runs.wait(run_id, timeout=WAIT_S)
            held.release(0)
            other = client.runs.wait(out.strip(), timeout=WAIT_S)
        assert (final.state, final.children[0].state) == ("stopped", "stopped"), final
        assert final.children[0].error == NODE_GONE, final.children[0]
        assert other.state == "complete" and "released 0" in other.output, other
    finally:
        for proc in procs:  # a failed check must not leave a command (and its node) behind
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=WAIT_S)
        for pid in pids:  # nor sleepers
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
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
        task = _TASK.format(fifo=fifo)
        call = {"name": "run", "arguments": {"agent": "sleeper", "task": task}}
        _mcp_frame(server, {"id": 1, "method": "tools/call", "params": call})
        pids = _read_pids(fifo, server)
    finally:
        fifo.unlink()
    shims = _shim_pids(orphans_dir)

    server.kill()
    server.communicate(timeout=WAIT_S)
    _assert_gone([*pids, *shims])
