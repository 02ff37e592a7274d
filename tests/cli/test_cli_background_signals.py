"""`run --async` and `resume` ended by a signal while their launch is in flight (runs.md fault 5).

The node has admitted the run (it holds a capacity slot, its child runs) but the command has
not seen the answer yet. It must see it through: print the run id as always, say the run goes
on, and exit 128 + the signal; it used to say `error: interrupted` and never print the id.
The signal is sent by the CLI process to itself right after the real request returned (a
driver wraps it), so the step is never a matter of timing. Real processes and a real node.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from tests.support.nodes import REPO, NodeProcess, run_cli
from tests.support.runs import EXAMPLE_AGENTS, WAIT_S

#: Runs the CLI (argv[2:]) with SIGINT as a terminal's foreground command has it, and sends
#: itself signal argv[1] right after a launch or a resume request got its answer, before the
#: command has seen it.
_DRIVER = """\
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from subagents_node.client.client import Client
from subagents_node.client.runs import RunsAPI
from subagents_node.cli import main

signum = int(sys.argv[1])
real_launch, real_ask = RunsAPI.launch, Client.ask

def launch(self, request, **options):
    view = real_launch(self, request, **options)
    os.kill(os.getpid(), signum)
    return view

def ask(self, request, *args, **options):
    reply = real_ask(self, request, *args, **options)
    if type(request).__name__ == "Resume":
        os.kill(os.getpid(), signum)
    return reply

RunsAPI.launch, Client.ask = launch, ask
sys.argv = ["subagents-node", *sys.argv[2:]]
main()
"""

RUN_ID = re.compile(r"[0-9a-f]{12}")


def _interrupted(node: NodeProcess, signum: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            _DRIVER,
            str(int(signum)),
            "--state-dir",
            str(node.state_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        cwd=REPO,
        check=False,
    )


def _seen_through(done: subprocess.CompletedProcess[str], exit_code: int) -> str:
    """The run id the command printed, once it said the run goes on and exited `exit_code`."""
    assert done.returncode == exit_code, (done.stdout, done.stderr)
    run_id = done.stdout.strip()
    assert RUN_ID.fullmatch(run_id), (done.stdout, done.stderr)
    assert f"interrupted: run {run_id} was launched and goes on" in done.stderr, done.stderr
    assert "error" not in done.stderr, done.stderr
    return run_id


@pytest.mark.parametrize(
    ("signum", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "term"]
)
def test_a_signal_while_a_background_launch_is_in_flight_still_prints_its_run_id(
    node: NodeProcess, signum: int, exit_code: int
) -> None:
    """The command said `error: interrupted` (or died of the SIGTERM) and printed no id, while
    the run it launched went on holding a slot of its session's capacity."""
    done = _interrupted(
        node, signum, "run", "--async", "--agents-dir", str(EXAMPLE_AGENTS), "sleeper", "seconds=60"
    )
    client = node.client()
    running = [run.run_id for run in client.runs.list(active_only=True)]
    try:
        run_id = _seen_through(done, exit_code)
        assert running == [run_id]
        assert "session" in done.stderr  # as ever: the session it counts against
    finally:
        for left in running:  # a failed check must not leave the sleeper behind
            client.runs.stop(left)


def test_ctrl_c_while_a_resume_is_in_flight_still_prints_the_resumed_run_id(
    node: NodeProcess,
) -> None:
    """`resume` said `error: interrupted`, yet it had launched the relaunch, which went on."""
    started = run_cli(
        "run",
        "--async",
        "--agents-dir",
        str(EXAMPLE_AGENTS),
        "sleeper",
        "seconds=0",
        state_dir=node.state_dir,
    )
    source = started.stdout.strip()
    client = node.client()
    assert client.runs.wait(source, timeout=WAIT_S).state == "complete"
    done = _interrupted(node, signal.SIGINT, "resume", source)
    run_id = _seen_through(done, 130)
    resumed = client.runs.wait(run_id, timeout=WAIT_S)
    assert resumed.source_run_id == source
