"""A node that adopts a run binds it to its own process when the run is its foreground
command's, with the rebind message to each live shim (actors/runs/rebinding.py,
actors/child/rebind.py); a shim too old to take the message is not sent it, and the node says so.

This test process plays the foreground command: it launches a gate run in the foreground
(`foreground_pid` its own pid) on a detached node, which binds nothing; the node is killed with
-9 and this process embeds the next node on the state dir (`children_end_with_node` then
`foreground`, this process), which adopts the run. Killing this process is not an option here;
what the binding does on a kill -9 is tests/cli/test_cli_foreground_kill9.py's. Real node
processes, real shims and children; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.actors.child import rebind
from subagents_node.actors.runs.rebinding import BOUND
from subagents_node.node.node import Node
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, wait_until
from tests.support.sleepers import watched_by

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("shim_version", [rebind.SHIM_VERSION, None], ids=["current", "older"])
def test_a_run_adopted_by_a_node_embedded_in_its_foreground_command_is_bound_to_that_command(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
    shim_version: int | None,
) -> None:
    """`current`: the shim is told, and watches this process from then on. `older`: its claim
    names no `shim_version` (a shim forked before the message existed): it is not sent the
    message, keeps outliving this process, and the run's `bound` event counts it."""
    first = start_node(state_dir=state_dir)
    ctx = launch_context(agents)
    launch = ctx.single("gate", str(gate.path), False, None)
    own = launch.model_copy(update={"foreground_pid": os.getpid()})
    run = first.client().runs.launch(own)
    [held] = gate.accept(1)
    claim_path = Path(run.run_dir) / "child-0" / "shim.json"
    claim = json.loads(claim_path.read_text())
    assert claim["shim_version"] == rebind.SHIM_VERSION
    shim = int(claim["shim_pid"])
    assert watched_by(shim) == set()  # a detached node binds nothing
    if shim_version is None:
        del claim["shim_version"]
        claim_path.write_text(json.dumps(claim))

    first.kill()
    with Node.embedded(state_dir=state_dir) as node:  # in this process: its own command's node
        client = node.client()
        events = client.runs.watch(run.run_id, 0, 0).events
        [bound] = [event.data for event in events if event.kind == BOUND]
        if shim_version is None:
            assert bound == {"pid": os.getpid(), "shims": 0, "older": 1}
            assert watched_by(shim) == set()
        else:
            assert bound == {"pid": os.getpid(), "shims": 1, "older": 0}
            wait_until(lambda: watched_by(shim) == {os.getpid()}, what="the shim rebound")
        held.release(0)
        done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "complete", done


def test_a_background_run_adopted_by_an_embedded_node_stays_unbound(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    """Nobody follows a background run: the node embedded in this process adopts it as it is
    (no message, no `bound` event), so its child outlives this process too."""
    first = start_node(state_dir=state_dir)
    ctx = launch_context(agents)
    run = first.client().runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    shim = int(json.loads((Path(run.run_dir) / "child-0" / "shim.json").read_text())["shim_pid"])

    first.kill()
    with Node.embedded(state_dir=state_dir) as node:
        client = node.client()
        kinds = [event.kind for event in client.runs.watch(run.run_id, 0, 0).events]
        assert "run.recovered" in kinds and BOUND not in kinds
        assert not (Path(run.run_dir) / "child-0" / rebind.BIND_RECORD).exists()
        assert watched_by(shim) == set()
        held.release(0)
        done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "complete", done
