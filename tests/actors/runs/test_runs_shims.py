"""Children under shims through a real node: restarts lose nothing, escaped daemons hold their
slot, and many children at once settle (DESIGN §1, SPEC §0.4 "Proof from the parent", R-RUN-5,
R-CAP-21, R-EXT-3).

Real node processes (`start --detach`), real shims and children, real sockets; every wait has a
deadline (a gate connection, a pidfd, a long-poll). The heavy ones are marked `slow`.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from subagents_node.messages.errors import Busy, SubagentsError
from subagents_node.messages.supervisor import RunView, TaskItem
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import (
    Gate,
    launch_context,
    read_fifo,
    stop_process,
    wait_until,
    write_agent,
)

CHILDREN = 30
T = TypeVar("T")


def wait_gone(pid: int, timeout: float = 20.0) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], timeout)[0], f"process {pid} is still alive"
    finally:
        os.close(fd)


def launch_gates(client: object, ctx: object, gate: Gate, count: int) -> RunView:
    from subagents_node.client.client import Client
    from subagents_node.launch.launcher import LaunchContext

    assert isinstance(client, Client) and isinstance(ctx, LaunchContext)
    tasks = [TaskItem(agent=ctx.plan("gate"), task=str(gate.path)) for _ in range(count)]
    run = client.runs.launch(ctx.launch("parallel", True, items=tasks, concurrency=count))
    assert all(c.pid for c in run.children)  # answered only once every child really runs
    return run


def end_children_while_no_node_runs(
    gate: Gate, count: int
) -> dict[int, tuple[int | None, int | None]]:
    """All but two exit 0; one exits 3; one is killed by SIGKILL. Returns pid -> (code, signal)."""
    children = gate.accept(count)
    expected: dict[int, tuple[int | None, int | None]] = {}
    for i, child in enumerate(children):
        if i == 0:
            os.kill(child.pid, signal.SIGKILL)
            expected[child.pid] = (None, signal.SIGKILL)
        else:
            code = 3 if i == 1 else 0
            child.release(code)
            expected[child.pid] = (code, None)
    for child in children:
        child.wait_exit()
    return expected


def assert_every_exit_status_kept(
    run: RunView, expected: dict[int, tuple[int | None, int | None]]
) -> None:
    assert run.state == "failed"  # one child failed
    by_pid = {c.pid: c for c in run.children}
    for pid, (code, signum) in expected.items():
        child = by_pid[pid]
        assert child.proof_state == "observed", child
        assert (child.exit_code, child.signal) == (code, signum), child
        assert child.state == ("complete" if code == 0 else "failed")
    assert "exited with code 3" in run.error or "signal 9" in run.error


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill-9", "stop"])
def test_r_run_5_a_node_restart_keeps_every_childs_exit_status_and_frees_the_slot(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate, how: str
) -> None:
    """kill -9 of the node, or the documented upgrade (`stop` + `start`), while 30 children
    run; they end while no node runs (0, 3, SIGKILL); the next node settles each with its true
    exit status (the shims, their parents, kept it) and releases the slot with proof."""
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    run = launch_gates(client, ctx, gate, CHILDREN)
    if how == "kill-9":
        first.kill()
    else:
        assert first.stop().returncode == 0
    expected = end_children_while_no_node_runs(gate, CHILDREN)

    client = start_node(state_dir=state_dir).client()
    done = client.runs.wait(run.run_id, timeout=60)

    assert_every_exit_status_kept(done, expected)
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


def test_a_child_starts_with_every_signal_at_its_default_as_under_a_bare_popen(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """The owners ignore SIGINT and SIGHUP (the node handles them for its owners), and the shim
    template inherited that, and through its shims every child: each agent started with both
    ignored (and so did what it started), which no bare Popen does. Every signal is at its
    default in a child now, and none is blocked (the node's threads but its main one block
    the signals that stop it). (Signals 32 and 33 are glibc's own and left to it.)"""
    # grep itself, not a shell: a shell sets its own mask as it starts.
    command = '["grep", "-E", "SigIgn|SigBlk", "/proc/self/status"]'
    write_agent(agents, "dispositions", "Prints the signals it ignores and blocks.", command)
    client = start_node(state_dir=state_dir).client()
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("dispositions", "x", False, None))
    [child] = client.runs.wait(run.run_id, timeout=30).children
    said = dict(line.split(":") for line in Path(child.stdout_path).read_text().splitlines())
    for field in ("SigIgn", "SigBlk"):
        mask = int(said[field], 16)
        assert [signal.Signals(n).name for n in range(1, 32) if mask >> (n - 1) & 1] == [], field


def test_a_child_starts_with_the_open_files_limit_of_the_shell_that_started_the_node(
    state_dir: Path, agents: Path
) -> None:
    """`start` lifts its own soft limit on open files for its sockets, and every child used to
    inherit the lifted one (65,536, or the hard limit) where a `Popen` from the shell that
    started the node gives that shell's (1,024, commonly: a program that select()s, or closes
    every descriptor up to its limit, behaves otherwise under the other)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"a hard limit of {hard} leaves nothing to lift above 1024")
    command = '["/bin/sh", "-c", "ulimit -S -n"]'
    write_agent(agents, "limits", "Prints its soft limit on open files.", command)
    shell = ("sh", "-c", 'ulimit -S -n 1024 && exec "$0" "$@"')
    node = NodeProcess(state_dir, prefix=shell).start()
    try:
        assert psutil.Process(node.pid).rlimit(psutil.RLIMIT_NOFILE)[0] > 1024  # lifted
        client = node.client()
        run = client.runs.launch(launch_context(agents).single("limits", "x", False, None))
        [child] = client.runs.wait(run.run_id, timeout=30).children
        assert Path(child.stdout_path).read_text().strip() == "1024"
    finally:
        node.cleanup()


def test_r_cap_21_a_setsid_grandchild_holds_the_slot_until_it_ends_and_stop_kills_it(
    start_node: Callable[..., NodeProcess], state_dir: Path, tmp_path: Path
) -> None:
    client = start_node(state_dir=state_dir).client()
    ctx = launch_context(max_active_async_runs_per_session=1)
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    run = client.runs.launch(ctx.single("sleeper", f"seconds=0 daemon=60 ready={fifo}", True, None))
    _, _, daemon = (int(p) for p in read_fifo(fifo).split())
    child_pid = run.children[0].pid
    assert child_pid is not None
    wait_gone(child_pid)  # the child itself exited 0 ...

    view = client.runs.show(run.run_id)
    assert view.state == "running" and view.children[0].state == "running"  # ... its tree not
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1

    stopped = client.runs.stop(run.run_id)
    assert stopped.run_id == run.run_id
    wait_gone(daemon)
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "stopped" and done.children[0].proof_state == "observed"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


def test_r_cap_21_a_daemon_that_ends_by_itself_settles_the_run_after_it_and_not_before(
    start_node: Callable[..., NodeProcess], state_dir: Path, tmp_path: Path
) -> None:
    client = start_node(state_dir=state_dir).client()
    ctx = launch_context(max_active_async_runs_per_session=1)
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    run = client.runs.launch(ctx.single("sleeper", f"seconds=0 daemon=2 ready={fifo}", True, None))
    _, _, daemon = (int(p) for p in read_fifo(fifo).split())
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "complete"
    with pytest.raises(ProcessLookupError):
        os.kill(daemon, 0)  # the run settled only once the daemon was gone (and reaped)


def refused_busy_then_retried(call: Callable[[], T], deadline_s: float = 120.0) -> T:
    """`Busy` is the supervisor's mailbox limit refusing a request (backpressure, a limit
    refusal like the others): retried, with backoff, until `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    delay = 0.05
    while True:
        try:
            return call()
        except Busy:
            if time.monotonic() + delay > deadline:
                raise
            threading.Event().wait(delay)  # backoff before retrying a refused request
            delay = min(1.0, delay * 2)


@pytest.mark.slow
def test_eight_sessions_of_64_parallel_children_at_once_all_complete_and_free_their_slots(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    node = start_node(state_dir=state_dir)
    runs: list[RunView] = []
    errors: list[BaseException] = []
    contexts = [
        launch_context(max_active_async_runs_per_session=1, max_subagent_spawns_per_run=1000)
        for _ in range(8)
    ]

    def launch(i: int) -> None:
        try:
            client = node.client(timeout=60)
            ctx = contexts[i]
            items = [TaskItem(agent=ctx.plan("sleeper"), task="seconds=0.5") for _ in range(64)]
            launch = ctx.launch("parallel", True, items=items, concurrency=64)
            runs.append(refused_busy_then_retried(lambda: client.runs.launch(launch)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    client = node.client(timeout=60)
    for run in runs:
        done = refused_busy_then_retried(lambda r=run: client.runs.wait(r.run_id, timeout=120))
        assert done.state == "complete", (done.state, done.error)
        assert all(c.proof_state == "observed" and c.exit_code == 0 for c in done.children)
    assert node.alive() and client.ping().pid == node.pid
    for ctx in contexts:
        wait_until(lambda c=ctx: client.capacity.snapshot(c.session_id, 1).used == 0, what="slot")


KILL_POINTS = ("record_run", "mark_started", "fork_shim", "answer_launch")


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_node_killed_between_launch_steps_leaves_no_stuck_run_and_no_unproven_slot(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
) -> None:
    """kill -9 of the node at each step of a launch (fault injection, SUBAGENTS_TEST_KILL_AT):
    after a restart every run of the session is settled or genuinely running, and the slot is
    freed (with proof, or by the reservation TTL when no run was ever recorded)."""
    monkeypatch.setenv("SUBAGENTS_RESERVATION_TTL_S", "1")
    first = start_node("--faults", state_dir=state_dir, kill_at=point)
    ctx = launch_context(max_active_async_runs_per_session=1)
    with pytest.raises(SubagentsError):
        first.client(timeout=5).runs.launch(ctx.single("sleeper", "seconds=1", True, None))
    assert first.wait_exited(10), f"the node did not die at {point}"

    client = start_node(state_dir=state_dir).client()
    for run in client.runs.list(session_id=ctx.session_id):
        done = client.runs.wait(run.run_id, timeout=30)
        assert done.state in ("complete", "failed"), (point, done.state)
        assert all(c.proof_state in ("observed", "not-started") for c in done.children), done
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


REPORT_KILL_POINTS = (
    "report_started_received",
    "report_started_committed",
    "report_tree_ended_received",
    "report_tree_ended_committed",
)


@pytest.mark.slow
@pytest.mark.parametrize("point", REPORT_KILL_POINTS)
def test_a_node_killed_between_a_shim_report_and_its_ack_leaves_no_stuck_run_or_held_slot(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    point: str,
) -> None:
    """kill -9 of the node on receiving a shim's report, or after committing it but before
    acknowledging it: the shim resends it to the next node (a report is applied idempotently),
    so the run settles with the child's true exit status and the slot is released."""
    first = start_node("--faults", state_dir=state_dir, kill_at=point)
    ctx = launch_context(max_active_async_runs_per_session=1)
    launch = ctx.single("sleeper", "seconds=0.5 exit=3", True, None)
    if "started" in point:  # the launch is answered only once its child's start is committed
        with pytest.raises(SubagentsError):
            first.client(timeout=5).runs.launch(launch)
    else:
        first.client(timeout=5).runs.launch(launch)
    assert first.wait_exited(20), f"the node did not die at {point}"

    client = start_node(state_dir=state_dir).client()
    [run] = client.runs.list(session_id=ctx.session_id)
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "failed" and done.children[0].exit_code == 3, (point, done)
    assert done.children[0].proof_state == "observed"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


def shim_of(view: RunView) -> int:
    child = view.children[0]
    record = Path(child.stdout_path).parent / f"child-{child.index}" / "shim.json"
    return int(json.loads(record.read_text())["shim_pid"])


@pytest.mark.parametrize("then", ["stop", "child exits"])
def test_r_cap_21_a_shim_killed_while_its_child_runs_leaves_the_child_the_tree(
    start_node: Callable[..., NodeProcess], state_dir: Path, then: str
) -> None:
    """Only the tree's end proves it, and with its shim dead the live child *is* the tree:
    the run stays running and holds its slot (it used to settle `failed` at once with the
    slot retained for good and the child out of `stop`'s reach), `stop` kills the child, and
    the child's end, seen by the node, frees the slot (its exit status is unknown)."""
    node = start_node(state_dir=state_dir)
    client = node.client()
    ctx = launch_context(max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("sleeper", "seconds=60", True, None))
    child_pid = run.children[0].pid
    assert child_pid is not None
    try:
        shim = shim_of(run)
        os.kill(shim, signal.SIGKILL)
        wait_gone(shim)
        wait_until(
            lambda: (
                "live on (pid " in node.log() or client.runs.show(run.run_id).state != "running"
            ),
            what="the node to see the shim's death",
        )
        view = client.runs.show(run.run_id)
        assert view.state == "running" and view.children[0].state == "running"
        assert client.capacity.snapshot(ctx.session_id, 1).used == 1
        os.kill(child_pid, 0)  # alive, and what holds the slot

        if then == "stop":
            client.runs.stop(run.run_id)
        else:
            os.kill(child_pid, signal.SIGTERM)
        wait_gone(child_pid)
        done = client.runs.wait(run.run_id, timeout=30)
        assert done.state == ("stopped" if then == "stop" else "failed")
        assert done.children[0].proof_state == "observed"
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)


def test_r_run_5_a_shim_killed_after_its_child_is_gone_settles_from_the_reported_identity(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    """The shim is frozen, its child killed, then the shim killed: nobody saw the exit status,
    but the one process it reported is gone, so the proof is `observed` and the slot freed."""
    client = start_node(state_dir=state_dir).client()
    ctx = launch_context(max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("sleeper", "seconds=60", True, None))
    child_pid = run.children[0].pid
    assert child_pid is not None
    shim_pid = shim_of(run)
    # Its template would continue it (actors/child/shimstops.py): stopped first and killed once
    # the shim is stopped, it leaves the shim stopped, an orphan nobody continues.
    template_pid = int(Path(f"/proc/{shim_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    stop_process(template_pid)
    stop_process(shim_pid)
    os.kill(template_pid, signal.SIGKILL)
    os.kill(child_pid, signal.SIGKILL)
    wait_gone(child_pid)  # exited (a zombie its frozen parent cannot reap)
    # The node may continue the shim first (its template is gone: actors/child/strays.py): it
    # then reaps the child and reports the SIGKILL itself, the same end.
    with suppress(ProcessLookupError):
        os.kill(shim_pid, signal.SIGKILL)
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "failed" and done.children[0].proof_state == "observed"
    assert done.children[0].exit_code is None
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


def test_r_cap_21_a_dead_shims_setsid_grandchild_holds_the_slot_until_it_ends_and_stop_kills_it(
    start_node: Callable[..., NodeProcess], state_dir: Path, tmp_path: Path
) -> None:
    """DESIGN §1: for a shim that itself died, the tree's end is proven from the recorded
    identities of every process it reported. The child exits 0 leaving a `setsid()` daemon,
    the shim records and reports it, then the shim is killed: the run stays running and the
    slot held while the daemon lives, and `stop` of the run kills the daemon."""
    node = start_node(state_dir=state_dir)
    client = node.client()
    ctx = launch_context(max_active_async_runs_per_session=1)
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    run = client.runs.launch(ctx.single("sleeper", f"seconds=0 daemon=60 ready={fifo}", True, None))
    _, _, daemon = (int(p) for p in read_fifo(fifo).split())
    child = run.children[0]
    record = Path(child.stdout_path).parent / f"child-{child.index}" / "exit.json"

    def exit_recorded() -> bool:
        with suppress(OSError, ValueError):
            return daemon in [p["pid"] for p in json.loads(record.read_text())["descendants"]]
        return False

    wait_until(exit_recorded, what="the shim to record the daemon it was left with")
    shim = shim_of(run)
    os.kill(shim, signal.SIGKILL)
    wait_gone(shim)
    wait_until(
        lambda: "live on (pid " in node.log() or client.runs.show(run.run_id).state != "running",
        what="the node to see the shim's death",
    )

    view = client.runs.show(run.run_id)
    assert view.state == "running" and view.children[0].state == "running"
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1
    os.kill(daemon, 0)  # alive, and what holds the slot

    client.runs.stop(run.run_id)
    wait_gone(daemon)
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "stopped" and done.children[0].proof_state == "observed"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


def node_threads_and_store_files(pid: int) -> tuple[int, int]:
    """Threads and open database files of the node and its owner processes (the run
    supervisor's among them), summed."""
    threads = store = 0
    node = psutil.Process(pid)
    for proc in (node, *node.children()):  # the owners (the shim template is the supervisor's)
        threads += len(os.listdir(f"/proc/{proc.pid}/task"))
        for fd in os.listdir(f"/proc/{proc.pid}/fd"):
            with suppress(OSError):
                store += os.readlink(f"/proc/{proc.pid}/fd/{fd}").endswith(".db")
    return threads, store


@pytest.mark.slow
def test_node_threads_and_store_connections_do_not_grow_with_the_number_of_children(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    """DESIGN §1/§2: no thread and no store connection per child in the node (version 1 had
    one of each, and crashed on SQLite's write lock at about 450 children)."""
    node = start_node(state_dir=state_dir)
    client = node.client()
    ctx = launch_context(agents, max_subagent_spawns_per_run=1000)
    first = launch_gates(client, ctx, gate, 1)
    one = node_threads_and_store_files(node.pid)
    many = launch_gates(client, ctx, gate, 48)
    assert node_threads_and_store_files(node.pid) == one
    for child in gate.accept(49):
        child.release(0)
    for run in (first, many):
        assert client.runs.wait(run.run_id, timeout=60).state == "complete"
