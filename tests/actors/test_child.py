"""ChildActor: real child processes, an embedded Store and ActorContext, no node (R-EXT-3, R-RUN-5).

Every test waits on the actor's events (a queue) or on a FIFO the child writes to; nothing
sleeps blindly. Processes a test starts itself are reaped by the test; at teardown every actor is
stopped and any process still alive is killed, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import pykka
import pytest

from subagents_node.actors.child import process_tree
from subagents_node.actors.child import rows as child_rows
from subagents_node.actors.child.actor import ChildActor, recover_children, start_child, stop_child
from subagents_node.actors.child.process_tree import ProcessIdentity, is_alive
from subagents_node.actors.owner import ActorContext, Job
from subagents_node.messages.base import Ack
from subagents_node.messages.errors import Internal
from subagents_node.messages.node import DebugRaise
from subagents_node.messages.runs import (
    OUTPUT_TAIL_BYTES,
    REASON_ADOPTED_EXITED,
    REASON_EXITED,
    REASON_GONE,
    REASON_NOT_STARTED,
    UNKNOWN_EXIT_ERROR,
    ChildExited,
    ChildSpec,
    ChildStarted,
    ProcessProof,
    exit_error,
    timeout_error,
)
from subagents_node.node.store import Store
from subagents_node.node.timers import Timers

SLEEPER = Path(__file__).resolve().parents[2] / "examples" / "agents" / "sleeper.py"
PY = sys.executable
WAIT_S = 15.0


class Harness:
    """An embedded store + timers + context, and the events every ChildActor emitted."""

    def __init__(self, faults: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sa-", dir="/tmp"))
        self.db_path = self.dir / "state.db"
        Store(self.db_path).migrate({ChildActor.name: ChildActor.MIGRATIONS})
        self.timers = Timers()
        self.ctx = ActorContext(
            open_db=Store(self.db_path).connect, schedule=self.timers.schedule, faults=faults
        )
        self.events: queue.Queue[ChildStarted | ChildExited] = queue.Queue()
        self.refs: list[pykka.ActorRef[Any]] = []
        self.pids: list[ProcessIdentity] = []
        self.checks: list[str] = []

    def spec(self, child_id: str, argv: list[str], **fields: Any) -> ChildSpec:
        fields.setdefault("cwd", str(self.dir))
        fields.setdefault("env", {"PATH": os.environ.get("PATH", os.defpath)})
        return ChildSpec(
            child_id=child_id,
            run_id="run-1",
            session_id="s-1",
            argv=argv,
            stdout_path=str(self.dir / "logs" / f"{child_id}.stdout.log"),
            stderr_path=str(self.dir / "logs" / f"{child_id}.stderr.log"),
            **fields,
        )

    def start(self, spec: ChildSpec) -> pykka.ActorRef[Any]:
        ref = start_child(self.ctx, spec, self.on_event)
        self.refs.append(ref)
        return ref

    def on_event(self, event: ChildStarted | ChildExited) -> None:
        if isinstance(event, ChildStarted):
            started = process_tree.start_time_of(event.pid)
            if started is not None:  # a quick child may be gone already
                self.pids.append(ProcessIdentity(event.pid, started))
        self.events.put(event)

    def next_event(self, timeout: float = WAIT_S) -> ChildStarted | ChildExited:
        return self.events.get(timeout=timeout)

    def started(self) -> ChildStarted:
        event = self.next_event()
        assert isinstance(event, ChildStarted), event
        return event

    def exited(self, timeout: float = WAIT_S) -> ChildExited:
        event = self.next_event(timeout)
        assert isinstance(event, ChildExited), event
        return event

    def row(self, child_id: str) -> sqlite3.Row | None:
        """Read the store through a connection of our own (what another process would see)."""
        conn = sqlite3.connect(self.db_path)
        conn.row_factory = sqlite3.Row
        try:
            row: sqlite3.Row | None = conn.execute(
                "SELECT * FROM children WHERE child_id = ?", (child_id,)
            ).fetchone()
            return row
        finally:
            conn.close()

    def close(self) -> None:
        for ref in self.refs:
            with suppress(pykka.ActorDeadError):
                ref.stop(block=True, timeout=10)
        for identity in self.pids:
            if is_alive(identity):
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(identity.pid, signal.SIGKILL)
        self.timers.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


@pytest.fixture(params=[True, False], ids=["pidfd", "fallback"])
def watch_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run a test with pidfd exit watching and with the fallback (Popen.wait / psutil)."""
    if request.param and not process_tree.PIDFD:
        pytest.skip("no pidfd support on this kernel")
    monkeypatch.setattr(process_tree, "PIDFD", request.param)
    return bool(request.param)


def read_fifo(path: Path, timeout: float = WAIT_S) -> str:
    """Block until the child writes its line into the FIFO (a thread, so it has a deadline)."""
    got: list[str] = []
    done = threading.Event()

    def reader() -> None:
        with open(path) as fifo:
            got.append(fifo.read())
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    assert done.wait(timeout), "the child never wrote to its FIFO"
    return got[0]


def sleeper_with_grandchild(h: Harness, ignore_term: bool) -> tuple[list[str], Path]:
    fifo = h.dir / "ready.fifo"
    os.mkfifo(fifo)
    task = f"seconds=60 grandchild=1 ignore_term={int(ignore_term)} ready={fifo}"
    return [PY, str(SLEEPER), task], fifo


def identity(pid: int, zombies: bool = False) -> ProcessIdentity:
    started = process_tree.start_time_of(pid, zombies=zombies)
    assert started is not None, f"process {pid} is gone"
    return ProcessIdentity(pid, started)


def spawn_own(argv: list[str]) -> subprocess.Popen[bytes]:
    """A process of the test's own, in its own session (as a ChildActor would have started it)."""
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)


def recorded_running(
    h: Harness, child_id: str, pid: int, start_time: float, boot: str = "", **extra: Any
) -> None:
    """The row a node killed with -9 leaves behind for a child it had started."""
    record = child_rows.ChildRecord(
        child_id=child_id,
        run_id="run-1",
        session_id="s-1",
        stdout_path=str(h.dir / f"{child_id}.out"),
        stderr_path=str(h.dir / f"{child_id}.err"),
        grace_s=0.3,
        pid=pid,
        start_time=time.time(),
        identity_start=start_time,
        boot_id=boot or process_tree.boot_id(),
        started_at=time.time(),
        **extra,
    )
    conn = Store(h.db_path).connect()
    try:
        child_rows.insert_running(conn, record)
    finally:
        conn.close()


# -- exits --------------------------------------------------------------------------------------


def test_r_ext_3_child_that_exits_0_completes_with_its_trimmed_stdout(
    harness: Harness, watch_mode: bool
) -> None:
    spec = harness.spec("c1", [PY, "-c", "print('  hello from the child  ')"])
    harness.start(spec)
    started = harness.started()
    exited = harness.exited()
    assert started.child_id == exited.child_id == "c1"
    assert exited.state == "complete"
    assert exited.exit_code == 0 and exited.error is None
    assert exited.output == "hello from the child"
    assert exited.proof.state == "observed"
    assert exited.proof.reason == REASON_EXITED
    assert (exited.proof.pid, exited.proof.process_start_time) == (
        started.pid,
        started.process_start_time,
    )
    assert exited.proof.exit_code == 0 and exited.proof.signal is None


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ("import sys; sys.stderr.write('  disk full\\n'); sys.exit(3)", "disk full"),
        ("import sys; sys.exit(7)", exit_error(7)),
    ],
    ids=["stderr-tail", "exit-code-message"],
)
def test_r_ext_3_nonzero_exit_fails_with_the_stderr_tail_or_the_exit_code_message(
    harness: Harness, script: str, error: str
) -> None:
    harness.start(harness.spec("c1", [PY, "-c", script]))
    harness.started()
    exited = harness.exited()
    assert exited.state == "failed"
    assert exited.error == error
    assert exited.exit_code == exited.proof.exit_code
    assert exited.proof.state == "observed"


def test_r_ext_3_full_output_goes_to_the_log_and_the_event_carries_the_last_64_kib(
    harness: Harness,
) -> None:
    script = "import sys; sys.stdout.write('x' * 200_000 + 'THE END\\n')"
    spec = harness.spec("c1", [PY, "-c", script])
    harness.start(spec)
    harness.started()
    exited = harness.exited()
    assert Path(spec.stdout_path).stat().st_size == 200_000 + len("THE END\n")
    assert len(exited.output.encode()) <= OUTPUT_TAIL_BYTES
    assert exited.output.endswith("THE END")
    assert oct(Path(spec.stdout_path).stat().st_mode & 0o777) == oct(0o600)


def test_child_reads_its_stdin_file_and_gets_the_given_env_and_cwd(harness: Harness) -> None:
    stdin = harness.dir / "stdin.txt"
    stdin.write_text("<Task>\nfrom the stdin file")
    workdir = harness.dir / "work"
    workdir.mkdir()
    script = "import os, sys; print(sys.stdin.read(), os.environ['ONLY_THIS'], os.getcwd())"
    spec = harness.spec(
        "c1",
        [PY, "-c", script],
        stdin_path=str(stdin),
        env={"ONLY_THIS": "yes"},
        cwd=str(workdir),
    )
    harness.start(spec)
    harness.started()
    exited = harness.exited()
    assert exited.output == f"<Task>\nfrom the stdin file yes {workdir}"


def test_child_without_a_stdin_file_reads_dev_null(harness: Harness) -> None:
    harness.start(harness.spec("c1", [PY, "-c", "import sys; print(repr(sys.stdin.read()))"]))
    harness.started()
    assert harness.exited().output == "''"


# -- deadline, stop, process groups ------------------------------------------------------------


def test_r_ext_3_deadline_kills_the_whole_tree_including_a_grandchild_that_ignores_term(
    harness: Harness, watch_mode: bool
) -> None:
    argv, fifo = sleeper_with_grandchild(harness, ignore_term=True)
    harness.start(harness.spec("c1", argv, deadline_s=1.0, grace_s=0.3))
    harness.started()
    leader_pid, grandchild_pid = map(int, read_fifo(fifo).split())
    leader, grandchild = identity(leader_pid), identity(grandchild_pid)
    assert is_alive(grandchild)
    exited = harness.exited()
    assert exited.state == "failed" and exited.timed_out
    assert exited.error == timeout_error(1.0)
    assert exited.exit_code == 1  # R-EXT-3: a timeout reports exit code 1
    assert exited.proof.state == "observed" and exited.proof.signal == signal.SIGKILL
    assert not is_alive(leader)
    assert not is_alive(grandchild)


def test_r_ext_3_stop_ends_the_group_with_term_and_marks_the_child_stopped_not_failed(
    harness: Harness,
) -> None:
    argv, fifo = sleeper_with_grandchild(harness, ignore_term=False)
    ref = harness.start(harness.spec("c1", argv, grace_s=5.0))
    harness.started()
    _, grandchild_pid = map(int, read_fifo(fifo).split())
    grandchild = identity(grandchild_pid)
    assert stop_child(ref, "Stopped by the test.").get(timeout=WAIT_S) == Ack()
    exited = harness.exited()
    assert exited.state == "stopped" and exited.stopped and not exited.timed_out
    assert exited.error == "Stopped by the test."
    assert exited.exit_code == 1
    assert exited.proof.signal == signal.SIGTERM  # ended within the grace: no SIGKILL needed
    assert not is_alive(grandchild)
    assert harness.row("c1")["state"] == "stopped"  # type: ignore[index]


def test_stop_after_the_child_ended_is_acknowledged_and_changes_nothing(harness: Harness) -> None:
    ref = harness.start(harness.spec("c1", [PY, "-c", "pass"]))
    harness.started()
    exited = harness.exited()
    assert stop_child(ref).get(timeout=WAIT_S) == Ack()
    assert harness.row("c1")["state"] == exited.state == "complete"  # type: ignore[index]


def test_leader_exit_ends_members_of_its_group_that_outlive_it(harness: Harness) -> None:
    script = "sleep 60 & echo $!; exit 0"
    harness.start(harness.spec("c1", ["sh", "-c", script], grace_s=0.3))
    harness.started()
    exited = harness.exited()
    grandchild_pid = int(exited.output)
    assert exited.state == "complete"
    assert exited.proof.state == "observed"
    assert not psutil.pid_exists(grandchild_pid) or (
        psutil.Process(grandchild_pid).status() == psutil.STATUS_ZOMBIE
    )


# -- proof and store ordering ------------------------------------------------------------------


def test_r_run_5_state_and_proof_are_committed_before_each_event_is_emitted(
    harness: Harness,
) -> None:
    seen: list[tuple[str, Any]] = []

    def on_event(event: ChildStarted | ChildExited) -> None:
        row = harness.row(event.child_id)  # a separate connection: only committed data
        assert row is not None
        if isinstance(event, ChildStarted):
            seen.append((row["state"], (row["pid"], row["process_start_time"])))
        else:
            seen.append((row["state"], ProcessProof.model_validate_json(row["proof"])))
        harness.on_event(event)

    argv, fifo = sleeper_with_grandchild(harness, ignore_term=False)
    ref = start_child(harness.ctx, harness.spec("c1", argv), on_event)
    harness.refs.append(ref)
    started = harness.started()
    read_fifo(fifo)
    stop_child(ref)
    exited = harness.exited()
    assert seen[0] == ("running", (started.pid, started.process_start_time))
    assert seen[1] == ("stopped", exited.proof)
    assert harness.row("c1")["signal"] == signal.SIGTERM  # type: ignore[index]


def test_a_quick_child_may_commit_its_exit_in_the_same_group_as_its_start(
    harness: Harness,
) -> None:
    """Both events still come, in order, each after what it reports is durable."""
    recorded: list[Any] = []

    def on_event(event: ChildStarted | ChildExited) -> None:
        row = harness.row(event.child_id)
        recorded.append(None if row is None else (row["pid"], row["proof"] is not None))
        harness.on_event(event)

    harness.refs.append(start_child(harness.ctx, harness.spec("c1", [PY, "-c", "pass"]), on_event))
    started = harness.started()
    harness.exited()
    assert recorded[0] is not None and recorded[0][0] == started.pid
    assert recorded[1] == (started.pid, True)


@pytest.mark.parametrize("case", ["missing-command", "cwd-gone", "not-executable"])
def test_r_run_5_spawn_failure_records_a_not_started_proof_and_never_raises(
    harness: Harness, case: str
) -> None:
    not_executable = harness.dir / "tool.sh"
    not_executable.write_text("#!/bin/sh\n")
    argv, cwd, words = {
        "missing-command": (["/nonexistent/agent-cli"], str(harness.dir), "/nonexistent/agent-cli"),
        "cwd-gone": ([PY, "-c", "pass"], str(harness.dir / "gone"), "working directory"),
        "not-executable": ([str(not_executable)], str(harness.dir), "Permission denied"),
    }[case]
    ref = harness.start(harness.spec("c1", argv, cwd=cwd))
    exited = harness.exited()
    assert exited.state == "failed"
    assert exited.proof.state == "not-started" and exited.proof.reason == REASON_NOT_STARTED
    assert exited.proof.pid is None
    assert exited.error is not None and words in exited.error
    assert exited.proof.error == exited.error
    row = harness.row("c1")
    assert row is not None and row["state"] == "failed" and row["pid"] is None
    assert harness.events.empty()  # no ChildStarted for a process that never existed
    assert ref.actor_stopped.wait(WAIT_S)  # the actor ends once its child is settled


def test_child_actor_crash_is_restarted_from_the_store_and_still_settles_its_child() -> None:
    h = Harness(faults=True)
    try:
        argv, fifo = sleeper_with_grandchild(h, ignore_term=False)
        ref = h.start(h.spec("c1", argv))
        h.started()
        read_fifo(fifo)
        reply: queue.Queue[Any] = queue.Queue()
        ref.tell(Job(DebugRaise(), reply.put))
        assert isinstance(reply.get(timeout=WAIT_S), Internal)
        assert stop_child(ref).get(timeout=WAIT_S) == Ack()
        exited = h.exited()
        assert exited.state == "stopped"
        assert h.row("c1")["state"] == "stopped"  # type: ignore[index]
    finally:
        h.close()


# -- recovery after a node restart ---------------------------------------------------------------


def test_recovery_settles_a_dead_pid_and_a_reused_pid_as_gone_and_adopts_a_live_process(
    harness: Harness, watch_mode: bool
) -> None:
    dead = spawn_own(["sleep", "60"])
    dead_identity = identity(dead.pid)
    dead.kill()
    dead.wait()
    dead.stdout.close()  # type: ignore[union-attr]
    live = spawn_own(["sleep", "60"])
    try:
        recorded_running(harness, "dead", dead_identity.pid, dead_identity.start_time)
        # Our own pid with another start time: the recorded process is gone, the pid reused.
        recorded_running(harness, "reused", os.getpid(), identity(os.getpid()).start_time - 500)
        recorded_running(harness, "live", live.pid, identity(live.pid).start_time)

        refs = recover_children(harness.ctx, harness.on_event)
        harness.refs.extend(refs.values())
        assert sorted(refs) == ["dead", "live", "reused"]
        events = [harness.next_event() for _ in range(3)]
        gone = {e.child_id: e for e in events if isinstance(e, ChildExited)}
        adopted_start = [e for e in events if isinstance(e, ChildStarted)]
        assert sorted(gone) == ["dead", "reused"]
        assert [(e.child_id, e.pid, e.adopted) for e in adopted_start] == [("live", live.pid, True)]
        for event in gone.values():
            assert event.state == "failed" and event.error == UNKNOWN_EXIT_ERROR
            assert event.proof.state == "observed" and event.proof.reason == REASON_GONE
            assert harness.row(event.child_id)["state"] == "failed"  # type: ignore[index]
        assert harness.events.empty()
        assert harness.row("live")["state"] == "running"  # type: ignore[index]

        live.terminate()
        live.wait()
        adopted = harness.exited()
        assert adopted.child_id == "live"
        assert adopted.proof.state == "observed"
        assert adopted.proof.reason == REASON_ADOPTED_EXITED
        assert adopted.proof.exit_code is None and adopted.exit_code is None
        proof = json.loads(harness.row("live")["proof"])  # type: ignore[index]
        assert proof["reason"] == REASON_ADOPTED_EXITED
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
        live.stdout.close()  # type: ignore[union-attr]


def test_recovery_terminates_an_adopted_process_whose_deadline_passed(harness: Harness) -> None:
    live = spawn_own(["sleep", "60"])
    try:
        recorded_running(
            harness,
            "late",
            live.pid,
            identity(live.pid).start_time,
            deadline_at=time.time() - 1,
            timeout_s=5.0,
        )
        harness.refs.extend(recover_children(harness.ctx, harness.on_event).values())
        assert harness.started().adopted
        assert live.wait(timeout=WAIT_S) == -signal.SIGTERM
        exited = harness.exited()
        assert exited.state == "failed" and exited.timed_out
        assert exited.error == timeout_error(5.0)
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
        live.stdout.close()  # type: ignore[union-attr]


def test_recovery_of_a_dead_leader_ends_the_members_its_group_left_behind(
    harness: Harness,
) -> None:
    leader = spawn_own(["sh", "-c", "sleep 60 >/dev/null & echo $!; exit 0"])
    leader_identity = identity(leader.pid, zombies=True)  # it may have exited already
    out, _ = leader.communicate(timeout=WAIT_S)
    member = identity(int(out))
    assert is_alive(member) and os.getpgid(member.pid) == leader.pid
    recorded_running(harness, "c1", leader_identity.pid, leader_identity.start_time)
    harness.refs.extend(recover_children(harness.ctx, harness.on_event).values())
    exited = harness.exited()
    assert exited.proof.reason == REASON_GONE
    assert not is_alive(member)


def test_recovery_with_nothing_running_starts_no_actor(harness: Harness) -> None:
    assert recover_children(harness.ctx, harness.on_event) == {}


def test_recovery_treats_a_pid_recorded_before_a_reboot_as_gone_and_never_signals_it(
    harness: Harness,
) -> None:
    stranger = spawn_own(["sleep", "60"])
    try:
        me = identity(stranger.pid)
        recorded_running(harness, "c1", me.pid, me.start_time, boot="a-previous-boot")
        harness.refs.extend(recover_children(harness.ctx, harness.on_event).values())
        exited = harness.exited()
        assert exited.proof.reason == REASON_GONE
        assert is_alive(me)  # neither the process nor its group was ours to end
    finally:
        stranger.kill()
        stranger.wait()
        stranger.stdout.close()  # type: ignore[union-attr]


def test_a_stop_sent_right_after_start_still_finds_the_start_recorded(harness: Harness) -> None:
    argv, _ = sleeper_with_grandchild(harness, ignore_term=False)
    ref = harness.start(harness.spec("c1", argv))
    assert stop_child(ref).get(timeout=WAIT_S) == Ack()
    harness.started()
    exited = harness.exited()
    assert exited.state == "stopped" and exited.proof.signal == signal.SIGTERM
    assert harness.row("c1")["end_reason"] == "stopped"  # type: ignore[index]


def test_an_actor_stopped_with_its_node_leaves_the_child_running_for_recovery_to_adopt(
    harness: Harness,
) -> None:
    argv, fifo = sleeper_with_grandchild(harness, ignore_term=False)
    first = harness.start(harness.spec("c1", argv))
    started = harness.started()
    read_fifo(fifo)
    first.stop(block=True, timeout=WAIT_S)  # the node shuts down; the child is not touched
    leader = identity(started.pid)
    assert is_alive(leader) and harness.row("c1")["state"] == "running"  # type: ignore[index]

    refs = recover_children(harness.ctx, harness.on_event)  # the next node's recovery
    harness.refs.extend(refs.values())
    adopted = harness.started()
    assert (adopted.child_id, adopted.pid, adopted.adopted) == ("c1", started.pid, True)
    assert stop_child(refs["c1"]).get(timeout=WAIT_S) == Ack()
    exited = harness.exited()
    assert exited.state == "stopped"
    assert exited.proof.reason == REASON_ADOPTED_EXITED and exited.proof.exit_code is None
    assert not is_alive(leader)
