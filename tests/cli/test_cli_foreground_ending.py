"""A foreground `run` ended while it follows its run: two Ctrl-C's at once (runs.md fault 1).

However many signals come and however slow its terminal is, the command sends the stop for the
run it launched before it writes anything, and exits 128 + the first signal. Real processes and
pipes; every wait is on output or a reply, with a deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from subagents_node.cli.ending import Ended, EndingSignals
from tests.support.foreground import StderrLines
from tests.support.nodes import CLI, REPO, NodeProcess
from tests.support.runs import EXAMPLE_AGENTS, WAIT_S

RUN_STARTED = r"run ([0-9a-f]{12}) started"


def _run_argv(state_dir: Path, task: str) -> list[str]:
    return [
        *CLI,
        *("--state-dir", str(state_dir), "run", "--agents-dir", str(EXAMPLE_AGENTS)),
        *("sleeper", task),
    ]


def test_a_second_signal_while_the_first_unwinds_waits_for_the_stop() -> None:
    """The signal acted on raised, and a second one that came before the follower's handler
    had sent the stop (while the exception unwound, or a terminal write blocked) raised again
    and escaped it: the run went on and the command said no run was launched. Now every signal
    after the one acted on is only counted until the follower asks for them again."""
    with EndingSignals() as signals:
        with signals.holding():
            pass  # the launch
        with pytest.raises(KeyboardInterrupt), signals.raising():  # the follow
            signal.raise_signal(signal.SIGINT)  # its handler runs before this returns
        try:  # the second Ctrl-C, and a TERM, before the stop is sent
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
        except (KeyboardInterrupt, Ended):
            pytest.fail("a signal after the first escaped the follower before its stop")
        assert (signals.count, signals.pending) == (3, signal.SIGINT)
        # The stop sent: from here a second signal ends the command.
        with pytest.raises(KeyboardInterrupt), signals.raising(acted_on=1):
            pass


def _fill_stderr(pid: int) -> None:
    """Fill the pipe that is the stderr of process `pid` (through a descriptor of the test's
    own, non-blocking): the process's next write there blocks until the pipe is read."""
    fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK)
    try:
        chunk = b"x" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except BlockingIOError:
                if len(chunk) == 1:
                    return
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)


def test_two_ctrl_cs_while_the_terminal_write_blocks_still_stop_the_run(
    node: NodeProcess,
) -> None:
    """runs.md fault 1: the handler wrote `stopping run …` before it sent the stop; with that
    write blocked (a full pipe here; a slow or paused terminal, or the live table's redraw),
    no stop went out, and a second SIGINT (a double Ctrl-C, a wrapper forwarding SIGINT to a
    group that got it too) escaped the handler: `interrupted: no run was launched`, exit 130,
    and the run went on on the detached node. Now the stop goes first."""
    client = node.client()
    run_id = ""
    proc = subprocess.Popen(
        _run_argv(node.state_dir, "seconds=60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    try:
        lines = StderrLines(proc)
        started = lines.wait_for(RUN_STARTED)
        run_id = re.search(RUN_STARTED, started).group(1)  # type: ignore[union-attr]
        lines.wait_for(r"started .* \(sleeper\) pid \d+")  # followed, its child running
        _fill_stderr(proc.pid)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        # The pipe stays full: the stop must not wait for the command's stderr.
        final = client.runs.wait(run_id, timeout=WAIT_S)
        assert final.state == "stopped"
        said = re.sub("x{8,}", "", "\n".join(lines.to_end()))  # the test's filling
        out, _ = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 130, (out, said)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)
        if run_id:
            client.runs.stop(run_id)  # a failed check must not leave the sleeper behind
    assert "no run was launched" not in said, said
    assert f"run {run_id}" in said, said
