"""A full disk under the state dir (issue 12, item 5 "A full disk stops the node for good";
DESIGN §5: "A full disk is a typed StoreFull for writes; reads keep answering; the owner
recovers by itself when space returns").

The state dir is a 2 MiB tmpfs the test mounts (root only; skipped otherwise) and fills with
fan-out claims, each batch a real claim through a real node. Writes then answer `StoreFull`
(not `internal`), reads keep answering, no owner restarts, and once the tmpfs is remounted
larger the same node serves writes again; every acknowledged claim survives a node restart.
`start` on a full disk fails at once with one line and leaves nothing running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from subagents_node.client.client import Client
from subagents_node.client.paths import read_pid_file
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.constants import MAX_INT32
from subagents_node.messages.errors import StoreFull
from subagents_node.messages.fanout import FanoutDescriptor
from tests.support import tmpfs
from tests.support.nodes import NodeProcess, run_cli, running_node
from tests.support.runs import Gate, launch_context, stopped

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs state dir needs root"),
]

#: One claim batch: 100 paths of 500 characters, about 60 KB of rows.
BATCH = 100
PATH_CHARS = 500
#: A 2 MiB disk holds a few dozen batches; far more than that means the disk never filled.
MAX_BATCHES = 200


@pytest.fixture
def tiny_disk() -> Iterator[Path]:
    """A 2 MiB tmpfs as a state dir (short path: ipc sockets need < 107 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="sa-full-", dir="/tmp"))
    try:
        with tmpfs.mounted(directory, "size=2m,mode=0700"):
            yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def fill_with_claims(client: Client, descriptor: FanoutDescriptor) -> tuple[int, StoreFull]:
    """Claim batches until the disk is full; the count of acknowledged claims and the error."""
    acknowledged = 0
    for batch in range(MAX_BATCHES):
        paths = [f"b{batch}-{i}-".ljust(PATH_CHARS, "x") for i in range(BATCH)]
        try:
            snapshot = client.fanout.claim(descriptor, paths)
        except StoreFull as full:
            return acknowledged, full
        acknowledged += BATCH
        assert snapshot.used == acknowledged
    raise AssertionError(f"{MAX_BATCHES} batches fitted on a 2 MiB disk: it never filled")


def fill_the_rest(directory: Path) -> None:
    """Whatever space is left, taken by one file, so the next block anyone needs fails."""
    tmpfs.fill(directory / "filler")


def assert_no_restarts(node: NodeProcess) -> None:
    restarts = {a.name: a.restarts for a in node.status().actors}
    assert set(restarts.values()) == {0}, f"an owner restarted on a full disk: {restarts}"


def test_issue12_full_disk_writes_answer_store_full_reads_answer_and_writes_resume(
    tiny_disk: Path,
) -> None:
    """INV-FAN-4: a claim whose commit fails (the disk is full) raises StoreFull to its caller
    and leaves `used` where the acknowledged claims put it, before and after a restart."""
    with running_node("--faults", state_dir=tiny_disk) as node:
        client = node.client()
        descriptor = client.fanout.create("full-disk", MAX_INT32)
        acknowledged, full = fill_with_claims(client, descriptor)
        assert acknowledged > 0, "the first batch already failed: the disk was too small"
        assert full.code == "store_full" and "full" in full.message
        assert full.details["actor"] == "fanout"

        # Writes keep failing typed, without a crash, while the disk stays full.
        for _ in range(5):
            with pytest.raises(StoreFull):
                client.fanout.claim(descriptor, ["y" * PATH_CHARS] * BATCH)
        # Reads answer, and tell the truth: only acknowledged claims count.
        assert client.fanout.snapshot(descriptor).used == acknowledged
        assert client.capacity.snapshot("s1").used == 0
        assert client.runs.list() == []
        assert client.ping().pid == node.pid
        assert node.alive()
        assert_no_restarts(node)

        # Space returns: the same node, with no restart, serves writes again.
        tmpfs.remount(tiny_disk, "size=64m")
        snapshot = client.fanout.claim(descriptor, ["after-remount"] * BATCH)
        acknowledged += BATCH
        assert snapshot.used == acknowledged
        assert client.session.open("s1", 5).created
        assert_no_restarts(node)
        assert node.stop().returncode == 0

    # No acknowledged claim was lost: a new node reads them all back from the store.
    with running_node(state_dir=tiny_disk) as again:
        assert again.client().fanout.snapshot(descriptor).used == acknowledged


def _processes_serving(directory: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(directory) in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
    return found


def test_issue12_start_on_a_full_disk_fails_fast_with_one_line_and_leaves_nothing_running(
    tiny_disk: Path,
) -> None:
    with running_node(state_dir=tiny_disk) as node:
        client = node.client()
        fill_with_claims(client, client.fanout.create("full-disk", MAX_INT32))
        assert node.stop().returncode == 0
    fill_the_rest(tiny_disk)

    # It used to hang for the 20 s start handshake: a 10 s deadline fails that.
    done = run_cli("start", "--detach", state_dir=tiny_disk, timeout=10)
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "full" in lines[0], lines[0]
    assert read_pid_file(tiny_disk) is None
    assert _processes_serving(tiny_disk) == []
    assert not (tiny_disk / "node.sock").exists()


def test_a_detached_start_on_a_full_disk_says_error_once_and_points_at_no_empty_log(
    tiny_disk: Path,
) -> None:
    """The line was `error: the detached node failed to start: error: the disk under D is
    full: ...; see D/node.log`: "error:" twice, and a node.log the full disk had kept empty."""
    with running_node(state_dir=tiny_disk) as node:
        assert node.stop().returncode == 0
    (tiny_disk / "node.log").unlink(missing_ok=True)
    fill_the_rest(tiny_disk)

    done = run_cli("start", "--detach", state_dir=tiny_disk, timeout=10)
    assert done.returncode != 0, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: the detached node failed to start: the disk under "), line
    assert line.count("error:") == 1, line
    assert (tiny_disk / "node.log").stat().st_size == 0
    assert "node.log" not in line, line


def test_doctor_on_a_full_disk_says_it_is_full_and_never_advises_moving_a_ledger_aside(
    tiny_disk: Path,
) -> None:
    """Every intact database was a FAIL, "cannot be read: disk I/O error", with the advice to
    move it aside (its ledger then starts empty: fan-out claims are never refunded): doctor
    opened each read-only, which makes its -wal and -shm, and a full disk refused them. And
    doctor, which changes nothing, left those files behind wherever it could make them."""
    with running_node(state_dir=tiny_disk) as node:
        client = node.client()
        client.fanout.claim(client.fanout.create("full-disk", 64), ["a"])
        assert node.stop().returncode == 0
    fill_the_rest(tiny_disk)
    before = sorted(p.name for p in tiny_disk.iterdir())

    done = run_cli("doctor", state_dir=tiny_disk, timeout=60)
    assert "move it aside" not in done.stdout, done.stdout
    assert "[FAIL] state dir space: the file system holding" in done.stdout, done.stdout
    for stem in ("capacity", "fanout", "session", "runs"):
        assert f"[ok  ] store {stem} integrity: PRAGMA integrity_check: ok" in done.stdout
    assert sorted(p.name for p in tiny_disk.iterdir()) == before  # no -wal, no -shm made


def _fill(directory: Path) -> Path:
    """Write one file until the disk under `directory` is full; the file."""
    return tmpfs.fill(directory / "filler")


def test_a_run_whose_settlement_the_full_disk_undoes_settles_once_space_returns(
    tiny_disk: Path, tmp_path: Path
) -> None:
    """The child's end is stored; then the disk fills before the run's settlement commits.
    The supervisor had forgotten the run in memory before that commit failed: it stayed
    `running` for good with its slot held, until a node restart."""
    from tests.support.runs import Gate, launch_context, script_agents, wait_until

    agents = script_agents(tmp_path / "agents")
    gate = Gate(tmp_path)
    try:
        with running_node("--faults", state_dir=tiny_disk) as node:
            client = node.client()
            ctx = launch_context(agents, max_active_async_runs_per_session=2)
            run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
            probe = client.fanout.create(root_run_id="probe", limit=1)
            [child] = gate.accept(1)
            # The fan-out owner is stopped until the disk is full: the settlement waits for its
            # budget read. (A 3 s sleep of the owner instead ran out first on a loaded host.)
            fanout = next(a.pid for a in node.status().actors if a.name == "fanout")
            assert fanout is not None
            with stopped(fanout):
                child.release(0)
                child.wait_exit()
                wait_until(
                    lambda: client.runs.show(run.run_id).children[0].state == "complete",
                    what="the child's end stored",
                )
                filler = _fill(tiny_disk)
            client.fanout.snapshot(probe)  # the owner has answered the settlement's read
            assert client.runs.show(run.run_id).state == "running"  # its settlement was undone
            filler.unlink()
            done = client.runs.wait(run.run_id, timeout=30)
            assert done.state == "complete", done.error
            assert client.capacity.snapshot(ctx.session_id, 2).used == 0
            assert_no_restarts(node)
    finally:
        gate.close()


def _release_on_a_full_disk(
    node: NodeProcess, tiny_disk: Path, release: Callable[[], None]
) -> None:
    """Fill the disk, end the child (`release`) and free the disk only once the supervisor
    has handled the shim's report on the full disk: it is held busy while the report comes
    in, and a read it answers after the report's group was tried tells when that was."""
    import threading

    from subagents_node.messages.base import Ack
    from subagents_node.messages.node import DebugSleep

    filler = _fill(tiny_disk)

    def hold() -> None:  # its answer may be the group's StoreFull
        with contextlib.suppress(StoreFull):
            node.client().ask(DebugSleep(ms=2000), Ack, target="supervisor")

    busy = threading.Thread(target=hold)
    busy.start()
    release()
    busy.join()
    node.client().runs.list()  # answered once the group holding the report was tried
    filler.unlink()


_QUIET_GATE = """\
import os, socket, sys

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(f"{os.getpid()}\\n".encode())
sys.exit(int(sock.recv(64).decode().strip() or 3))
"""


@contextlib.contextmanager
def gated_node(
    tiny_disk: Path, tmp_path: Path, agents: Path
) -> Iterator[tuple[NodeProcess, Client, LaunchContext, Gate]]:
    """A node started with faults on the tiny disk, 16 MiB of room for a launch, a launch
    context allowing 2 background runs, and a gate its children wait at (closed after)."""
    gate = Gate(tmp_path)
    tmpfs.remount(tiny_disk, "size=16m")  # room for the launch; the filler takes the rest
    try:
        with running_node("--faults", state_dir=tiny_disk) as node:
            ctx = launch_context(agents, max_active_async_runs_per_session=2)
            yield node, node.client(), ctx, gate
    finally:
        gate.close()


def _quiet_agents(tmp_path: Path) -> Path:
    """An agents dir with `quiet`: a gate child that prints nothing (no log write to fail)."""
    from tests.support.runs import write_agent

    agents = tmp_path / "agents"
    command = '["{python}", "{agent_dir}/q.py", "{task}"]'
    write_agent(agents, "quiet", "A gate that prints nothing.", command)
    (agents / "q.py").write_text(_QUIET_GATE)
    return agents


def test_a_child_that_ends_while_the_disk_is_full_settles_with_its_exit_status_once_space_returns(
    tiny_disk: Path, tmp_path: Path
) -> None:
    """The child ends (exit 0, writing nothing) on a full disk: its shim cannot write its exit
    record, and the supervisor's commit of its report fails (`store_full`). The shim took that
    answer for an acknowledgement (or died of the record's ENOSPC) and exited; the node then
    found it gone with no record and settled the child `failed`, exit status unknown."""
    from tests.support.runs import wait_until

    with gated_node(tiny_disk, tmp_path, _quiet_agents(tmp_path)) as (node, client, ctx, gate):
        run = client.runs.launch(ctx.single("quiet", str(gate.path), True, None))
        [child] = gate.accept(1)
        _release_on_a_full_disk(node, tiny_disk, lambda: child.release(0))
        assert client.runs.wait(run.run_id, timeout=30).state == "complete"
        child_view = wait_until(
            lambda: [c for c in client.runs.show(run.run_id).children if c.exit_code == 0],
            what="the child's end stored",
        )[0]
        assert (child_view.state, child_view.proof_state) == ("complete", "observed")
        assert client.capacity.snapshot(ctx.session_id, 2).used == 0
        assert_no_restarts(node)


def test_a_chain_whose_next_step_start_the_full_disk_undid_starts_it_once_space_returns(
    tiny_disk: Path, tmp_path: Path
) -> None:
    """Step 0 ends on a full disk; the group that settled it and started step 1 is undone.
    Step 1 stayed in the supervisor's memory as running (its shim, forked only after a
    commit, never was) while the store said `pending`: the chain waited for it for good,
    holding its slot."""

    with gated_node(tiny_disk, tmp_path, _quiet_agents(tmp_path)) as (node, client, ctx, gate):
        step = {"agent": "quiet", "task": str(gate.path)}
        launch = ctx.from_mapping("chain", {"steps": [step, step]}, True, None)
        run = client.runs.launch(launch)
        [first] = gate.accept(1)
        _release_on_a_full_disk(node, tiny_disk, lambda: first.release(0))
        [second] = gate.accept(1)  # it used to never start
        second.release(0)
        done = client.runs.wait(run.run_id, timeout=30)
        assert done.state == "complete", done.error
        assert [c.state for c in done.children] == ["complete", "complete"]
        assert client.capacity.snapshot(ctx.session_id, 2).used == 0
        assert_no_restarts(node)


def test_keys_generate_on_a_full_disk_names_the_file_and_leaves_no_temp_file(
    tiny_disk: Path,
) -> None:
    """It said "error: No space left on device" (no file named) and left
    `keys/.server.key.PID.tmp`, the start of a secret key, behind."""
    state_dir = tiny_disk / "s"
    state_dir.mkdir(mode=0o700)
    fill_the_rest(tiny_disk)
    done = run_cli("keys", "generate", state_dir=state_dir)
    assert done.returncode == 1
    assert done.stderr == f"error: No space left on device: {state_dir}/keys/server.key\n"
    assert [p.name for p in (state_dir / "keys").iterdir()] == []
