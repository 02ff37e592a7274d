"""`rerun`, a foreground `workflow` and `wait` follow their runs across a lost node, like `run`.

Each follows a run in the foreground; when the node it follows is stopped, or killed with -9,
the run's shims outlive it, so the command takes the state dir over (a node it starts adopts
the run) and follows on to the run's true end, with the run's own exit code, showing each
progress line (or each end, for `wait`) once (runtime/cli/following.py, `across_nodes`). Real
CLI processes, real nodes, a gate socket that releases each child (or the workflow script) when
the test says.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import connect
from tests.support.foreground import (
    LOSSES,
    StderrLines,
    cli_command,
    lose_and_see_taken_over,
    progress,
    watches_inotify,
)
from tests.support.foreground import commands as commands
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import WAIT_S, Gate, launch_context, process_gone, wait_until

#: A workflow script that blocks on the gate like a gate agent does, with no request to the
#: node meanwhile: only its host (the workflow run's child) waits through the lost node.
_GATED_WORKFLOW = """\
import os, socket

def main(runs):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect({gate!r})
    sock.sendall(f"{{os.getpid()}}\\n".encode())
    return "released " + sock.recv(64).decode().strip()
"""


def _across_a_lost_node(
    command: subprocess.Popen[str],
    gate: Gate,
    node: NodeProcess,
    lose: Callable[[NodeProcess], None],
    exit_code: int,
) -> tuple[str, list[str]]:
    """The command's gated child starts and is shown, `lose` takes the node away, the child is
    released with `exit_code` once the command took the state dir over. Its stdout and stderr
    lines, once it ended."""
    stderr = StderrLines(command)
    [child] = gate.accept(1)
    stderr.wait_for(r" started .* pid \d+$")  # shown while its node served
    lose_and_see_taken_over(stderr, lambda: lose(node))
    child.release(exit_code)
    lines = stderr.to_end()
    out, _ = command.communicate(timeout=WAIT_S)  # closes the pipes
    return out, lines


def _shown_once(child: str, end: str, run_end: str) -> Counter[str]:
    """Every event of a one-child run once, whichever node recorded it."""
    return Counter(
        [
            "run R started",
            f"started {child} pid P",
            "run R recovered",  # the node that took the state dir over adopted the run
            f"{child} {end}",
            f"run R {run_end}",
        ]
    )


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("exit_code", [0, 5])
def test_a_rerun_whose_node_is_lost_follows_on_to_its_true_end_showing_each_line_once(
    state_dir: Path,
    agents: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    start_node: Callable[..., NodeProcess],
    loss: str,
    exit_code: int,
) -> None:
    """`rerun` followed with no takeover: the lost node ended it with exit 3 ("no node is
    running") while its rerun went on with nobody following it, whatever its true end."""
    node = start_node(state_dir=state_dir)
    with connect(node.address, timeout=5) as client:
        source = client.runs.launch(
            launch_context(agents).single("gate", str(gate.path), True, None)
        )
        [held] = gate.accept(1)
        held.release(0)
        assert client.runs.wait(source.run_id, timeout=WAIT_S).state == "complete"
    command = cli_command(state_dir, "rerun", source.run_id, "--task", str(gate.path))
    commands.append(command)

    out, lines = _across_a_lost_node(command, gate, node, LOSSES[loss], exit_code)

    assert command.returncode == (0 if exit_code == 0 else 1), (out, lines)
    assert f"released {exit_code}" in out  # the adopted child's own output
    shown = progress(lines)
    if exit_code == 0:
        ends = ("complete (exit 0)", "complete")
    else:
        ends = (f"failed (exit {exit_code})", f"failed: External CLI exited with code {exit_code}.")
    assert Counter(shown) == _shown_once("single (gate)", *ends), lines
    assert shown[-1].startswith("run R "), lines


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_a_foreground_workflow_whose_node_is_lost_follows_its_host_on_to_its_result(
    state_dir: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    start_node: Callable[..., NodeProcess],
    loss: str,
) -> None:
    """A foreground `workflow` followed with no takeover: the lost node ended it with exit 3
    while its host went on running the script with nobody following it."""
    node = start_node(state_dir=state_dir)
    script = state_dir / "gated.py"
    script.write_text(_GATED_WORKFLOW.format(gate=str(gate.path)))
    command = cli_command(state_dir, "workflow", str(script))
    commands.append(command)

    out, lines = _across_a_lost_node(command, gate, node, LOSSES[loss], 0)

    assert command.returncode == 0, (out, lines)
    assert "result: " in out and "released 0" in out, out  # the script's own value
    shown = progress(lines)
    assert len(shown) == len(set(shown)) and shown[-1] == "run R complete", lines
    assert "run R recovered" in shown, lines


def test_a_workflow_awaiting_a_child_when_its_node_stops_awaits_it_on_the_next_node(
    state_dir: Path,
    agents: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    start_node: Callable[..., NodeProcess],
) -> None:
    """The host's wait on its child ended with NodeNotRunning as soon as it saw no node: the
    script failed (`Workflow failed: NodeNotRunning`) though its child went on and completed.
    The host now waits for the state dir's next node (the pid file it writes, with inotify)
    and awaits its child there."""
    node = start_node(state_dir=state_dir)
    script = state_dir / "awaits.py"
    script.write_text(
        f"def main(runs):\n    return runs.run('g', 'gate', {str(gate.path)!r}).output\n"
    )
    command = cli_command(
        state_dir, "workflow", "--async", "--agents-dir", str(agents), str(script)
    )
    commands.append(command)
    out, err = command.communicate(timeout=WAIT_S)
    assert command.returncode == 0, err
    run_id = out.strip()
    [child] = gate.accept(1)
    with connect(node.address, timeout=5) as client:
        host = client.runs.show(run_id).children[0].pid
    assert host is not None

    assert node.stop().returncode == 0
    wait_until(
        lambda: process_gone(host) or watches_inotify(host), what="the host to see the node go"
    )
    assert not process_gone(host), "the workflow host gave up when its node stopped"
    again = start_node(state_dir=state_dir)
    child.release(0)

    with connect(again.address, timeout=5) as client:
        final = client.runs.wait(run_id, timeout=WAIT_S)
    assert final.state == "complete", final.error
    assert "released 0" in final.output, final.output


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_wait_whose_node_is_lost_follows_on_and_prints_each_runs_end_once(
    state_dir: Path,
    agents: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    start_node: Callable[..., NodeProcess],
    loss: str,
) -> None:
    """`wait` ended with exit 3 ("no node is running") when its node went, though the runs it
    waited on went on to their ends."""
    node = start_node(state_dir=state_dir)
    with connect(node.address, timeout=5) as client:
        launch = launch_context(agents).single("gate", str(gate.path), True, None)
        ids = [client.runs.launch(launch).run_id for _ in range(2)]
    first, second = gate.accept(2)
    command = cli_command(state_dir, "wait", *ids)
    commands.append(command)
    stdout, stderr = StderrLines(command, stdout=True), StderrLines(command)
    gated = {child.pid: child for child in (first, second)}
    with connect(node.address, timeout=5) as client:  # release the first run's gate first
        pid = client.runs.show(ids[0]).children[0].pid
    gated.pop(pid or 0).release(0)
    stdout.wait_for(f"^run {ids[0]} complete$")  # printed while its node served

    lose_and_see_taken_over(stderr, lambda: LOSSES[loss](node))
    [rest] = gated.values()
    rest.release(0)

    assert stdout.to_end() == [f"run {ids[0]} complete", f"run {ids[1]} complete"]
    command.communicate(timeout=WAIT_S)
    assert command.returncode == 0, stderr.to_end()
