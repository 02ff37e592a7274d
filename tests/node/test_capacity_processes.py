"""Capacity across real OS processes: a detached node, many client processes, and kill -9.

- INV-CAP-1/2 under contention: 16 processes race for 4 slots of one session. Each records the
  monotonic time right after the node acknowledged its grant and right before it asked for the
  release, so every recorded interval lies inside the node's own grant..release interval; at
  most 4 of them may overlap, and two intervals on one slot index never overlap.
- R-CAP-7 and §0.4: after kill -9 of the node, acknowledged slots are all there; started slots
  still count and can be released; unstarted ones expire by their TTL, never before.
- R-CAP-11: kill -9 of the capacity owner in the middle of a stream of acquires leaves no
  counted slot without its complete owner record.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from subagents_node import Client, connect
from subagents_node.client.paths import read_pid_file
from subagents_node.messages.capacity import RunnerProof
from tests.support.manage import store_rows
from tests.support.nodes import running_node, short_dir
from tests.support.runs import wait_until
from tests.support.storms import Storm

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SESSION = "race"
LIMIT = 4
WORKERS = 16
GRANTS_PER_WORKER = 4

_WORKER = r"""
import json, random, sys, threading, time
from subagents_node.messages.capacity import RunnerProof
from subagents_node.messages.errors import CapacityExhausted
from subagents_node import connect

address, session, limit, grants, name = sys.argv[1:6]
limit, grants = int(limit), int(grants)
client = connect(address, timeout=20)
client.ping()
pause = threading.Event()
print("ready", flush=True)
sys.stdin.readline()  # the start line: every worker begins at once
for n in range(grants):
    run_id = f"{name}-{n}"
    refused = 0
    while True:
        try:
            handle = client.capacity.acquire(session_id=session, limit=limit, run_id=run_id)
            break
        except CapacityExhausted:
            refused += 1
            pause.wait(random.uniform(0.001, 0.004))
    acquired = time.monotonic()  # after the node's acknowledgement
    pause.wait(random.uniform(0.005, 0.015))
    released = time.monotonic()  # before the release request
    if n % 2:
        ok = handle.rollback()
    else:
        runner = f"runner-{run_id}"
        handle.mark_started(runner_id=runner)
        proof = RunnerProof(state="observed", runner_id=runner, exit_code=0)
        verdict = client.capacity.report_terminal(session, run_id, "complete", proof=proof)
        ok = verdict.verdict == "releasable"
    print(json.dumps({"slot": handle.slot, "acquired": acquired, "released": released,
                      "ok": ok, "refused": refused}), flush=True)
client.close()
"""


# -- a detached node ------------------------------------------------------------------------


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


class DetachedNode:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def start(self) -> DetachedNode:
        try:
            _cli(self.state_dir, "start", "--detach")
        except subprocess.CalledProcessError as exc:
            log = self.state_dir / "node.log"
            detail = log.read_text() if log.exists() else "(no node.log)"
            raise AssertionError(f"start --detach failed: {exc.stderr}\n{detail}") from None
        return self

    @property
    def record(self) -> dict[str, Any]:
        record = read_pid_file(self.state_dir)
        assert record is not None, "no node serves the state dir"
        return record

    def client(self) -> Client:
        return connect(str(self.record["address"]), timeout=20)

    def kill(self) -> None:
        """kill -9: no shutdown code runs, nothing is flushed beyond what was committed."""
        pid = int(self.record["pid"])
        os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: not _alive(pid))

    def stop(self) -> None:
        if read_pid_file(self.state_dir) is not None:
            _cli(self.state_dir, "stop")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        pause.wait(0.02)


@pytest.fixture
def detached() -> Iterator[DetachedNode]:
    state_dir = short_dir()
    node = DetachedNode(state_dir)
    try:
        yield node.start()
    finally:
        node.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


# -- the race -------------------------------------------------------------------------------


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals holding at one instant (a release at t ends before a grant at t)."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(r, -1) for _, r in intervals])
    held = peak = 0
    for _, step in edges:
        held += step
        peak = max(peak, held)
    return peak


@pytest.mark.slow
def test_inv_cap_1_inv_cap_2_sixteen_processes_never_hold_more_than_the_limit(
    detached: DetachedNode,
) -> None:
    address = str(detached.record["address"])
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WORKER,
                address,
                SESSION,
                str(LIMIT),
                str(GRANTS_PER_WORKER),
                f"w{i}",
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WORKERS)
    ]
    for worker in workers:  # a start barrier: all are connected before any acquires
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready", worker.stderr
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    grants: list[dict[str, Any]] = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        grants += [json.loads(line) for line in out.splitlines()]

    assert len(grants) == WORKERS * GRANTS_PER_WORKER
    assert all(g["ok"] for g in grants), "every release was acknowledged"
    intervals = [(g["acquired"], g["released"]) for g in grants]
    peak = _max_overlap(intervals)
    assert peak <= LIMIT, f"{peak} processes held a slot at once"
    assert peak >= 2, "the workers never held slots at the same time: no race was tested"
    for slot in range(LIMIT):
        on_slot = [(g["acquired"], g["released"]) for g in grants if g["slot"] == slot]
        assert _max_overlap(on_slot) <= 1, f"slot {slot} had two owners at once"
    assert {g["slot"] for g in grants} <= set(range(LIMIT))
    with detached.client() as client:
        assert client.capacity.snapshot(SESSION, LIMIT).used == 0


# -- durability -----------------------------------------------------------------------------


def test_r_cap_7_kill_9_keeps_every_acknowledged_slot_and_ttl_still_applies(
    detached: DetachedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unstarted slots expire after the restart, each at its own deadline but no sooner than
    one TTL (1 s here) from the restart: the restarted node may owe their starts."""
    with detached.client() as client:
        running = client.capacity.acquire(session_id="s", limit=5, run_id="running")
        assert running is not None
        running.mark_started(runner_id="runner-1", pid=1234, process_start_time=5.0)
        for run_id, ttl in (("short", 0.5), ("medium", 3.0), ("long", 600.0)):
            assert client.capacity.acquire(session_id="s", limit=5, run_id=run_id, ttl_s=ttl)
        deadlines = {
            run_id: client.capacity.inspect(run_id).owner.expires_at  # type: ignore[union-attr]
            for run_id in ("short", "medium")
        }
        wires = {run_id: client.capacity.inspect(run_id).owner.handle() for run_id in ("long",)}  # type: ignore[union-attr]

    detached.kill()
    monkeypatch.setenv("SUBAGENTS_RESERVATION_TTL_S", "1")
    restarted = time.time()
    detached.start()

    with detached.client() as client:
        gone: dict[str, float] = {}

        def expired() -> bool:
            for run_id in deadlines:
                if run_id not in gone and client.capacity.inspect(run_id).relation == "none":
                    gone[run_id] = time.time()
            return len(gone) == len(deadlines)

        _wait_for(expired)
        for run_id, deadline in deadlines.items():
            assert deadline is not None and gone[run_id] >= deadline, f"{run_id} expired early"
            assert gone[run_id] >= restarted + 1.0, f"{run_id} expired within a TTL of the restart"
        owner = client.capacity.inspect("running").owner
        assert owner is not None and (owner.runner_id, owner.pid) == ("runner-1", 1234)
        assert client.capacity.snapshot("s").used == 2
        assert client.capacity.handle(wires["long"]).rollback() is True
        proof = RunnerProof(state="observed", runner_id="runner-1", pid=1234)
        verdict = client.capacity.report_terminal("s", "running", "complete", proof=proof)
        assert verdict.verdict == "releasable"
        assert client.capacity.snapshot("s").used == 0


def test_r_cap_11_kill_9_of_the_owner_mid_acquire_leaves_no_slot_without_its_record() -> None:
    """kill -9 of the capacity owner while acquires stream in: after its restart every
    acknowledged slot is there, every counted slot has its complete owner record (so it can be
    inspected and rolled back), and rolling them all back leaves the pool at 0: no slot is
    counted that nobody can release (the original's crash between mkdir and the owner write)."""
    with running_node() as node:
        before = {a.name: int(a.pid or 0) for a in node.status().actors}
        storm_client = node.client(timeout=2.0)

        def acquire(run_id: str) -> None:
            storm_client.capacity.acquire("atomic", 100_000, run_id, ttl_s=600.0)

        with Storm(acquire, "storm-") as storm:
            storm.wait_acked(50)
            os.kill(before["capacity"], signal.SIGKILL)
            wait_until(
                lambda: any(
                    a.name == "capacity" and a.state == "running" and a.pid != before["capacity"]
                    for a in node.status().actors
                ),
                timeout=15,
                what="the capacity owner restarted",
            )
            storm.wait_acked(20)  # acquires go on after the restart
        client = node.client(timeout=10.0)
        rows = store_rows(
            node.state_dir,
            "SELECT run_id FROM capacity_slots WHERE session_id=?",
            "atomic",
            owner="capacity",
        )
        stored = {str(r[0]) for r in rows}
        assert set(storm.acked) <= stored, "an acknowledged slot was lost"
        assert stored <= set(storm.acked) | set(storm.unknown)
        assert client.capacity.snapshot("atomic").used == len(stored)
        for run_id in stored:
            owner = client.capacity.inspect(run_id, "atomic").owner
            assert owner is not None and owner.run_id == run_id and owner.token
            assert client.capacity.handle(owner.handle()).rollback() is True, run_id
        assert client.capacity.snapshot("atomic").used == 0
