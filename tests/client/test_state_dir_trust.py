"""State dir trust (DESIGN §3, issue 12 item 6): refuse a dir another user owns or can write.

Whoever can write to the state dir can replace the node's socket, databases and key files, so
such a dir is refused with a one-line `UnsafeStateDir` naming the path and the fix, before
anything is created in it. The other-user case creates a real user with `useradd` (root only;
skipped with the reason otherwise) and removes it afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.client.paths import ensure_state_dir
from subagents_node.messages.errors import UnsafeStateDir
from subagents_node.node.node import Node
from subagents_node.node.options import NodeOptions
from tests.support.nodes import run_cli


@pytest.fixture
def other_user() -> Iterator[int]:
    """A throwaway local user's uid (created with useradd, deleted at teardown)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create another user with useradd")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed")
    name = f"sa{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", name], check=True, capture_output=True)
    try:
        yield int(subprocess.check_output(["id", "-u", name], text=True))
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def test_design_3_state_dir_owned_by_another_user_is_refused(
    other_user: int, tmp_path: Path
) -> None:
    planted = tmp_path / "state"
    planted.mkdir(mode=0o700)
    os.chown(planted, other_user, -1)
    with pytest.raises(UnsafeStateDir) as info:
        Node(NodeOptions(state_dir=planted)).start()
    assert str(planted) in info.value.message and "owned by uid" in info.value.message
    assert list(planted.iterdir()) == []  # nothing created in it
    done = run_cli("start", "--detach", state_dir=planted)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert f"refusing state dir {planted}" in done.stderr
    assert list(planted.iterdir()) == []


def test_design_3_state_dir_under_a_parent_another_user_owns_is_refused(
    other_user: int, tmp_path: Path
) -> None:
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, other_user, -1)
    with pytest.raises(UnsafeStateDir) as info:
        ensure_state_dir(parent / "state")
    assert f"its parent {parent}" in info.value.message
    assert not (parent / "state").exists()


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_design_3_group_or_world_writable_state_dir_is_refused(mode: int, tmp_path: Path) -> None:
    loose = tmp_path / "state"
    loose.mkdir()
    loose.chmod(mode)
    with pytest.raises(UnsafeStateDir) as info:
        ensure_state_dir(loose)
    assert f"chmod 700 {loose}" in info.value.message
    assert info.value.details["path"] == str(loose)
    assert loose.stat().st_mode & 0o777 == mode  # refused, not silently repaired
    started = run_cli("start", "--detach", state_dir=loose)
    assert started.returncode != 0 and "writable by group or others" in started.stderr


def test_design_3_parents_created_for_the_state_dir_are_private(tmp_path: Path) -> None:
    created = ensure_state_dir(tmp_path / "a" / "b" / "state")
    for directory in (tmp_path / "a", tmp_path / "a" / "b", created):
        assert directory.stat().st_mode & 0o777 == 0o700, directory


def test_design_3_writable_non_sticky_parent_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeStateDir) as info:
        ensure_state_dir(shared / "state")
    assert f"chmod go-w {shared}" in info.value.message
    shared.chmod(0o1777)  # sticky, like /tmp: others cannot replace what we create
    assert ensure_state_dir(shared / "state").stat().st_mode & 0o777 == 0o700


def test_design_3_own_readable_state_dir_is_tightened_to_0700(tmp_path: Path) -> None:
    mine = tmp_path / "state"
    mine.mkdir(mode=0o755)
    mine.chmod(0o755)
    ensure_state_dir(mine)
    assert mine.stat().st_mode & 0o777 == 0o700


def test_a_state_dir_that_is_a_symlink_to_nothing_is_refused_naming_both(tmp_path: Path) -> None:
    link = tmp_path / "state"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(UnsafeStateDir) as refused:
        ensure_state_dir(link)
    assert refused.value.message == (
        f"state dir {link} is a symlink to {tmp_path / 'missing'}, which does not exist; "
        "create that directory or choose another --state-dir"
    )
    assert not (tmp_path / "missing").exists()


def test_design_3_a_dir_in_use_for_other_files_is_refused_never_chmodded(tmp_path: Path) -> None:
    """`--state-dir /` (as root), `~` or a project's own dir was chmod'ed 0700 like an empty
    dir: `start --detach --state-dir /` made `/` 0700, locking every other user out of the
    whole file system, and scattered the node's databases, log and runs/ among its files."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "README").write_text("mine\n")
    project.chmod(0o755)
    before = sorted(p.name for p in project.iterdir())
    with pytest.raises(UnsafeStateDir) as refused:
        ensure_state_dir(project)
    assert refused.value.details["reason"] == "foreign"
    assert "choose a new or empty directory" in refused.value.message
    try:
        for command in (("start", "--detach"), ("keys", "generate")):
            done = run_cli(*command, state_dir=project)
            assert done.returncode == 1, done
            assert done.stderr.startswith(f"error: refusing state dir {project}: it is open to")
            assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    finally:
        if (project / "node.sock").exists():  # the fault: a node started there; stop it
            run_cli("stop", state_dir=project)
    assert project.stat().st_mode & 0o777 == 0o755  # unchanged
    assert sorted(p.name for p in project.iterdir()) == before  # nothing written in it
    doctor = run_cli("doctor", state_dir=project)
    assert doctor.returncode == 1
    assert "fix: chmod 700" not in doctor.stdout  # the advice would lock others out as well
    assert "[FAIL] state dir trust: refusing state dir" in doctor.stdout


def test_design_3_a_readable_dir_that_holds_a_nodes_files_is_still_tightened(
    tmp_path: Path,
) -> None:
    old = tmp_path / "state"
    old.mkdir()
    (old / "node.log").write_text("")
    (old / "runs").mkdir()
    old.chmod(0o755)
    ensure_state_dir(old)
    assert old.stat().st_mode & 0o777 == 0o700
