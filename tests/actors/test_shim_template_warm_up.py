"""The shim template's warm-up (actors/child/template.py) writes only in a directory it made.

It used `/tmp/subagents-shim-warm-up.<its pid>` as it found it: a local user who planted that
name as a link to a directory of their choosing had the template, as the node's user (root on
many hosts), write its warm-up files there and then unlink every file in it. It now makes a
new directory of a name nobody can foresee (under $TMPDIR), and a template that cannot make one
serves without its warm-up rather than not at all (the hostile-local-user and full-disk rules
of the developers' guide; DESIGN §1, the shim template)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.actors.child.shimtemplate import TEMPLATE_MODULE
from tests.actors.test_child import Harness

# The template, held before its first line until the test says go (one byte on stdin), so the
# link is in place before the warm-up looks; then it runs as `python -m TEMPLATE_MODULE` does.
_HELD_TEMPLATE = f"""
import os, runpy
os.read(0, 1)
runpy.run_module({TEMPLATE_MODULE!r}, run_name="__main__")
"""


@pytest.fixture
def own_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    yield scratch


def test_warm_up_never_writes_through_a_link_planted_at_a_foreseeable_name(
    tmp_path: Path, own_tmpdir: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("kept\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", _HELD_TEMPLATE], stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    # The name the old template used, planted where it looked (/tmp, whatever $TMPDIR said).
    planted = Path("/tmp") / f"subagents-shim-warm-up.{proc.pid}"
    with proc:
        assert proc.stdin is not None and proc.stderr is not None
        try:
            planted.symlink_to(victim)
            proc.stdin.write(b"g")
            proc.stdin.close()  # after its warm-up, the template reads EOF and exits
            err = proc.stderr.read()  # to its end: the template has exited
            proc.wait(timeout=60)
        finally:
            planted.unlink(missing_ok=True)
            if proc.poll() is None:
                proc.kill()
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]
    assert (victim / "precious").read_text() == "kept\n"
    assert proc.returncode == 0, err.decode()
    assert list(own_tmpdir.iterdir()) == []  # its own directory made, used and removed
    assert b"no warm-up" not in err


def test_a_template_with_no_directory_to_warm_up_in_still_starts_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "not-there"))
    harness = Harness()
    try:
        harness.start(harness.spec("c0", ["/bin/sh", "-c", "exit 7"]))
        report = harness.report()
        while report.kind != "tree_ended":
            report = harness.report()
    finally:
        harness.close()
    assert report.exit_code == 7
    assert "shim template: no warm-up" in capfd.readouterr().err
