"""kill -9 of a command that took the state dir over after its node was lost: a foreground
command's own run ends with it, as on a node it launched the run on; a `wait` binds nothing.

A foreground run launched on a node its command does not embed (another command's, a detached
one) is not bound to the command. When that node is lost, the command takes the state dir over
with a node of its own, which adopts the run; that node used to adopt it as it was, unbound, so
a later kill -9 of the command left the run's tree running until its deadline. The adopting
node now binds the run to the command (actors/runs/rebinding.py: the rebind message to each
live shim), as if the run had been launched there; every other run it adopts (a `run --async`,
what a `wait` waits on) stays as it was; a `rerun` follows its run as a `run` does. Real CLI
processes, real nodes, real children; every wait is on an event or a condition, with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.actors.child.process import NODE_GONE
from subagents_node.client.client import connect
from subagents_node.client.paths import read_pid_file
from subagents_node.messages.supervisor import RunView
from subagents_node.node.node import Node
from tests.support.foreground import StderrLines, cli_command
from tests.support.nodes import NodeProcess
from tests.support.runs import (
    EXAMPLE_AGENTS,
    WAIT_S,
    Gate,
    GateChild,
    process_gone,
    script_agents,
    wait_until,
)
from tests.support.sleepers import (
    assert_gone,
    foreground_sleeper,
    shim_pids,
    sleeping_command,
    watched_by,
)
from tests.support.sleepers import orphans_dir as orphans_dir

pytestmark = pytest.mark.slow


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """The commands a test started: a failed check must not leave one (and its node) behind."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)


def _held_run(state_dir: Path, gate: Gate) -> tuple[str, GateChild, int]:
    """A `run --async` of the gate agent on the node serving the dir: its id, its held child
    and its shim."""
    agents = script_agents(state_dir / "agents")
    background = cli_command(
        state_dir, "run", "--agents-dir", str(agents), "--async", "gate", str(gate.path)
    )
    out, err = background.communicate(timeout=WAIT_S)
    assert background.returncode == 0, err
    [held] = gate.accept(1)
    [shim] = shim_pids(state_dir, out.strip())
    return out.strip(), held, shim


def _next_node_ends(state_dir: Path, run_id: str, held: GateChild, held_id: str) -> RunView:
    """The next node on the dir settles `run_id` from what its shims left, and the held run
    once released; the former's view."""
    with Node.embedded(state_dir=state_dir) as node:
        client = node.client()
        final = client.runs.wait(run_id, timeout=WAIT_S)
        held.release(0)
        other = client.runs.wait(held_id, timeout=WAIT_S)
    assert other.state == "complete" and "released 0" in other.output, other
    return final


def test_a_foreground_run_its_command_took_over_after_a_lost_node_ends_with_it_killed_with_9(
    orphans_dir: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The first command embeds the node; the second's run, on that node, is not bound to the
    second. kill -9 of the first takes its own run with it; the second takes the dir over."""
    gate = Gate(orphans_dir)
    pids: list[int] = []
    try:
        first, first_pids = foreground_sleeper(orphans_dir)  # embeds the node
        procs.append(first)
        command, pids = foreground_sleeper(orphans_dir, ready="second")  # on first's node
        procs.append(command)
        stderr = StderrLines(command)
        started = re.search(r"run (\w+) started", stderr.wait_for(r"run \w+ started"))
        assert started is not None
        run_id = started.group(1)
        held_id, held, held_shim = _held_run(orphans_dir, gate)
        [shim] = shim_pids(orphans_dir, run_id)
        assert watched_by(shim) == set()  # not bound: first's node is not its command's
        first_shims = [pid for pid in shim_pids(orphans_dir) if pid not in (shim, held_shim)]

        first.kill()
        first.communicate(timeout=WAIT_S)
        assert_gone([*first_pids, *first_shims])
        stderr.wait_for("the node stopped under")  # it took the state dir over
        wait_until(lambda: watched_by(shim) == {command.pid}, what="the shim rebound")
        assert watched_by(held_shim) == set()  # adopted in the same pass, left unbound

        command.kill()
        command.communicate(timeout=WAIT_S)
        assert_gone([*pids, shim])
        assert not process_gone(held.pid) and not process_gone(held_shim)

        final = _next_node_ends(orphans_dir, run_id, held, held_id)
        assert (final.state, final.children[0].state) == ("stopped", "stopped"), final
        assert final.children[0].error == NODE_GONE, final.children[0]
    finally:
        for pid in pids:  # nor sleepers
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        gate.close()


def test_a_rerun_its_command_took_over_after_a_lost_node_ends_with_it_killed_with_9(
    orphans_dir: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """`rerun` follows its run in the foreground as `run` does, and takes a lost node's place
    the same way: its run must be its own too. The rerun request named no command, so no node
    could ever bind the rerun to it."""
    node = NodeProcess(orphans_dir).start()
    pids: list[int] = []
    try:
        agents = str(EXAMPLE_AGENTS)
        source = cli_command(
            orphans_dir, "run", "--agents-dir", agents, "--async", "sleeper", "seconds=0"
        )
        source_id = source.communicate(timeout=WAIT_S)[0].strip()
        with connect(node.address, timeout=5) as client:
            assert client.runs.wait(source_id, timeout=WAIT_S).state == "complete"
        command, pids = sleeping_command(orphans_dir, "rerun", source_id, "--task", ready="re")
        procs.append(command)
        stderr = StderrLines(command)
        started = re.search(r"run (\w+) started", stderr.wait_for(r"run \w+ started"))
        assert started is not None
        run_id = started.group(1)
        [shim] = shim_pids(orphans_dir, run_id)
        assert watched_by(shim) == set()  # a detached node binds nothing

        node.kill()
        stderr.wait_for("the node stopped under")  # it took the state dir over
        wait_until(lambda: watched_by(shim) == {command.pid}, what="the shim rebound")

        command.kill()
        command.communicate(timeout=WAIT_S)
        assert_gone([*pids, shim])
        with Node.embedded(state_dir=orphans_dir) as next_node:
            final = next_node.client().runs.wait(run_id, timeout=WAIT_S)
        assert (final.state, final.children[0].error) == ("stopped", NODE_GONE), final
    finally:
        node.cleanup()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_wait_that_took_the_state_dir_over_binds_nothing_and_its_kill_9_stops_nothing(
    orphans_dir: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """Ctrl-C of a `wait` stops no run: neither may its kill -9. The node it embeds adopts the
    run it waits on as it was (its shim outlives the `wait`, for the next node)."""
    gate = Gate(orphans_dir)
    node = NodeProcess(orphans_dir).start()
    try:
        held_id, held, held_shim = _held_run(orphans_dir, gate)
        agents = str(orphans_dir / "agents")
        echo = cli_command(orphans_dir, "run", "--agents-dir", agents, "--async", "echo", "hi")
        done_id = echo.communicate(timeout=WAIT_S)[0].strip()
        command = cli_command(orphans_dir, "wait", done_id, held_id)
        procs.append(command)
        stdout, stderr = StderrLines(command, stdout=True), StderrLines(command)
        stdout.wait_for(f"^run {done_id} complete$")  # it waits: a lost node is taken over

        node.kill()
        stderr.wait_for("the node stopped under")  # it takes the state dir over

        def serving() -> str:  # the wait's own node's address (its pid record: once it serves)
            record = read_pid_file(orphans_dir) or {}
            return str(record["address"]) if record.get("pid") == command.pid else ""

        with connect(wait_until(serving, what="the wait's node"), timeout=5) as client:
            kinds = [event.kind for event in client.runs.watch(held_id, 0, 0).events]
        assert "run.recovered" in kinds and "bound" not in kinds, kinds
        assert watched_by(held_shim) == set()

        command.kill()
        command.communicate(timeout=WAIT_S)
        assert not process_gone(held.pid) and not process_gone(held_shim)
        with Node.embedded(state_dir=orphans_dir) as next_node:
            held.release(0)
            other = next_node.client().runs.wait(held_id, timeout=WAIT_S)
        assert other.state == "complete", other
    finally:
        node.cleanup()
        gate.close()
