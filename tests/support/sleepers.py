"""Helpers of the tests that kill a foreground command with -9 and look for what its run left:
the sleeper agent (a child, a grandchild in its group and a `setsid()` daemon) started by a CLI
command, their pids read from a FIFO, the shims of a run found by their claims, what a shim is
bound to read from its descriptors, and a wait for processes to be gone. It never mocks ZeroMQ,
SQLite or processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.foreground import cli_command
from tests.support.runs import EXAMPLE_AGENTS, WAIT_S, wait_gone

#: The sleeper's task: a long sleep, a grandchild in its group and a `setsid()` daemon, their
#: pids written to the FIFO once all three run (examples/agents/sleeper.py).
SLEEPER_TASK = "seconds=600 grandchild=1 daemon=600 ready={fifo}"


@pytest.fixture
def orphans_dir() -> Iterator[Path]:
    """A short state dir of this test's own (ipc socket paths must stay under 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="orphans-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def read_pids(fifo: Path, proc: subprocess.Popen[str]) -> list[int]:
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


def shim_pids(state_dir: Path, run_id: str = "*") -> list[int]:
    """Every shim that claimed a child of the run(s) (runs/<id>/child-<i>/shim.json)."""
    return [
        int(json.loads(path.read_text())["shim_pid"])
        for path in (state_dir / "runs").glob(f"{run_id}/child-*/shim.json")
    ]


def watched_by(shim: int) -> set[int]:
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


def assert_gone(pids: list[int]) -> None:
    try:
        for pid in pids:
            wait_gone(pid, WAIT_S)
    finally:
        for pid in pids:  # a failed check must not leave sleepers behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def sleeping_command(
    state_dir: Path, *args: str, ready: str = "ready"
) -> tuple[subprocess.Popen[str], list[int]]:
    """`subagents-node ARGS... TASK` with the sleeper's task last, and the pids of the sleeper,
    its grandchild and its setsid() daemon once they all run. `ready` names the sleeper's FIFO
    (one per sleeper running at once)."""
    fifo = state_dir.parent / f"{state_dir.name}.{ready}"
    os.mkfifo(fifo)
    try:
        command = cli_command(state_dir, *args, SLEEPER_TASK.format(fifo=fifo))
        return command, read_pids(fifo, command)
    finally:
        fifo.unlink()


def foreground_sleeper(
    state_dir: Path, agent: str = "sleeper", agents: Path = EXAMPLE_AGENTS, ready: str = "ready"
) -> tuple[subprocess.Popen[str], list[int]]:
    """A foreground `run` of `agent` with the sleeper's task (its node embedded when none
    serves the dir), and the pids of the sleeper, its grandchild and its setsid() daemon."""
    return sleeping_command(state_dir, "run", "--agents-dir", str(agents), agent, ready=ready)
