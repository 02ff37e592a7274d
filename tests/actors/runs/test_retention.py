"""Run retention and `prune` (issue 12 item 7, DESIGN §5): finished runs go, running ones stay.

Against an embedded node (real child processes, real SQLite): `runs.prune` removes a finished
run's records and its directory and never a run that is still going; the node's own
retention (`run_retention_days`) does the same by itself on a timer, which the test sees as the
`runs.pruned` fleet event (a long-poll, no sleeping); the CLI's `prune` against a real node.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subagents_node.actors.runs import retention, runschema
from subagents_node.client.client import Client
from subagents_node.messages.errors import BadRequest, RunNotFound
from subagents_node.messages.retention import Prune, PruneResult
from subagents_node.node.node import Node
from subagents_node.node.store import Store
from tests.support.manage import embedded
from tests.support.nodes import NodeProcess, run_cli
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, wait_until

#: one second of retention, in days
ONE_SECOND_DAYS = 1 / 86_400


def _finished_echo(client: Client, agents: Path, text: str) -> str:
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("echo", text, False, None))
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"
    return run.run_id


def _running_gate(client: Client, agents: Path, gate: Gate) -> str:
    run = client.runs.launch(launch_context(agents).single("gate", str(gate.path), True, None))
    gate.accept(1)
    return run.run_id


@pytest.fixture
def node(state_dir: Path) -> Iterator[Node]:
    """An embedded node with retention off (prune only when asked)."""
    with embedded(state_dir, settings={"run_retention_days": 0.0}) as started:
        yield started


def test_issue_12_prune_removes_finished_runs_and_never_a_running_one(
    node: Node, agents: Path, gate: Gate
) -> None:
    client = node.client()
    finished = _finished_echo(client, agents, "old")
    running = _running_gate(client, agents, gate)
    finished_dir = Path(client.runs.show(finished).run_dir)
    assert finished_dir.is_dir()

    dry = client.ask(Prune(older_than_s=0, dry_run=True), PruneResult)
    assert dry.pruned == [finished] and finished_dir.is_dir()
    assert client.runs.show(finished).state == "complete"  # a dry run removes nothing

    result = client.ask(Prune(older_than_s=0), PruneResult)
    assert result.pruned == [finished]
    with pytest.raises(RunNotFound):
        client.runs.show(finished)
    wait_until(lambda: not finished_dir.exists(), what="the pruned run's directory to go")
    assert client.runs.show(running).state == "running"
    assert Path(client.runs.show(running).run_dir).is_dir()

    gate.children[0].release(0)
    assert client.runs.wait(running, timeout=20).state == "complete"
    assert client.ask(Prune(older_than_s=0), PruneResult).pruned == [running]


def test_issue_12_prune_keeps_runs_younger_than_the_age(node: Node, agents: Path) -> None:
    client = node.client()
    finished = _finished_echo(client, agents, "young")
    assert client.ask(Prune(older_than_s=3600), PruneResult).pruned == []
    assert client.runs.show(finished).state == "complete"


def test_issue_12_prune_without_an_age_is_refused_when_retention_is_off(node: Node) -> None:
    with pytest.raises(BadRequest) as info:
        node.client().ask(Prune(), PruneResult)
    assert "retention is off" in info.value.message


def test_issue_12_node_applies_its_retention_by_itself_on_a_timer(
    state_dir: Path, agents: Path, gate: Gate
) -> None:
    with embedded(state_dir, settings={"run_retention_days": ONE_SECOND_DAYS}) as started:
        client = started.client()
        running = _running_gate(client, agents, gate)
        seq = client.runs.watch_all(after_seq=0, wait_s=0).last_seq
        finished = _finished_echo(client, agents, "expires")
        finished_dir = Path(client.runs.show(finished).run_dir)
        deadline = time.monotonic() + 20
        pruned: list[str] = []
        while finished not in pruned:  # long-polls: each returns at the next event
            assert time.monotonic() < deadline, "the node never pruned the finished run"
            batch = client.runs.watch_all(after_seq=seq, wait_s=5)
            seq = batch.last_seq
            for event in batch.events:
                if event.kind == "runs.pruned":
                    pruned += str(event.data["run_ids"]).split()
        with pytest.raises(RunNotFound):
            client.runs.show(finished)
        wait_until(lambda: not finished_dir.exists(), what="the expired run's directory to go")
        assert running not in pruned
        assert client.runs.show(running).state == "running"


@pytest.mark.parametrize("value", [0, "no", "false", 0.0])
def test_a_prune_request_reads_nothing_but_a_boolean_as_dry_run(value: object) -> None:
    """Lax, `dry_run: 0` (or "no") from a hand-made frame meant a real prune."""
    from subagents_node.messages.base import validate_request
    from subagents_node.messages.errors import BadRequest

    with pytest.raises(BadRequest, match="dry_run"):
        validate_request(Prune, {"older_than_s": 0, "dry_run": value})


def test_issue_12_cli_prune_against_a_node(node_process: NodeProcess) -> None:
    done = run_cli("prune", "--older-than", "0", "--json", state_dir=node_process.state_dir)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pruned"] == []
    # "6M" reads as six months: it must not prune every run older than six minutes.
    for bad in ("-1", "soon", "7", "1e9d", "999999999w", "6M", "12H"):
        refused = run_cli("prune", "--older-than", bad, state_dir=node_process.state_dir)
        assert refused.returncode == 2, (bad, refused.stderr)
        assert "Traceback" not in refused.stderr


def test_prune_counts_one_finished_run_in_the_singular(
    node_process: NodeProcess, agents: Path
) -> None:
    """It said "would prune 1 finished runs"."""
    client = node_process.client(timeout=20)
    run = client.runs.launch(launch_context(agents).single("echo", "x", True, None))
    assert client.runs.wait(run.run_id, timeout=30).state == "complete"

    done = run_cli("prune", "--older-than", "0", "--dry-run", state_dir=node_process.state_dir)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["would prune 1 finished run", f"  {run.run_id}"]


@pytest.fixture
def node_process(start_node: object) -> NodeProcess:
    assert callable(start_node)
    started = start_node()
    assert isinstance(started, NodeProcess)
    return started


def test_issue_12_a_retention_pass_prunes_a_bounded_batch_and_the_next_one_follows_at_once(
    tmp_path: Path,
) -> None:
    """One pass pruned up to 1,000 runs in one transaction and removed their directories on
    the supervisor's thread: seconds in which it answered nothing. A pass now prunes at most
    PASS_MAX runs, is re-armed at once while more are due (requests queued meanwhile are
    served between passes), and the directories go on a thread of their own."""
    store = Store(tmp_path / "runs.db")
    store.migrate({"supervisor": runschema.MIGRATIONS})
    db = store.connect()
    root = tmp_path / "runs"
    count = retention.PASS_MAX + 20
    for n in range(count):
        run_dir = root / f"{n:012x}"
        run_dir.mkdir(parents=True)
        db.execute(
            "INSERT INTO runs(run_id, session_id, mode, background, state, label, depth, "
            "root_run_id, run_dir, created_at, ended_at, runner_id, snapshots) "
            "VALUES (?, 's', 'single', 1, 'complete', 'x', 0, ?, ?, 1.0, 2.0, 'r', '{}')",
            (f"{n:012x}", f"{n:012x}", str(run_dir)),
        )
    armed: list[float] = []
    committed: list[Callable[[], None]] = []
    keeper = retention.RunRetention(
        lambda: root,
        retention_s=60.0,
        after=lambda delay, tick: armed.append(delay) or (lambda: None),
        after_commit=committed.append,
        clock=lambda: 1_000.0,
        announce=lambda ids: None,
    )
    keeper.due(db, lambda run_id: False)
    left = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    assert left == count - retention.PASS_MAX
    assert armed == [0.0]  # the next pass at once, behind whatever waits in the inbox
    for effect in committed:
        effect()  # the commit: the directories are handed to the remover
    keeper.close()
    assert len(list(root.iterdir())) == count - retention.PASS_MAX
    db.close()


def _aged(directory: Path, seconds: float) -> Path:
    directory.mkdir(parents=True)
    then = time.time() - seconds
    os.utime(directory, (then, then))
    return directory


def test_prune_removes_run_directories_without_a_record_once_past_the_grace(
    node: Node, agents: Path, gate: Gate
) -> None:
    """Out of descriptors, a refused launch's cleanup fails too: its empty `runs/<id>/` had no
    record and no prune ever removed it (189 after 300 launches at `ulimit -n 256`)."""
    client = node.client()
    running = _running_gate(client, agents, gate)
    running_dir = Path(client.runs.show(running).run_dir)
    root = running_dir.parent
    hour = 3600.0
    os.utime(running_dir, (time.time() - hour, time.time() - hour))
    orphan = _aged(root / "0123456789ab", hour)
    young = _aged(root / "ba9876543210", 0)  # may be a launch's not yet recorded: kept
    other = _aged(root / "not-a-run-id", hour)  # not a run's name: never ours to remove

    dry = client.ask(Prune(older_than_s=0, dry_run=True), PruneResult)
    assert dry.orphans == [orphan.name] and orphan.is_dir()
    result = client.ask(Prune(older_than_s=0), PruneResult)
    assert result.orphans == [orphan.name] and result.pruned == []
    wait_until(lambda: not orphan.exists(), what="the directory without a record to go")
    assert young.is_dir() and other.is_dir() and running_dir.is_dir()
    assert client.runs.show(running).state == "running"
    gate.children[0].release(0)
    assert client.runs.wait(running, timeout=20).state == "complete"


def test_a_directory_of_a_launch_under_admission_is_never_swept(tmp_path: Path) -> None:
    """A launch makes its directory before it writes its row (the row is written later in the
    same admission, after the session owner answers): the sweep skips a run id being admitted
    whatever the directory's age."""
    store = Store(tmp_path / "runs.db")
    store.migrate({"supervisor": runschema.MIGRATIONS})
    db = store.connect()
    root = tmp_path / "runs"
    admitting = _aged(root / "aaaaaaaaaaaa", 3600.0)
    orphan = _aged(root / "bbbbbbbbbbbb", 3600.0)
    keeper = retention.RunRetention(
        lambda: root,
        retention_s=0.0,
        after=lambda delay, tick: lambda: None,
        after_commit=lambda effect: effect(),
        clock=time.time,
        announce=lambda ids: None,
        admitting=lambda run_id: run_id == admitting.name,
    )
    assert keeper.orphans(db, cutoff=time.time()) == [orphan]
    db.close()


def test_the_timers_passes_list_the_run_directories_at_most_once_an_hour(tmp_path: Path) -> None:
    """An orphan sweep lists every run directory (one per run kept: tens of thousands), and a
    busy node's retention passes come every minute or sooner: each pass swept, holding the
    supervisor for the whole listing. The timer's passes now sweep once an hour (the first
    pass after a start sweeps); the orphan still goes, at the next sweep."""
    hour = 3600.0
    store = Store(tmp_path / "runs.db")
    store.migrate({"supervisor": runschema.MIGRATIONS})
    db = store.connect()
    root = tmp_path / "runs"
    root.mkdir()
    listings: list[float] = []
    now = [time.time()]

    def runs_root() -> Path:
        listings.append(now[0])
        return root

    keeper = retention.RunRetention(
        runs_root,
        retention_s=60.0,
        after=lambda delay, tick: lambda: None,
        after_commit=lambda effect: effect(),
        clock=lambda: now[0],
        announce=lambda ids: None,
    )
    keeper.due(db, lambda run_id: False)
    assert len(listings) == 1  # the first pass sweeps
    orphan = _aged(root / "0123456789ab", 2 * hour)
    passes = 0
    while now[0] + retention.RECHECK_S < listings[0] + hour:
        now[0] += retention.RECHECK_S
        keeper.due(db, lambda run_id: False)
        passes += 1
    assert passes > 50 and len(listings) == 1 and orphan.is_dir()
    now[0] = listings[0] + hour
    keeper.due(db, lambda run_id: False)
    keeper.close()  # the removals queued so far are done
    assert sorted(set(listings)) == [listings[0], now[0]] and not orphan.exists()
    db.close()


def test_a_run_directory_that_cannot_be_removed_is_logged_not_dropped_in_silence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`prune` answers once the records are gone and removes the directories on its own
    thread; one it could not remove (an immutable file, a busy mount) stayed, and nothing said
    so anywhere (`rmtree(..., ignore_errors=True)`)."""
    import subprocess
    import threading

    run_dir = tmp_path / "0123456789ab"
    (run_dir / "keep").mkdir(parents=True)
    (run_dir / "keep" / "file").write_text("x")
    locked = subprocess.run(["chattr", "+i", str(run_dir / "keep")], capture_output=True)
    if locked.returncode != 0:
        pytest.skip(f"cannot make a directory immutable here: {locked.stderr.strip()!r}")
    remover = retention.DirectoryRemover()
    try:
        with caplog.at_level("WARNING", logger=retention.__name__):
            remover.remove([run_dir])
            remover.close(10.0)
            assert not any(t.name == "run-dir-remover" for t in threading.enumerate())
    finally:
        subprocess.run(["chattr", "-i", str(run_dir / "keep")], check=True)
    assert run_dir.exists()
    [record] = [r for r in caplog.records if r.name == retention.__name__]
    assert record.getMessage().startswith(f"cannot remove run directory {run_dir} (")
    assert "a later prune removes it once it can" in record.getMessage()
