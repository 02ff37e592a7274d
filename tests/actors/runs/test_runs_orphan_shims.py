"""A shim whose template is gone (the node restarted, or a child killed the template) has no
parent to continue it when a child stops it later: the run supervisor watches such a shim's
tree and continues the shim once the tree is gone and the shim has not reported (DESIGN §1,
SPEC §0.4 "Proof from the parent", R-RUN-5, R-CAP-21).

Real node processes (`start --detach`), real shims, template and children; every wait has a
deadline (a pidfd, a fifo, a long-poll, the client's timeout).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from tests.actors.runs.test_runs_cgroup import needs_cgroups
from tests.actors.runs.test_runs_hostile_child import _release
from tests.actors.runs.test_runs_shims import wait_gone
from tests.support.nodes import NodeProcess, new_state_dir
from tests.support.runs import launch_context, wait_until, write_agent

#: The child waits on the fifo, stops its shim (its parent) and exits 0: a zombie under a
#: stopped shim, which nothing but a parent (gone here) is told of.
_STOP_AND_EXIT = "read x < {fifo}; kill -STOP $PPID; exit 0"
#: The same, once it has killed its template (its parent's parent: field 4 of the shim's
#: stat; a SIGKILL ends the template's stop-watching thread with it).
_KILL_TEMPLATE_FIRST = "read -r _ _ _ T _ < /proc/$PPID/stat; kill -KILL $T; " + _STOP_AND_EXIT
#: The same, once it has stopped its template: a stopped template continues nobody either.
_STOP_TEMPLATE_FIRST = "read -r _ _ _ T _ < /proc/$PPID/stat; kill -STOP $T; " + _STOP_AND_EXIT
#: A process the child left behind (a `setsid` daemon, which the shim waits for) stops the
#: shim, its parent once the child exited, and exits. (TERM ignored: the TERM the shim sends
#: the child's group as the child exits may come before the `setsid`.)
_LEFT_BEHIND = (
    "trap '' TERM; setsid sh -c"
    " 'read x < {fifo}; read -r _ _ _ P _ < /proc/$$/stat; kill -STOP $P; exit 0' & exit 0"
)


@pytest.fixture
def agents() -> Iterator[Path]:
    directory = new_state_dir()
    agents = directory / "agents"
    write_agent(agents, "sh", "Runs its task with sh.", '["sh", "-c", "{task}"]')
    yield agents
    with suppress(OSError):
        for path in sorted(directory.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        directory.rmdir()


@pytest.mark.parametrize("containment", [pytest.param("cgroup", marks=needs_cgroups), "subreaper"])
@pytest.mark.parametrize(
    ("script", "restart"),
    [
        pytest.param(_STOP_AND_EXIT, True, id="node-restarted"),
        pytest.param(_LEFT_BEHIND, True, id="node-restarted-a-process-it-left"),
        pytest.param(_KILL_TEMPLATE_FIRST, False, id="template-killed"),
        pytest.param(_STOP_TEMPLATE_FIRST, False, id="template-stopped"),
    ],
)
def test_a_shim_stopped_after_its_template_went_is_continued_when_its_child_exits(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    script: str,
    restart: bool,
    containment: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once its template was gone (the node restarted, or the child killed or stopped it), a
    shim that its child SIGSTOPped later was seen by nobody: the child exited 0, a zombie
    under the stopped shim, no exit record, no report, and the run stayed `running`, its slot
    held, until a `stop`, a deadline or the next restart (or, for a stopped template, the
    next launch on the node, which replaced it). A stopped template is ended at once now,
    and the run supervisor watches the tree of a shim that has no template parent; once the
    tree is gone and the shim has not reported, a stopped shim is continued: it reaps the
    child and reports its real end (complete, exit 0, proof observed), and the slot is
    freed."""
    monkeypatch.setenv("SUBAGENTS_CONTAINMENT", containment)
    first = start_node(state_dir=state_dir)
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    fifo = agents.parent / "go.fifo"
    os.mkfifo(fifo)
    task = script.format(fifo=fifo)
    run = first.client(timeout=20.0).runs.launch(ctx.single("sh", task, True, None))
    pid = run.children[0].pid  # the launch is answered once the shim reported the child
    assert pid is not None
    claim = json.loads((Path(run.run_dir) / "child-0" / "shim.json").read_text())
    shim = psutil.Process(int(claim["shim_pid"]))
    try:
        if restart:
            first.stop()  # its template exits with the node; the shim and child live on
            client = start_node(state_dir=state_dir).client(timeout=20.0)
            wait_until(lambda: client.runs.show(run.run_id).children[0].pid == pid, what="adopted")
        else:
            client = first.client(timeout=20.0)
            wait_until(lambda: _unserved(shim), what="its template killed or stopped")
        _release(fifo)
        wait_gone(pid)  # a zombie under its stopped shim, unless it was continued already
        done = client.runs.wait(run.run_id, timeout=15)
        assert done.state == "complete", done
        assert done.children[0].exit_code == 0, done.children[0]
        assert done.children[0].proof_state == "observed", done.children[0]
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(psutil.Error):
            shim.kill()


def _unserved(shim: psutil.Process) -> bool:
    """The shim's parent is no longer a running shim template (the child killed or stopped
    it; a stopped one is ended at once)."""
    try:
        parent = shim.parent()
        if parent is None or "subagents_node.actors.child.template" not in parent.cmdline():
            return True
        return parent.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return True
