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
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.messages.errors import StoreFull
from tests.node.test_full_disk import _fill, assert_no_restarts, gated_node, tiny_disk
from tests.support import tmpfs
from tests.support.nodes import NodeProcess, run_cli, running_node
from tests.support.runs import launch_context, script_agents, wait_until

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
    with gated_node(tiny_disk, tmp_path, script_agents(tmp_path / "agents")) as (
        node,
        client,
        ctx,
        gate,
    ):
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


def _finished_runs(node: NodeProcess, agents: Path, count: int) -> tuple[list[str], list[Path]]:
    client = node.client()
    ctx = launch_context(agents)
    ids = [
        client.runs.launch(ctx.single("echo", f"old {i}", False, None)).run_id for i in range(count)
    ]
    for run_id in ids:
        assert client.runs.wait(run_id, timeout=20).state == "complete"
    dirs = [Path(client.runs.show(run_id).run_dir) for run_id in ids]
    assert all(d.is_dir() for d in dirs)
    return ids, dirs


def _prune(state_dir: Path) -> str:
    done = run_cli("prune", "--older-than", "0", state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def test_prune_on_a_full_disk_frees_the_space_it_needs_to_delete_the_records(
    tiny_disk: Path, tmp_path: Path
) -> None:
    """Runs and store on one full disk: prune (once, or twice if the store's commit came
    before the directories were gone) removes both, with the disk still filled otherwise."""
    agents = script_agents(tmp_path / "agents")
    tmpfs.remount(tiny_disk, "size=16m")  # room for the runs; the filler takes the rest
    with running_node(state_dir=tiny_disk) as node:
        ids, dirs = _finished_runs(node, agents, 3)
        _fill(tiny_disk)
        first = _prune(tiny_disk).splitlines()[0]
        assert first.startswith(("pruned 3 finished runs", "the disk is full")), first
        wait_until(lambda: not any(d.exists() for d in dirs), what="the run directories removed")
        if not first.startswith("pruned 3"):
            assert _prune(tiny_disk).startswith("pruned 3 finished runs")
        assert not {r.run_id for r in node.client().runs.list()} & set(ids)
        assert_no_restarts(node)


@pytest.fixture
def runs_on_their_own_disk(tiny_disk: Path) -> Iterator[Path]:
    """The state dir's `runs/` on a tmpfs of its own: removing run directories frees nothing
    on the (full) disk of the store."""
    tmpfs.remount(tiny_disk, "size=16m")
    runs = tiny_disk / "runs"
    runs.mkdir(mode=0o700)
    with tmpfs.mounted(runs, "size=16m,mode=0700"):
        yield tiny_disk


def test_prune_on_a_full_disk_says_it_removed_the_directories_and_kept_the_records_for_later(
    runs_on_their_own_disk: Path, tmp_path: Path
) -> None:
    state_dir = runs_on_their_own_disk
    agents = script_agents(tmp_path / "agents")
    with running_node(state_dir=state_dir) as node:
        client = node.client()
        ids, dirs = _finished_runs(node, agents, 3)
        filler = _fill(state_dir)

        answer = _prune(state_dir)
        first = answer.splitlines()[0]
        assert first.startswith("the disk is full: removed the directories of 3 finished runs")
        assert "records stay" in first, answer
        wait_until(lambda: not any(d.exists() for d in dirs), what="the run directories removed")

        # A run whose directory is gone still shows and lists; `logs` answers in one line.
        assert {r.run_id for r in client.runs.list()} >= set(ids)
        for command in (["show", ids[0]], ["runs"]):
            shown = run_cli(*command, state_dir=state_dir)
            assert shown.returncode == 0 and ids[0] in shown.stdout, (command, shown.stderr)
        logs = run_cli("logs", ids[0], state_dir=state_dir)
        assert logs.returncode != 0 and "Traceback" not in logs.stderr, logs.stderr
        assert logs.stderr.strip().splitlines() == [
            f"error: run {ids[0]} has no logs any more: its directory was pruned"
        ]

        # Retryable: with space back, the next prune deletes the records.
        filler.unlink()
        assert _prune(state_dir).startswith("pruned 3 finished runs")
        assert not {r.run_id for r in client.runs.list()} & set(ids)
        assert_no_restarts(node)
