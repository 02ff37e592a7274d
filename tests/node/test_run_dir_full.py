"""R-ADM-2 on a full disk: a launch whose run directory or files cannot be written for lack of
space (or quota) answers the typed `store_full` every store answers, not `run_storage_failed`,
so a client that retries on `store_full` retries it; its capacity slot is rolled back.

The state dir's `runs/` is a tmpfs the test mounts (root only; skipped otherwise): with one
inode (its root) no run directory can be made; with one page a run's files cannot be written.
The owners' databases live outside it and keep writing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.messages.errors import StoreFull
from tests.support import tmpfs
from tests.support.nodes import new_state_dir, running_node
from tests.support.runs import launch_context, script_agents

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]


@pytest.fixture(params=["nr_inodes=1", "size=64k"], ids=["no-inode-for-the-dir", "no-space"])
def full_runs_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    state_dir = new_state_dir()
    runs = state_dir / "runs"
    runs.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        with tmpfs.mounted(runs, f"{request.param},mode=0700"):
            if request.param.startswith("size"):
                tmpfs.fill(runs / "filler")  # a run dir can be made; no file in it can be written
            yield state_dir
    finally:
        subprocess.run(["rm", "-rf", str(state_dir)], check=False)


def test_r_adm_2_a_launch_with_no_room_for_its_run_dir_answers_store_full(
    full_runs_dir: Path, tmp_path: Path
) -> None:
    """With no room for a file in the run's directory (`no-space`), the first file written is
    the one that persists the run's fan-out descriptor: the launch fails (R-FAN-6)."""
    agents = script_agents(tmp_path / "agents")
    with running_node(state_dir=full_runs_dir) as node:
        client = node.client()
        ctx = launch_context(agents, max_active_async_runs_per_session=2)
        with pytest.raises(StoreFull) as refused:
            client.runs.launch(ctx.single("echo", "no room", True, None))
        assert refused.value.code == "store_full"
        assert refused.value.details["actor"] == "supervisor"
        assert client.capacity.snapshot(ctx.session_id, 2).used == 0  # rolled back
        assert client.runs.list() == []
