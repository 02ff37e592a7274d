"""The shim template's pipes (actors/child/template.py, shims.py) are the supervisor's alone.

The template's stdin carries every child's order (its task, its environment) and its stdout
is the announce pipe, which says which shims the supervisor must watch. A child (the agent,
as the node's user) could open both through /proc/<template>/fd: read its siblings' orders,
write orders of its own, forge announcements. The template is not dumpable now, so those
entries are closed to a process without CAP_SYS_PTRACE, even of the same user; and a forged
announcement that names a live process other than one of the template's shims is ignored.

Real processes: the template runs in a process of its own that has dropped CAP_SYS_PTRACE
from its bounding set (`setpriv`), as the child that probes it has: the same user, the same
capabilities, the case of a node and its agents run as one unprivileged user.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SETPRIV = shutil.which("setpriv")

SCRIPT = textwrap.dedent(
    """
    import os, select, sys
    from subagents_node.actors.child.shimtemplate import ShimTemplate

    started = []
    template = ShimTemplate(on_start=lambda fd, pid: started.append((fd, pid)))
    # An order its shim cannot read (no record_dir): the shim dies at once, and the line the
    # template writes for it says the template serves (it set itself up before it reads).
    template.order_raw({"child_id": "c1", "node_address": "ipc:///nonexistent"})
    fd, pid = started[0]
    assert select.select([fd], [], [], 30)[0], "no announcement in time"
    print("announced:", os.read(fd, 4096).decode().strip())
    for name, flags in (("stdin", os.O_RDONLY | os.O_NONBLOCK), ("stdout", os.O_WRONLY)):
        number = 0 if name == "stdin" else 1
        try:
            os.close(os.open(f"/proc/{pid}/fd/{number}", flags))
            print(f"{name}: opened")
        except PermissionError:
            print(f"{name}: refused")
    template.close()
    """
)


@pytest.mark.skipif(SETPRIV is None, reason="needs setpriv (util-linux)")
def test_a_child_cannot_reach_the_shim_templates_pipes_through_proc() -> None:
    """A child of the node's user opened /proc/<template>/fd/0 and /fd/1: it could read its
    siblings' orders and forge the announcements that say which shims exist."""
    assert SETPRIV is not None
    done = subprocess.run(
        [SETPRIV, "--bounding-set=-sys_ptrace", sys.executable, "-c", SCRIPT],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "Operation not permitted" in done.stderr and "setpriv" in done.stderr:
        pytest.skip("setpriv cannot drop CAP_SYS_PTRACE here")
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'announced: ["c1",' in done.stdout, done.stdout + done.stderr
    assert "stdin: refused" in done.stdout, done.stdout + done.stderr
    assert "stdout: refused" in done.stdout, done.stdout + done.stderr
