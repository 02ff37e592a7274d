"""A run whose children ended while its node was down ends when they ended, not when the next
node settled it: its `ended_at` (the DURATION `runs` and `show` print) leaves the downtime out
(R-RUN-5: the end is the child's own, from the exit record its shim wrote).

Real node processes (`start --detach`), a real shim and child; every wait has a deadline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from tests.actors.runs.test_runs_hostile_child import _release
from tests.actors.runs.test_runs_shims import wait_gone
from tests.support.nodes import NodeProcess
from tests.support.runs import launch_context, wait_until, write_agent


def test_a_run_that_ended_while_its_node_was_down_ends_when_its_child_did(
    start_node: Callable[..., NodeProcess], state_dir: Path, tmp_path: Path
) -> None:
    """The child ended (exit 0, its exit record written) while no node ran; the next node
    settled the run from that record, and the run's `ended_at` was the time it did so: `runs`
    and `show` printed a DURATION that included the downtime (16 s for a 4 s child). The run
    now ends at its latest child's own end, as that child's row does."""
    agents = tmp_path / "agents"
    write_agent(agents, "sh", "Runs its task with sh.", '["sh", "-c", "{task}"]')
    fifo = tmp_path / "go.fifo"
    os.mkfifo(fifo)
    first = start_node(state_dir=state_dir)
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    run = first.client(timeout=20.0).runs.launch(
        ctx.single("sh", f"read x < {fifo}; exit 0", True, None)
    )
    pid = run.children[0].pid
    assert pid is not None
    first.stop()  # the child lives on, for the next node to adopt
    _release(fifo)
    wait_gone(pid)
    record = Path(run.run_dir) / "child-0" / "exit.json"
    wait_until(record.exists, what="the shim's exit record")
    gone_at = time.time()  # the child ended, and its shim recorded it, before this

    client = start_node(state_dir=state_dir).client(timeout=20.0)
    done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "complete", done
    child = done.children[0]
    assert child.ended_at is not None and child.ended_at <= gone_at, (child.ended_at, gone_at)
    assert done.ended_at is not None and done.ended_at <= gone_at, (done.ended_at, gone_at)
    assert done.started_at is not None and done.ended_at >= done.started_at
