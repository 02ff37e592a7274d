"""The one way the node opens and replaces its files in the state dir (messages/statefiles.py):
never through a symlink, never blocking on a FIFO, a regular file only, and temp files under a
name nobody could have planted. Each refusal is at once, an OSError saying what was found.
Real files, FIFOs, symlinks, directories; each open that could block runs in a thread with a
deadline."""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.messages import statefiles

PRECIOUS = b"precious\n"


def at_once(call: Callable[[], object]) -> BaseException | object:
    """What `call` returned or raised, failing the test if it blocked (a FIFO's open)."""
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # the test inspects whatever it was
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the open blocked"
    return outcome[0]


@pytest.mark.parametrize(
    "flags", [os.O_RDONLY, os.O_WRONLY | os.O_APPEND | os.O_CREAT], ids=["read", "append"]
)
def test_a_fifo_is_refused_at_once_for_reading_and_for_writing(tmp_path: Path, flags: int) -> None:
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    refused = at_once(lambda: statefiles.open_file(fifo, flags))
    assert isinstance(refused, OSError), refused
    assert refused.strerror == "a FIFO, not a regular file"
    assert refused.filename == str(fifo)


@pytest.mark.parametrize(
    "flags", [os.O_RDONLY, os.O_WRONLY | os.O_APPEND | os.O_CREAT], ids=["read", "append"]
)
def test_a_symlink_is_never_followed_and_its_target_is_left_as_it_was(
    tmp_path: Path, flags: int
) -> None:
    target = tmp_path / "outside"
    target.write_bytes(PRECIOUS)
    link = tmp_path / "node.log"
    link.symlink_to(target)
    with pytest.raises(OSError) as refused:
        statefiles.open_file(link, flags)
    assert refused.value.strerror == "a symbolic link, not a regular file"
    assert target.read_bytes() == PRECIOUS


def test_a_directory_is_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(OSError) as refused:
        statefiles.read_file(tmp_path)
    assert refused.value.strerror == "a directory, not a regular file"


def test_a_regular_file_opens_blocking_and_not_inherited(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    fd = statefiles.open_file(path, os.O_WRONLY | os.O_CREAT)
    try:
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
        assert not os.get_inheritable(fd)
        assert os.fstat(fd).st_mode & 0o777 == 0o600
    finally:
        os.close(fd)


def test_a_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "recovery.json"
    path.write_bytes(b"x" * 101)
    assert statefiles.read_file(path, 101) == b"x" * 101
    with pytest.raises(OSError) as refused:
        statefiles.read_file(path, 100)
    assert refused.value.strerror == "larger than 100 bytes"


def test_replace_file_replaces_a_symlink_at_its_path_and_never_writes_through_it(
    tmp_path: Path,
) -> None:
    target = tmp_path / "outside"
    target.write_bytes(PRECIOUS)
    path = tmp_path / "summary.json"
    path.symlink_to(target)
    assert statefiles.replace_file(path, b"{}", sync=False)
    assert not path.is_symlink() and path.read_bytes() == b"{}"
    assert target.read_bytes() == PRECIOUS
    assert sorted(os.listdir(tmp_path)) == ["outside", "summary.json"]  # no temp file left


def test_restrict_socket_sets_the_mode_of_the_socket_bound_there(tmp_path: Path) -> None:
    path = tmp_path / "owner.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        path.chmod(0o755)
        statefiles.restrict_socket(path)
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600


def test_restrict_socket_never_changes_the_file_a_link_planted_in_its_place_names(
    tmp_path: Path,
) -> None:
    """DESIGN §3: its `chmod` by name, just after the bind, followed a link that replaced the
    socket to whatever file it named (a same-user process that knows the state dir)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("x")
    victim.chmod(0o644)
    path = tmp_path / "owner.sock"
    path.symlink_to(victim)
    with pytest.raises(OSError):
        statefiles.restrict_socket(path)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    victim.unlink()
    path.unlink()
    path.write_text("")  # a regular file where the socket was: refused, left as it was
    path.chmod(0o644)
    with pytest.raises(OSError, match="not the socket bound there"):
        statefiles.restrict_socket(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
