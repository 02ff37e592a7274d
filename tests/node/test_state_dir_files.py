"""The node's own files in its state dir replaced by a symlink, a FIFO or a directory (anyone
running as the node's user can do it): the node never writes through a link to a file outside
the state dir, and a start it cannot make says why in one line.

It used to append `node.log` through a symlink and chmod the file it named to 0600, write its
pid record through a planted `node.tmp` (and the address book through `addressbook.json.tmp`)
over the file the link named before renaming the link into place, wait 20 s on a FIFO as
`node.log`, and, with a directory in place of `node.sock`, fail a detached start with only
"failed to start: exited" (the cause was a traceback in node.log). Real detached nodes.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.client.paths import ADDRESS_BOOK_NAME, LOG_NAME, PID_NAME, read_pid_file
from subagents_node.messages.errors import SubagentsError
from subagents_node.node.daemon import stop_node
from tests.support.nodes import NodeProcess, new_state_dir, run_cli
from tests.support.victims import PRECIOUS
from tests.support.victims import victim as victim

pytestmark = pytest.mark.processes


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A fresh state dir; a node a test started on it (a start that should have been refused
    but was not) is stopped at teardown."""
    path = new_state_dir()
    yield path
    if read_pid_file(path) is not None:
        with contextlib.suppress(SubagentsError):
            stop_node(path)
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            for inner in entry.iterdir():
                inner.unlink()
            entry.rmdir()
        else:
            entry.unlink()
    path.rmdir()


def one_line_refusal(state_dir: Path) -> str:
    """`start --detach` refused: its one line of stderr, and nothing left serving."""
    done = run_cli("start", "--detach", state_dir=state_dir, timeout=60)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert read_pid_file(state_dir) is None
    return lines[0]


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_symlink_or_fifo_as_node_log_is_refused_in_one_line_and_never_written_or_chmodded(
    state_dir: Path, victim: Path, kind: str
) -> None:
    log = state_dir / LOG_NAME
    if kind == "fifo":
        os.mkfifo(log)
    else:
        log.symlink_to(victim)

    line = one_line_refusal(state_dir)

    what = "a FIFO" if kind == "fifo" else "a symbolic link"
    assert f"cannot open {log}: {what}, not a regular file" in line, line
    assert victim.read_bytes() == PRECIOUS
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644


@pytest.mark.parametrize("name", ["node.tmp", f"{ADDRESS_BOOK_NAME}.tmp"])
def test_a_symlink_planted_under_a_temp_files_name_is_never_written_through(
    state_dir: Path, victim: Path, name: str
) -> None:
    (state_dir / name).symlink_to(victim)

    node = NodeProcess(state_dir).start()
    try:
        assert node.client().ping().pid == node.pid
        assert victim.read_bytes() == PRECIOUS
        for written in (PID_NAME, ADDRESS_BOOK_NAME):
            assert stat.S_ISREG(os.lstat(state_dir / written).st_mode), written
    finally:
        node.cleanup()


def test_a_directory_in_place_of_node_sock_fails_a_detached_start_in_one_line_naming_it(
    state_dir: Path,
) -> None:
    sock = state_dir / "node.sock"
    sock.mkdir()

    line = one_line_refusal(state_dir)

    assert f"cannot replace {sock}: Is a directory" in line, line
    assert "exited" not in line
    assert sock.is_dir()


def test_a_fifo_in_place_of_node_pid_is_replaced_by_the_next_start(state_dir: Path) -> None:
    """A start read `node.pid` for the pids a dead node may have left (to wait for them) with
    a blocking open(): a FIFO there held the detached node for good, and `start --detach` gave
    up after its 20 s handshake, leaving that node behind. It is no record: the start serves
    and writes its own."""
    os.mkfifo(state_dir / PID_NAME)
    done = run_cli("start", "--detach", state_dir=state_dir, timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISREG((state_dir / PID_NAME).lstat().st_mode)
    assert read_pid_file(state_dir) is not None
