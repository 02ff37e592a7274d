"""Helpers of the tests that follow a foreground command across its node's loss: the command
run as a real CLI process, its stderr read as it comes (select with deadlines, never a sleep),
and its progress lines as the follow showed them. It never mocks ZeroMQ, SQLite or processes.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subagents_node.client.runs import WATCH_WAIT_S
from tests.support.nodes import REPO, NodeProcess
from tests.support.runs import WAIT_S


def cli_command(state_dir: Path, command: str, *args: str) -> subprocess.Popen[str]:
    """`subagents-node COMMAND ARGS...` on the state dir, its stdout and stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir), command, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def stop_node(state_dir: Path) -> None:
    """Stop the node a handover started, if any (`stop` with none running changes nothing)."""
    subprocess.run(
        [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir), "stop"],
        capture_output=True,
        timeout=WAIT_S,
        cwd=REPO,
        check=False,
    )


class StderrLines:
    """A command's stderr (or stdout) read as it comes: select on the pipe, each wait with a
    deadline."""

    def __init__(self, proc: subprocess.Popen[str], stdout: bool = False) -> None:
        stream = proc.stdout if stdout else proc.stderr  # stdout: a command's results
        assert stream is not None
        self._fd = stream.fileno()  # read raw: the text wrapper would buffer ahead
        self._partial = b""
        self.lines: list[str] = []
        self.ended = False

    def _read(self, deadline: float) -> bool:
        ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        chunk = os.read(self._fd, 65536)
        if not chunk:
            self.ended = True
            if self._partial:
                self.lines.append(self._partial.decode())
            return False
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        self.lines += [line.decode() for line in whole]
        return True

    def wait_for(self, pattern: str) -> str:
        """The first line matching `pattern`, once the command has written it."""
        deadline = time.monotonic() + WAIT_S
        while True:
            found = next((line for line in self.lines if re.search(pattern, line)), None)
            if found is not None:
                return found
            assert self._read(deadline), f"no line matching {pattern!r}: {self.lines}"

    def to_end(self) -> list[str]:
        """Every line, once the command closed its stderr (it ended)."""
        deadline = time.monotonic() + WAIT_S
        while not self.ended:
            assert self._read(deadline) or self.ended, f"stderr still open: {self.lines}"
        return self.lines


def stop_cleanly(node: NodeProcess) -> None:
    assert node.stop().returncode == 0


#: The ways a node goes under a following command: `stop`, and kill -9.
LOSSES: dict[str, Callable[[NodeProcess], None]] = {
    "stopped": stop_cleanly,
    "killed": NodeProcess.kill,
}


def lose_and_see_taken_over(stderr: StderrLines, lose: Callable[[], object]) -> None:
    """`lose()` takes the node away; the command must say it took the state dir over before
    the follow's long poll (WATCH_WAIT_S at the node) could have run out: a takeover that
    waited it out (or the client's timeout after it) did not see the node go."""
    lose()
    lost_at = time.monotonic()
    stderr.wait_for("the node stopped under")
    taken_over = time.monotonic() - lost_at
    assert taken_over < WATCH_WAIT_S, f"took {taken_over:.1f} s to see the node go"


#: A progress line of a followed run (runtime/cli/following.py `describe`): a time stamp first.
PROGRESS = re.compile(r"\d\d:\d\d:\d\d (.*)")


def progress(lines: list[str]) -> list[str]:
    """The progress lines, without their stamp, run id or pid (the same in every run)."""
    shown = [m.group(1) for line in lines if (m := PROGRESS.fullmatch(line))]
    return [re.sub(r"pid \d+", "pid P", re.sub(r"run [0-9a-f]{12}", "run R", s)) for s in shown]


def watches_inotify(pid: int) -> bool:
    """Whether the process holds an inotify watch (waiting for a node's pid file)."""
    try:
        fdinfo = list(Path(f"/proc/{pid}/fdinfo").iterdir())
    except FileNotFoundError:
        return False
    for info in fdinfo:
        try:
            if "inotify wd:" in info.read_text():
                return True
        except OSError:
            continue
    return False


@pytest.fixture
def commands(state_dir: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:  # a failed check must not leave a command (and its node) behind
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=WAIT_S)
    stop_node(state_dir)
