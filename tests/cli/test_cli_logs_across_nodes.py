"""`logs -f` follows a run's child logs across a lost node, like the foreground followers.

When the node a `logs -f` follows is stopped, or killed with -9, the run's children go on
writing their logs under their shims; the command waits (`--node-wait`, NODE_BACK_S by default)
for the state dir's next node, which someone else starts, and follows on from the offsets it
had reached: every line once, in order, and the exit code of a follow with no node change
(runtime/cli/observe.py, runtime/cli/following.py `across_nodes`). With no next node in time it
ends with one error line and exit 3 (NodeNotRunning). Real CLI processes, real detached nodes,
a child that prints numbered lines slowly and waits at a gate half way, released when the test
says (so some lines are written while no node runs and some once the next one serves).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import connect
from tests.support.foreground import (
    LOSSES,
    StderrLines,
    cli_command,
    lose_and_see_taken_over,
    stop_cleanly,
)
from tests.support.foreground import commands as commands
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import WAIT_S, Gate, launch_context, write_agent

#: Lines 1-20 a line every 0.1 s, then it waits at the gate (its task), then lines 21-40.
_PACER = """\
import os, socket, sys, time

def lines(first, last):
    for number in range(first, last + 1):
        print(f"line {number}", flush=True)
        time.sleep(0.1)

lines(1, 20)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(f"{os.getpid()}\\n".encode())
sock.recv(64)
lines(21, 40)
"""
_LINES = [f"single stdout | line {number}" for number in range(1, 41)]


def _pacing_run(agents: Path, gate: Gate, node: NodeProcess) -> str:
    """A background run of the pacer on `node`; its id."""
    (agents / "pacer.py").write_text(_PACER)
    write_agent(
        agents,
        "pacer",
        "Prints numbered lines slowly, waiting at a gate half way.",
        '["{python}", "{agent_dir}/pacer.py", "{task}"]',
    )
    with connect(node.address, timeout=5) as client:
        launch = launch_context(agents).single("pacer", str(gate.path), True, None)
        return client.runs.launch(launch).run_id


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_logs_follow_whose_node_is_lost_goes_on_on_the_next_node_printing_each_line_once(
    state_dir: Path,
    agents: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    start_node: Callable[..., NodeProcess],
    loss: str,
) -> None:
    """`logs -f` ended with exit 3 ("no node is running") as soon as its node went, though the
    child went on writing its logs and the next node adopted its run."""
    node = start_node(state_dir=state_dir)
    run_id = _pacing_run(agents, gate, node)
    command = cli_command(state_dir, "logs", "-f", run_id)
    commands.append(command)
    stdout, stderr = StderrLines(command, stdout=True), StderrLines(command)
    stdout.wait_for(r"\| line 5$")  # mid-stream: printed while its node served

    lose_and_see_taken_over(stderr, lambda: LOSSES[loss](node))
    start_node(state_dir=state_dir)  # `start --detach`: the next node adopts the run
    [child] = gate.accept(1)
    child.release(0)  # lines 21-40 are written once the next node serves

    assert stdout.to_end() == _LINES  # each line once, in order, none lost
    lines = stderr.to_end()
    command.communicate(timeout=WAIT_S)  # closes the pipes
    assert command.returncode == 0, lines
    assert lines == [
        f"the node stopped under run {run_id}; following it on the state dir's next node"
    ]


def test_logs_follow_whose_node_does_not_come_back_ends_after_node_wait_with_exit_3(
    state_dir: Path,
    agents: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    start_node: Callable[..., NodeProcess],
) -> None:
    """With no next node within --node-wait, `logs -f` says so in one line and exits 3 (no
    node running), having printed each line it read once; the run goes on without it."""
    node = start_node(state_dir=state_dir)
    run_id = _pacing_run(agents, gate, node)
    command = cli_command(state_dir, "logs", "-f", "--node-wait", "2", run_id)
    commands.append(command)
    stdout, stderr = StderrLines(command, stdout=True), StderrLines(command)
    stdout.wait_for(r"\| line 5$")

    lost_from = time.monotonic()  # the wait starts once the command saw the node go
    lose_and_see_taken_over(stderr, lambda: stop_cleanly(node))
    lines = stderr.to_end()
    waited = time.monotonic() - lost_from
    printed = stdout.to_end()
    command.communicate(timeout=WAIT_S)  # closes the pipes

    assert command.returncode == 3, lines
    assert 2.0 <= waited < WAIT_S, f"gave up after {waited:.1f} s, not after --node-wait 2"
    assert lines[-1] == (
        f"error: no node served {state_dir} again within 2 s: stopped following run {run_id}, "
        f"which goes on (`logs -f {run_id}` again once a node serves)"
    ), lines
    assert printed == _LINES[: len(printed)] and len(printed) >= 5, printed

    again = start_node(state_dir=state_dir)  # the run went on: it ends on the next node
    [child] = gate.accept(1)
    child.release(0)
    with connect(again.address, timeout=5) as client:
        assert client.runs.wait(run_id, timeout=WAIT_S).state == "complete"
