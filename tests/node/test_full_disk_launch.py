"""A launch, and a watch, on a full disk are answered with what happened (issue 12: "A full
disk is a typed StoreFull for writes ... changed nothing"; DESIGN §5). The state dir is a tmpfs
the test mounts (root only; skipped otherwise, as in test_full_disk.py); for the launch,
`runs/` is on a tmpfs of its own (test_full_disk_stop_prune.py's fixture), so the child's shim
can write its records while the store's disk is full.

A launch is answered once its first children run; their shims are forked only after the group
holding the run's record has committed. When the disk filled after that commit, the group that
took the shim's report failed, and every answer delivered with it, the launch's included,
turned into `store_full` ("refused this write and changed nothing"): the run was recorded, its
child ran to its end, and a caller that retried on `store_full`, as the docs advise, launched
the same work twice (about one launch in ten on a nearly full disk did so).

A watcher (`runs.watch`, what `run` and `wait` follow a run with) answered in a group the full
disk undid got the same `store_full`: `run` exited 1 saying nothing changed while its run went
on, unfollowed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil
import pytest

from subagents_node.messages.errors import StoreFull
from subagents_node.messages.supervisor import ListRuns, RunEvents, RunView, Watch
from tests.node.test_full_disk import (
    _fill,
    _quiet_agents,
    _release_on_a_full_disk,
    assert_no_restarts,
    gated_node,
    tiny_disk,
)
from tests.node.test_full_disk_stop_prune import runs_on_their_own_disk
from tests.support.nodes import running_node
from tests.support.runs import Gate, launch_context, stopped, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs state dir needs root"),
]

__all__ = ["runs_on_their_own_disk", "tiny_disk"]  # the fixtures, used by name

WAIT_S = 30.0


def _template_of(supervisor: int) -> int:
    """The shim template: the run supervisor's child every shim is forked from."""
    [template] = [
        p.pid
        for p in psutil.Process(supervisor).children()
        if "subagents_node.actors.child.template" in " ".join(p.cmdline())
    ]
    return template


def test_a_launch_recorded_before_the_disk_filled_is_answered_with_its_run_not_store_full(
    runs_on_their_own_disk: Path, tmp_path: Path
) -> None:
    state_dir = runs_on_their_own_disk
    gate = Gate(tmp_path)
    try:
        with running_node("--faults", state_dir=state_dir) as node:
            client = node.client(timeout=WAIT_S)
            ctx = launch_context(_quiet_agents(tmp_path))
            supervisor = next(a.pid for a in node.status().actors if a.name == "supervisor")
            assert supervisor is not None
            # A first run starts the template (on first use).
            first = client.runs.launch(ctx.single("quiet", str(gate.path), False, None))
            gate.accept(1)[0].release(0)
            assert client.runs.wait(first.run_id, timeout=WAIT_S).state == "complete"
            answers: list[RunView | StoreFull] = []

            def launch() -> None:
                try:
                    answers.append(
                        client.runs.launch(ctx.single("quiet", str(gate.path), False, None))
                    )
                except StoreFull as full:
                    answers.append(full)

            launching = threading.Thread(target=launch)
            # No shim is forked while the template is stopped: the run's record commits, and
            # its answer waits for the child's start, which comes once the disk is full.
            with stopped(_template_of(supervisor)):
                launching.start()
                [run] = wait_until(
                    lambda: [r for r in client.runs.list() if r.run_id != first.run_id],
                    what="the run's record committed",
                )
                filler = _fill(state_dir)
            [child] = gate.accept(1)
            launching.join(WAIT_S)
            assert not launching.is_alive(), "the launch was never answered"
            [answer] = answers
            assert isinstance(answer, RunView), f"a recorded, running run answered {answer!r}"
            assert answer.run_id == run.run_id
            filler.unlink()
            child.release(0)
            done = client.runs.wait(run.run_id, timeout=WAIT_S)
            assert done.state == "complete", done.error
            assert {r.run_id for r in client.runs.list()} == {first.run_id, run.run_id}
            assert_no_restarts(node)
    finally:
        gate.close()


def test_a_watcher_answered_in_a_group_the_full_disk_undid_is_answered_from_the_store(
    tiny_disk: Path, tmp_path: Path
) -> None:
    with gated_node(tiny_disk, tmp_path, _quiet_agents(tmp_path)) as (node, client, ctx, gate):
        run = client.runs.launch(ctx.single("quiet", str(gate.path), True, None))
        [child] = gate.accept(1)
        seen = client.runs.watch(run.run_id, 0, wait_s=0)
        transport = node.transport()
        watching = transport.submit(Watch(run_id=run.run_id, after_seq=seen.last_seq, wait_s=30))
        # On the same connection, after the watch: once answered, the watcher waits.
        transport.call(ListRuns(), timeout=WAIT_S)
        _release_on_a_full_disk(node, tiny_disk, lambda: child.release(0))
        answer = watching.result(WAIT_S)
        assert isinstance(answer, RunEvents), f"a watch answered {answer!r}"
        done = client.runs.wait(run.run_id, timeout=WAIT_S)  # and following it goes on
        assert done.state == "complete", done.error
        assert_no_restarts(node)
