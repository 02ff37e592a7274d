"""A launch the run supervisor has no file descriptor left for is refused `busy` and leaves no
directory behind (docs/operations.md, "Start, stop, check": "Should descriptors run out anyway,
a request that needs a new one is refused `busy`").

The supervisor holds a descriptor per live child's shim; under a low hard limit a launch that
met EMFILE writing its run's files was refused `run_storage_failed` ("Failed to create run
storage: [Errno 24] Too many open files: '.../.recovery.json...tmp'"), which reads as a broken
state dir, not as load to retry; and its empty run directory stayed behind (`rmtree` opens a
directory to walk it), one orphan per refused launch until a prune 10 minutes later.

The soft limit is lowered on the running supervisor alone (prlimit(2), root only), to what it holds
plus a few: a handful of gate children fill it.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import Busy, SubagentsError
from subagents_node.messages.supervisor import RunView
from tests.support.nodes import running_node
from tests.support.runs import Gate, launch_context, script_agents

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(os.geteuid() != 0, reason="lowering another process's limit needs root"),
]

#: Descriptors left to the supervisor past what it holds: a few launches fit, then none.
ROOM = 12
#: More launches than ROOM could ever hold.
TRIES = 3 * ROOM


def _launch_until_refused(
    client: Client, ctx: LaunchContext, gate: Gate
) -> tuple[list[RunView], SubagentsError]:
    runs: list[RunView] = []
    for _ in range(TRIES):
        try:
            runs.append(client.runs.launch(ctx.single("gate", str(gate.path), True, None)))
        except SubagentsError as err:
            return runs, err
    raise AssertionError(f"{TRIES} launches with {ROOM} descriptors to spare: none refused")


def test_a_launch_with_no_descriptor_left_is_refused_busy_and_leaves_no_directory(
    tmp_path: Path,
) -> None:
    gate = Gate(tmp_path)
    try:
        with running_node() as node:
            client = node.client(timeout=30)
            ctx = launch_context(
                script_agents(tmp_path / "agents"), max_active_async_runs_per_session=TRIES
            )
            supervisor = next(a.pid for a in node.status().actors if a.name == "supervisor")
            assert supervisor is not None
            # The shim template (its pipes) first, with room to start: the first launch starts
            # it. What is left to the supervisor then is what each live child's shim takes.
            first = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
            held = len(os.listdir(f"/proc/{supervisor}/fd"))
            before = resource.prlimit(supervisor, resource.RLIMIT_NOFILE)
            # The soft limit only: raising a hard one back needs CAP_SYS_RESOURCE.
            resource.prlimit(supervisor, resource.RLIMIT_NOFILE, (held + ROOM, before[1]))
            try:
                runs, refusal = _launch_until_refused(client, ctx, gate)
                runs.insert(0, first)
            finally:
                resource.prlimit(supervisor, resource.RLIMIT_NOFILE, before)
            assert isinstance(refusal, Busy), f"refused {refusal.code}: {refusal.message}"
            assert "file descriptor" in refusal.message
            directories = {p.name for p in Path(node.state_dir, "runs").iterdir()}
            assert directories == {r.run_id for r in runs}  # no orphan left by the refusal
            # Room again: the next launch runs.
            again = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
            for child in gate.accept(len(runs) + 1):
                child.release(0)
            for run in (*runs, again):
                assert client.runs.wait(run.run_id, timeout=30).state == "complete"
    finally:
        gate.close()
