"""The fan-out budget across real OS processes: a detached node, client processes racing on its
socket, and `kill -9` of the node in the middle of a claim storm (R-FAN-13, INV-FAN-3, §0.4)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from subagents_node.client.paths import owner_db
from subagents_node.messages.errors import FanoutLimitExceeded, FanoutReservationExpired
from subagents_node.messages.fanout import encode_descriptor
from tests.support.nodes import NodeProcess
from tests.support.runs import wait_until

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]

#: Claims single paths until told to stop; reports how many were admitted and refused.
RACE_WORKER = r"""
import json, sys
from subagents_node.messages.errors import FanoutLimitExceeded
from subagents_node.client.client import connect

address, descriptor, label, attempts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = connect(address, timeout=30)
client.ping()
print("ready", flush=True)
sys.stdin.readline()
admitted = refused = 0
for i in range(attempts):
    try:
        client.fanout.claim(descriptor, [f"{label}[{i}]"])
        admitted += 1
    except FanoutLimitExceeded:
        refused += 1
print(json.dumps({"admitted": admitted, "refused": refused}), flush=True)
"""

#: Claims one path after another and prints each path once its claim is acknowledged; stops at
#: the first error (the node was killed).
STORM_WORKER = r"""
import sys
from subagents_node.messages.errors import SubagentsError
from subagents_node.client.client import connect

address, descriptor, label = sys.argv[1], sys.argv[2], sys.argv[3]
client = connect(address, timeout=2)
i = 0
while True:
    path = f"{label}[{i}]"
    try:
        client.fanout.claim(descriptor, [path])
    except SubagentsError as err:
        print("stopped", type(err).__name__, flush=True)
        break
    print(path, flush=True)
    i += 1
"""


def rows(node: NodeProcess, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """Read the owner's tables from outside, read-only (the node is stopped by then)."""
    with sqlite3.connect(f"file:{owner_db(node.state_dir, 'fanout')}?mode=ro", uri=True) as conn:
        return [tuple(row) for row in conn.execute(sql, args)]


def stop(node: NodeProcess) -> None:
    done = node.stop()
    assert done.returncode == 0, done.stderr


@pytest.fixture
def node(start_node: Callable[..., NodeProcess]) -> NodeProcess:
    """A detached node (`start --detach`), stopped or killed at teardown by conftest."""
    return start_node()


def spawn(script: str, *args: str, stdin: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_r_fan_13_inv_fan_3_sixteen_processes_racing_single_claims_admit_exactly_the_limit(
    node: NodeProcess,
) -> None:
    with node.client() as client:
        desc = client.fanout.create("race", 100)
    encoded = encode_descriptor(desc)
    workers = [spawn(RACE_WORKER, node.address, encoded, f"w{i}", "10") for i in range(16)]
    for worker in workers:  # every worker is connected before any of them claims
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["admitted"] for r in reports) == 100
    assert sum(r["refused"] for r in reports) == 60
    with node.client() as client:
        assert client.fanout.snapshot(desc).used == 100
    stop(node)
    assert rows(node, "SELECT COUNT(*) FROM fanout_claims WHERE budget_id = ?", desc.budget_id) == [
        (100,)
    ]


class AckReader:
    """Collects the paths each storm worker printed as acknowledged, and wakes a waiter."""

    def __init__(self, workers: list[subprocess.Popen[str]]) -> None:
        self.acked: list[list[str]] = [[] for _ in workers]
        self.stopped: list[str] = ["" for _ in workers]
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._read, args=(i, w), daemon=True)
            for i, w in enumerate(workers)
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, index: int, worker: subprocess.Popen[str]) -> None:
        assert worker.stdout is not None
        for line in worker.stdout:
            with self._cond:
                if line.startswith("stopped"):
                    self.stopped[index] = line.strip()
                else:
                    self.acked[index].append(line.strip())
                self._cond.notify_all()

    def wait_for_each(self, count: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: all(len(a) >= count for a in self.acked), timeout)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=30)


@pytest.mark.slow
def test_inv_fan_5_acked_claims_survive_kill_9_and_a_pending_reservation_expires_after_restart(
    node: NodeProcess,
) -> None:
    with node.client() as client:
        desc = client.fanout.create("storm", 1_000_000)
        held = client.fanout.reserve(desc, ["held[0]", "held[1]"], ttl_s=3600)
        encoded = encode_descriptor(desc)
        workers = [
            spawn(STORM_WORKER, node.address, encoded, f"w{i}", stdin=subprocess.DEVNULL)
            for i in range(4)
        ]
        reader = AckReader(workers)
        assert reader.wait_for_each(25, timeout=60), "the storm did not get going"
        short = client.fanout.reserve(desc, ["short[0]", "short[1]", "short[2]"], ttl_s=0.3)
        node.kill()
    for worker in workers:
        worker.wait(timeout=30)
    reader.join()
    for worker in workers:
        assert worker.stdout is not None and worker.stderr is not None
        worker.stdout.close()
        errors = worker.stderr.read()
        worker.stderr.close()
        assert worker.returncode == 0, errors
    assert all(s.startswith("stopped Node") for s in reader.stopped), reader.stopped
    acked = {path for paths in reader.acked for path in paths}

    # The short reservation was pending at the crash; its deadline passes while the node is down.
    threading.Event().wait(max(0.0, short.expires_at - time.time()))
    node.start()
    with node.client() as client:
        with pytest.raises(FanoutReservationExpired) as caught:
            client.fanout.commit(short.reservation_id)
        assert caught.value.state == "expired"
        client.fanout.commit(held.reservation_id)
        used = client.fanout.snapshot(desc).used
    stop(node)

    stored = {str(p) for (p,) in rows(node, "SELECT path FROM fanout_claims")}
    assert acked <= stored, "an acknowledged claim was lost"
    assert {"held[0]", "held[1]"} <= stored
    assert not any(p.startswith("short[") for p in stored)
    assert rows(node, "SELECT used FROM fanout_budgets WHERE budget_id = ?", desc.budget_id) == [
        (used,)
    ]
    assert used == len(stored) >= len(acked) + 2
    states = dict(rows(node, "SELECT reservation_id, state FROM fanout_reservations"))
    assert states == {held.reservation_id: "committed", short.reservation_id: "expired"}
    assert rows(node, "PRAGMA integrity_check") == [("ok",)]


def test_r_fan_15_the_node_compacts_an_idle_trees_claim_rows_and_keeps_its_count(
    start_node: Callable[..., NodeProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_retention_days` reaches the fan-out owner process: with a retention of one second,
    a budget that stops claiming loses its claim rows on the owner's own timer, and its count
    still refuses what would not have fitted."""
    monkeypatch.setenv("SUBAGENTS_RUN_RETENTION_DAYS", str(1 / 86_400))
    node = start_node()
    with node.client() as client:
        desc = client.fanout.create("idle-tree", 4)
        client.fanout.claim(desc, ["a", "b", "c"])

        def compacted() -> bool:
            return rows(
                node,
                "SELECT COUNT(*) FROM fanout_budgets WHERE budget_id = ? "
                "AND claims_compacted_at IS NOT NULL",
                desc.budget_id,
            ) == [(1,)]

        wait_until(compacted, timeout=30, what="the idle budget's claims compacted")
        assert client.fanout.snapshot(desc).used == 3
        with pytest.raises(FanoutLimitExceeded):
            client.fanout.claim(desc, ["d", "e"])
    stop(node)
    assert rows(node, "SELECT COUNT(*) FROM fanout_claims WHERE budget_id = ?", desc.budget_id) == [
        (0,)
    ]
