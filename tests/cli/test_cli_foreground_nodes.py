"""A foreground `run` with no node of its own beside other commands on the same state dir.

The first foreground run embeds a node for its own duration; a second one started meanwhile
uses that node, and so does one started while another node is still starting (it holds the
state dir's claim but answers nobody yet). When the node it follows stops under it (the first
run ended, and its embedded node with it) the second must neither fail nor leave its child
running unfollowed: the child's shim outlives the node, a node the second run starts adopts
it, and the follow goes on to the child's true end, showing each progress line once (it goes
on after the last event it showed). Real CLI processes, real nodes, a gate socket that
releases each child when the test says.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from subagents_node.client.client import connect
from subagents_node.client.paths import PID_NAME
from subagents_node.node.claim import StateDirClaim
from subagents_node.node.node import Node
from tests.support.foreground import (
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
from tests.support.runs import WAIT_S, Gate, launch_context, wait_until, wait_view


def _foreground(state_dir: Path, agents: Path, gate: Gate, *flags: str) -> subprocess.Popen[str]:
    return cli_command(
        state_dir, "run", "--agents-dir", str(agents), *flags, "gate", str(gate.path)
    )


def test_a_foreground_run_on_another_foreground_runs_node_follows_on_after_that_node_stops(
    state_dir: Path, agents: Path, gate: Gate, commands: list[subprocess.Popen[str]]
) -> None:
    """It used to exit 3 ("no node is running") when the first run ended, its child running on
    with nobody following it."""
    first = _foreground(state_dir, agents, gate)
    commands.append(first)
    [first_child] = gate.accept(1)  # the first run's embedded node serves
    second = _foreground(state_dir, agents, gate)
    commands.append(second)
    [second_child] = gate.accept(1)  # launched on the first run's node
    first_child.release(0)
    out, err = first.communicate(timeout=WAIT_S)
    assert first.returncode == 0, err
    second_child.release(0)
    out, err = second.communicate(timeout=WAIT_S)
    assert second.returncode == 0, (out, err)
    assert re.search(r"run [0-9a-f]{12} complete", out), out
    assert "released 0" in out  # the child's own output: adopted, not restarted
    shown = progress(err.splitlines())
    assert len(shown) == len(set(shown)) and shown[-1] == "run R complete", err
    second_child.wait_exit()


def test_a_foreground_run_started_while_another_node_starts_waits_for_it_and_uses_it(
    state_dir: Path, agents: Path, gate: Gate, commands: list[subprocess.Popen[str]]
) -> None:
    """It used to be refused at once: "another node is starting or stopping; retry"."""
    claim = StateDirClaim(state_dir)
    claim.take()  # a node is starting: it holds the state dir, answers nobody yet
    try:
        command = _foreground(state_dir, agents, gate)
        commands.append(command)
        wait_until(
            lambda: command.poll() is not None or watches_inotify(command.pid),
            what="the command waiting for the starting node",
        )
        assert command.poll() is None, command.communicate()
    finally:
        claim.release()
    with Node.embedded(state_dir=state_dir):  # the node that was starting now serves
        [child] = gate.accept(1)
        child.release(0)
        out, err = command.communicate(timeout=WAIT_S)
    assert command.returncode == 0, (out, err)
    assert re.search(r"run [0-9a-f]{12} complete", out), out


def test_a_background_run_on_a_foreground_runs_node_is_handed_to_a_node_when_that_run_ends(
    state_dir: Path, agents: Path, gate: Gate, commands: list[subprocess.Popen[str]]
) -> None:
    """`run --async` found the foreground run's embedded node serving and launched on it; when
    the foreground command ended, its node stopped and the background run was left with no
    node at all (`show` said "no node is running") until someone started one."""
    first = _foreground(state_dir, agents, gate)
    commands.append(first)
    [first_child] = gate.accept(1)
    background = _foreground(state_dir, agents, gate, "--async")
    commands.append(background)
    out, err = background.communicate(timeout=WAIT_S)
    assert background.returncode == 0, err
    run_id = out.strip()
    [background_child] = gate.accept(1)
    first_child.release(0)
    _, err = first.communicate(timeout=WAIT_S)
    assert first.returncode == 0, err
    assert "1 run still going: started a node" in err
    assert "to supervise it; stop it" in err  # one run: "them" read wrong
    with connect(f"ipc://{state_dir}/node.sock", timeout=5) as client:
        assert client.runs.show(run_id).state == "running"
        background_child.release(0)
        final = client.runs.wait(run_id, timeout=WAIT_S)
        assert final.state == "complete", final
        assert "released 0" in final.output


def test_a_paused_run_on_the_state_dir_is_not_handed_to_a_node_when_a_foreground_run_ends(
    state_dir: Path, agents: Path, gate: Gate, commands: list[subprocess.Popen[str]]
) -> None:
    """A paused run holds no process, so nothing needs to supervise it: the foreground
    command's embedded node stops at its end and leaves no detached node behind for it."""
    with Node.embedded(state_dir=state_dir) as node:
        client = node.client()
        launch = launch_context(agents).single("gate", str(gate.path), True, None)
        paused = client.runs.launch(launch)
        [held] = gate.accept(1)
        client.runs.pause(paused.run_id)
        wait_view(client, paused.run_id, lambda v: v.state == "paused")
        held.wait_exit()

    command = _foreground(state_dir, agents, gate)
    commands.append(command)
    [child] = gate.accept(1)
    child.release(0)
    _, err = command.communicate(timeout=WAIT_S)

    assert command.returncode == 0, err
    assert "still going" not in err
    assert not (state_dir / PID_NAME).exists()
    with Node.embedded(state_dir=state_dir) as node:
        assert node.client().runs.show(paused.run_id).state == "paused"


def _follow_across_a_lost_node(
    state_dir: Path,
    agents: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    node: NodeProcess,
    lose: Callable[[NodeProcess], None],
) -> list[str]:
    """A foreground parallel run of two gates on `node`: one ends and is shown, `lose` takes
    the node away, the other ends (while no node serves, or as the next one adopts it). The
    command's stderr, once it exited 0."""
    tasks = state_dir / "tasks.toml"
    tasks.write_text(f'[[tasks]]\nagent = "gate"\ntask = "{gate.path}"\n' * 2)
    command = cli_command(state_dir, "run", "--agents-dir", str(agents), "--parallel", str(tasks))
    commands.append(command)
    stderr = StderrLines(command)
    first, second = gate.accept(2)
    first.release(0)
    stderr.wait_for(r" \(gate\) complete \(exit 0\)$")  # shown while its node served
    lose_and_see_taken_over(stderr, lambda: lose(node))
    second.release(0)
    lines = stderr.to_end()
    out, _ = command.communicate(timeout=WAIT_S)  # closes the pipes
    assert command.returncode == 0, (out, lines)
    assert "released 0" in out  # the adopted child's own output
    return lines


#: What the follow shows of that run: every event once, whichever node recorded it.
_SHOWN_ONCE = Counter(
    [
        "run R started",
        "started tasks[0] (gate) pid P",
        "started tasks[1] (gate) pid P",
        "tasks[0] (gate) complete (exit 0)",
        "tasks[1] (gate) complete (exit 0)",
        "run R recovered",  # the node that took the state dir over adopted the run
        "run R complete",
    ]
)


def test_a_foreground_run_whose_node_is_stopped_shows_each_progress_line_once_on_the_next_node(
    state_dir: Path,
    agents: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    start_node: Callable[..., NodeProcess],
) -> None:
    """The follow on the node the command started began again from the run's first event:
    every line already shown was shown a second time (a script counting events counted them
    twice). It resumes after the last event it showed; none is lost either."""

    def stop(node: NodeProcess) -> None:
        assert node.stop().returncode == 0

    lines = _follow_across_a_lost_node(
        state_dir, agents, gate, commands, start_node(state_dir=state_dir), stop
    )
    shown = progress(lines)
    assert Counter(shown) == _SHOWN_ONCE, lines
    assert shown[-1] == "run R complete", lines


def test_a_foreground_run_whose_node_is_killed_follows_on_at_once_showing_each_line_once(
    state_dir: Path,
    agents: Path,
    gate: Gate,
    commands: list[subprocess.Popen[str]],
    start_node: Callable[..., NodeProcess],
) -> None:
    """A node killed with -9 leaves its socket file behind: the follow's long poll waited out
    its 10 s and the client's 10 s timeout, then the command exited 4 ("did not answer
    runs.watch in time") and left its run going with nobody following it. The client now sees
    the node's pid record name a dead process as soon as a reply is late, and the follow takes
    the state dir over as when the node stops."""
    lines = _follow_across_a_lost_node(
        state_dir, agents, gate, commands, start_node(state_dir=state_dir), NodeProcess.kill
    )
    shown = progress(lines)
    assert Counter(shown) == _SHOWN_ONCE, lines
    assert shown[-1] == "run R complete", lines
