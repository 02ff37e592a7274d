"""A state dir whose file system is mounted read-only (DESIGN §5; issue-style: resource
exhaustion). The node cannot serve from it, and says so in one line; `doctor` names the cause
and never advises what would lose a ledger.

`start --detach` used to print the forked node's traceback (opening node.log: EROFS) and then
send the user to that log, which could not exist. `doctor` reported every owner database as
unreadable and advised moving it aside, "its ledger starts empty", for what a remount fixes.

The state dir is a tmpfs the test mounts and remounts read-only (root only; skipped
otherwise), unmounted in `finally`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.client.paths import read_pid_file
from tests.support import tmpfs
from tests.support.nodes import run_cli, running_node

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs state dir needs root"),
]


@pytest.fixture
def read_only_state_dir() -> Iterator[Path]:
    """A state dir a node has served (its databases exist), then remounted read-only."""
    directory = Path(tempfile.mkdtemp(prefix="sa-ro-", dir="/tmp"))
    try:
        with tmpfs.mounted(directory, "size=64m,mode=0700"):
            with running_node(state_dir=directory) as node:
                assert node.stop().returncode == 0
            tmpfs.remount(directory, "ro")
            yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_start_on_a_read_only_state_dir_fails_with_one_line_naming_the_cause(
    read_only_state_dir: Path,
) -> None:
    done = run_cli("start", "--detach", state_dir=read_only_state_dir, timeout=20)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Read-only file system" in lines[0], lines[0]
    assert read_pid_file(read_only_state_dir) is None


def test_doctor_on_a_read_only_state_dir_names_it_and_never_advises_moving_a_ledger_aside(
    read_only_state_dir: Path,
) -> None:
    done = run_cli("doctor", state_dir=read_only_state_dir, timeout=30)
    assert "read-only file system" in done.stdout, done.stdout
    assert "move it aside" not in done.stdout, done.stdout
    assert "store capacity integrity: PRAGMA integrity_check: ok" in done.stdout, done.stdout


@pytest.fixture
def fresh_read_only_state_dir() -> Iterator[Path]:
    """An empty state dir (no node ever served it) on a file system mounted read-only."""
    directory = Path(tempfile.mkdtemp(prefix="sa-ro-", dir="/tmp"))
    try:
        with tmpfs.mounted(directory, "size=1m,mode=0700,ro"):
            yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_fresh_read_only_state_dir_is_named_read_only_with_no_advice_that_cannot_work(
    fresh_read_only_state_dir: Path,
) -> None:
    """A foreground `run` (or `start`) said "cannot replace .../node.sock: Read-only file
    system; move it aside (mv ...)" for a socket that did not exist (unlink says EROFS first),
    and `start --detach` sent the user to a node.log it could not create."""
    where = fresh_read_only_state_dir
    for command in (("start",), ("run", "--agents-dir", "examples/agents", "sleeper", "x")):
        done = run_cli(*command, state_dir=where, timeout=20)
        assert done.returncode == 1, done.stdout
        assert done.stderr == (
            f"error: state dir {where} is on a read-only file system; remount it read-write "
            "(mount -o remount,rw MOUNTPOINT) or choose another --state-dir\n"
        )
    detached = run_cli("start", "--detach", state_dir=where, timeout=20)
    assert detached.returncode == 1
    assert detached.stderr.strip().endswith("Read-only file system"), detached.stderr
    assert "see " not in detached.stderr
