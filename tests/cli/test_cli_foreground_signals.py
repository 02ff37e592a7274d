"""A foreground `run` with no node running, ended by a signal at each step (issue 11 item 5).

The command starts an embedded node for its own duration. Ctrl-C, SIGTERM or SIGHUP may come
while that node starts or while the launch is in flight, not only while the run is followed;
each time the command must exit 128 + the signal with one line saying what it did, and leave
nothing behind: no child, grandchild or `setsid()` daemon of the run, no owner process, no
socket or pid file in the state dir. The signal is sent by the CLI process to itself at the
exact step (a driver wraps the step and calls the real one first), so the step is never a
matter of timing. Real processes, sockets and files throughout.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.nodes import REPO
from tests.support.runs import EXAMPLE_AGENTS, WAIT_S, wait_gone

#: Runs the CLI (argv[4:]) with SIGINT as a terminal's foreground command has it, and sends
#: itself signal argv[1], argv[3] times, right after step argv[2] returned: `node_start` (the
#: embedded node serves, nothing is launched yet) or `launch` (the run is admitted and its
#: child runs; the CLI has not seen its answer yet). At `launch` it first waits until the
#: sleeper wrote its pids (its own, its grandchild's, its setsid daemon's) into the FIFO named
#: by $READY_FIFO, and copies them into $PIDS_FILE.
_DRIVER = """\
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from subagents_node.client.runs import RunsAPI
from subagents_node.node.node import Node
from subagents_node.cli import main

signum, step, times = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def interrupt():
    for _ in range(times):
        os.kill(os.getpid(), signum)

if step == "launch":
    real_launch = RunsAPI.launch

    def launch(self, request, **options):
        view = real_launch(self, request, **options)
        with open(os.environ["READY_FIFO"]) as fifo:
            pids = fifo.read()
        with open(os.environ["PIDS_FILE"], "w") as out:
            out.write(pids)
        interrupt()
        return view

    RunsAPI.launch = launch
else:
    real_start = Node.start

    def start(self):
        node = real_start(self)
        interrupt()
        return node

    Node.start = start
sys.argv = ["subagents-node", *sys.argv[4:]]
main()
"""

SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
IDS = ["ctrl-c", "terminated", "terminal closed"]


def _run_interrupted(
    state_dir: Path, signum: int, step: str, times: int = 1
) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    fifo = state_dir.parent / f"{state_dir.name}.ready"
    pids_file = state_dir.parent / f"{state_dir.name}.pids"
    os.mkfifo(fifo)
    task = f"seconds=60 grandchild=1 daemon=60 ready={fifo}"
    env = {**os.environ, "READY_FIFO": str(fifo), "PIDS_FILE": str(pids_file)}
    try:
        done = subprocess.run(
            [
                *(sys.executable, "-c", _DRIVER, str(int(signum)), step, str(times)),
                *("--state-dir", str(state_dir), "run", "--agents-dir", str(EXAMPLE_AGENTS)),
                *("sleeper", task),
            ],
            capture_output=True,
            text=True,
            timeout=WAIT_S * 2,
            cwd=REPO,
            env=env,
            check=False,
        )
        pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    finally:
        fifo.unlink()
        pids_file.unlink(missing_ok=True)
    return done, pids


def _left_in(state_dir: Path) -> list[str]:
    """What only a node that still serves (or was killed) leaves in its state dir."""
    return sorted(
        p.name for p in state_dir.iterdir() if p.suffix == ".sock" or p.name == "node.pid"
    )


def _assert_gone(pids: list[int]) -> None:
    try:
        for pid in pids:
            wait_gone(pid)
    finally:
        for pid in pids:  # a failed check must not leave sleepers behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("signum", "exit_code"), SIGNALS, ids=IDS)
def test_a_signal_while_the_launch_is_in_flight_stops_the_run_and_its_whole_tree(
    state_dir: Path, signum: int, exit_code: int
) -> None:
    """It used to end the command at once (SIGTERM, SIGHUP) or leave the run to its shims
    (Ctrl-C): the child, its grandchild and its setsid() daemon ran on with nobody following."""
    done, pids = _run_interrupted(state_dir, signum, "launch")
    assert len(pids) == 3, (done.returncode, done.stdout, done.stderr)
    _assert_gone(pids)
    assert done.returncode == exit_code, (done.stdout, done.stderr)
    assert re.search(r"run [0-9a-f]{12} stopped", done.stdout), done.stdout
    assert _left_in(state_dir) == []


def test_a_second_signal_while_the_launch_is_in_flight_still_stops_the_run(
    state_dir: Path,
) -> None:
    done, pids = _run_interrupted(state_dir, signal.SIGINT, "launch", times=2)
    _assert_gone(pids)
    assert done.returncode == 130, (done.stdout, done.stderr)
    assert "interrupted again" in done.stderr
    assert _left_in(state_dir) == []


@pytest.mark.parametrize(("signum", "exit_code"), SIGNALS, ids=IDS)
def test_a_signal_while_the_embedded_node_starts_launches_nothing_and_stops_the_node(
    state_dir: Path, signum: int, exit_code: int
) -> None:
    """SIGTERM and SIGHUP used to kill the command there, leaving the node's pid file and
    sockets behind; Ctrl-C said only `error: interrupted`."""
    done, _ = _run_interrupted(state_dir, signum, "node_start")
    assert done.returncode == exit_code, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines()[-1] == "interrupted: no run was launched"
    assert not (state_dir / "runs").exists() or not any((state_dir / "runs").iterdir())
    assert _left_in(state_dir) == []
