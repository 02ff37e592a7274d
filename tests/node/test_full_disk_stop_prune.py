"""`stop` and `prune` on a full disk (issue 12: "A full disk is a typed StoreFull for writes";
DESIGN §5). The state dir is a tmpfs the test mounts (root only; skipped otherwise, as in
test_full_disk.py, whose fixture and helpers these reuse) and fills with one file.

- A `stop` the full disk refuses (`store_full`: "changed nothing") must have signalled nobody:
  it used to TERM the run's children first, and the run ended `stopped` later anyway.
- `prune`, the one command that frees space, must free it on a full disk: it used to delete
  the rows first (a write the full disk refuses) and remove the directories only after that.
"""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from subagents_node.messages.errors import StoreFull
from tests.node.test_full_disk import _fill, _mount, assert_no_restarts, tiny_disk
from tests.support.nodes import running_node
from tests.support.runs import Gate, launch_context, script_agents

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs state dir needs root"),
]

__all__ = ["tiny_disk"]  # the fixture, used by name

#: How long a TERMed gate child takes to go, at the most (it ends in milliseconds).
SIGNAL_S = 3.0


def _still_alive_after(pid: int, timeout: float) -> bool:
    """Whether the process outlives `timeout` (its pidfd turns readable when it exits)."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return not ready
    finally:
        os.close(fd)


def test_a_stop_the_full_disk_refuses_signals_no_child_and_a_stop_after_space_returns_stops(
    tiny_disk: Path, tmp_path: Path
) -> None:
    agents = script_agents(tmp_path / "agents")
    gate = Gate(tmp_path)
    _mount(tiny_disk, "16m", remount=True)  # room for the launch; the filler takes the rest
    try:
        with running_node("--faults", state_dir=tiny_disk) as node:
            client = node.client()
            ctx = launch_context(agents, max_active_async_runs_per_session=2)
            run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
            [child] = gate.accept(1)
            filler = _fill(tiny_disk)

            with pytest.raises(StoreFull) as refused:
                client.runs.stop(run.run_id)
            assert refused.value.details["actor"] == "supervisor"
            # "Changed nothing": the child was not signalled, the run is not stopping.
            assert _still_alive_after(child.pid, SIGNAL_S), "a refused stop killed the child"
            assert client.runs.show(run.run_id).state == "running"

            filler.unlink()
            client.runs.stop(run.run_id)
            child.wait_exit()
            assert client.runs.wait(run.run_id, timeout=30).state == "stopped"
            assert client.capacity.snapshot(ctx.session_id, 2).used == 0
            assert_no_restarts(node)
    finally:
        gate.close()
