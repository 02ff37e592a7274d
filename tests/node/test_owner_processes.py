"""Issue 11: each owner is its own process with its own socket and database.

Real node processes, real sockets, real SQLite files: kill -9 of one owner process under a
claim storm costs only that owner's in-flight requests; the others answer throughout; the
killed owner is back (a new pid) and every claim it acknowledged is still there. A client
sends straight to the owner's own socket; a version-1 `state.db` is imported once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import zmq

from subagents_node.client.paths import OWNER_SOCKETS, owner_db
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.errors import OwnerUnavailable
from subagents_node.node.node import Node
from subagents_node.node.options import NodeOptions
from tests.support.descriptors import run_python
from tests.support.manage import store_rows
from tests.support.nodes import NodeProcess, new_state_dir, run_cli, running_node
from tests.support.runs import WAIT_S, wait_until
from tests.support.storms import Storm

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def node() -> Iterator[NodeProcess]:
    with running_node() as served:
        yield served


def owner_pids(node: NodeProcess) -> dict[str, int]:
    return {a.name: int(a.pid or 0) for a in node.status().actors if a.state == "running"}


@pytest.mark.parametrize("victim", ["capacity", "session", "supervisor", "fanout"])
def test_kill_9_of_one_owner_under_a_claim_storm_loses_no_acknowledged_claim(
    node: NodeProcess, victim: str
) -> None:
    before = owner_pids(node)
    other = node.client(timeout=5.0)
    claimer = node.client(timeout=2.0)
    budget = claimer.fanout.create(root_run_id=f"storm-{victim}", limit=100_000)
    with Storm(lambda path: claimer.fanout.claim(budget, [path]), "tasks-") as storm:
        storm.wait_acked(50)
        os.kill(before[victim], signal.SIGKILL)
        # The other owners answer while the victim is down or coming back.
        if victim != "capacity":
            assert other.capacity.snapshot(f"s-{victim}").used == 0
        if victim != "session":
            assert other.session.spawn_snapshot(f"s-{victim}") is not None
        back = wait_until(
            lambda: (p := owner_pids(node).get(victim)) and p != before[victim] and p,
            timeout=15,
            what=f"{victim} restarted",
        )
        assert psutil.pid_exists(int(back))
        storm.wait_acked(50)  # the storm goes on after the restart
    stored = {
        str(r[0])
        for r in store_rows(
            node.state_dir,
            "SELECT path FROM fanout_claims WHERE budget_id=?",
            budget.budget_id,
            owner="fanout",
        )
    }
    assert set(storm.acked) <= stored, "an acknowledged claim was lost"
    assert node.alive()
    status = {a.name: a for a in node.status().actors}
    assert status[victim].restarts >= 1 and status[victim].state == "running"
    # Only the victim was restarted.
    for name, pid in before.items():
        if name != victim:
            assert owner_pids(node)[name] == pid


def test_each_owner_keeps_its_own_database_and_socket(node: NodeProcess) -> None:
    pids = owner_pids(node)
    assert set(pids) == set(OWNER_SOCKETS)
    assert len(set(pids.values())) == len(pids), "one process per owner"
    for name, pid in pids.items():
        files = {
            os.readlink(f"/proc/{pid}/fd/{fd}")
            for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith(".db")
        }
        assert files == {str(owner_db(node.state_dir, name))}, f"{name} opens only its own db"
        assert (node.state_dir / OWNER_SOCKETS[name]).is_socket()


def test_design_3_every_socket_in_the_state_dir_is_0600_a_restarted_owners_too(
    node: NodeProcess,
) -> None:
    """DESIGN §3 (sockets 0600) and docs/operations.md: node.sock and each owner's socket,
    whatever the umask the node was started under, and again once an owner is restarted."""

    def modes() -> dict[str, int]:
        return {p.name: p.stat().st_mode & 0o777 for p in node.state_dir.glob("*.sock")}

    assert set(modes()) == {"node.sock", *OWNER_SOCKETS.values()}
    assert modes() == dict.fromkeys(modes(), 0o600)
    before = owner_pids(node)["session"]
    os.kill(before, signal.SIGKILL)
    wait_until(
        lambda: owner_pids(node).get("session") not in (None, before),
        timeout=15,
        what="session restarted",
    )
    assert modes() == dict.fromkeys(modes(), 0o600)


def test_the_owners_inherit_no_library_only_the_node_or_other_processes_use() -> None:
    """Each owner is forked after the node's imports and holds every page of them in its own
    resident size, so a library no owner uses (psutil: the node's pid file and `stop`;
    asyncio and ssl: the async client; bz2 and lzma, which shutil loads: an embedded node's
    temporary state dir, and the run supervisor's own removal of run directories) must load
    after the first forks, or not at all. Its C extension mapped in an owner says it was
    loaded before. (A restarted owner is forked later and may inherit psutil: a fresh node's
    owners are checked.)"""
    libs = ("_psutil_linux", "_asyncio", "_ssl")
    with running_node() as fresh:
        for name, pid in owner_pids(fresh).items():
            maps = Path(f"/proc/{pid}/maps").read_text()
            theirs = () if name == "supervisor" else ("_bz2", "_lzma")
            loaded = [lib for lib in (*libs, *theirs) if lib in maps]
            assert loaded == [], f"the {name} owner holds {loaded}"


def test_the_nodes_serving_code_loads_after_its_owners_are_forked() -> None:
    """What `start` has imported when the node forks its owners is in each owner's resident
    size: the gateway, the forwarder, the relay, the host calls, a home's service and the
    embedding load once the owners are forked (runtime/node/node.py), never before."""
    probe = (
        "import sys, subagents_node.cli.serve, subagents_node.node.node, "
        "subagents_node.node.ownersup, subagents_node.node.noderequests; "
        "print(' '.join(sorted(m for m in sys.modules if m in set(sys.argv[1:]))))"
    )
    later = [
        f"subagents_node.node.{name}"
        for name in ("gateway", "forwarder", "relay", "hostcalls", "home", "embedding")
    ]
    out = subprocess.run(
        [sys.executable, "-c", probe, *later], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []


def test_the_node_writes_psutils_create_time_in_its_pid_file_without_loading_psutil() -> None:
    """Readers compare the pid file's `create_time` with psutil's exactly (a record that does
    not match is a dead node's); the node computes it from /proc the way psutil does."""
    with running_node() as fresh:
        record = json.loads((fresh.state_dir / "node.pid").read_text())
        assert record["create_time"] == psutil.Process(record["pid"]).create_time()
        assert "_psutil_linux" not in Path(f"/proc/{record['pid']}/maps").read_text()


def test_each_owner_name_names_its_actor_class() -> None:
    from subagents_node.node import owners

    assert [owners.actor_class(name).name for name in owners.NAMES] == list(OWNER_SOCKETS)


def test_a_client_sends_straight_to_the_owner_not_through_the_node(node: NodeProcess) -> None:
    client = node.client()
    transport = client.transport
    assert isinstance(transport, ZmqTransport)
    assert transport.endpoint_for("fanout") == f"ipc://{node.state_dir / 'fanout.sock'}"
    assert transport.endpoint_for("node") == node.address
    budget = client.fanout.create(root_run_id="direct", limit=2)
    assert client.fanout.claim(budget, ["a"]).used == 1


def test_a_version_1_state_db_is_imported_by_each_owner_once(tmp_path: Path) -> None:
    """Upgrade from one shared `state.db`: every owner takes its own tables with it."""
    state = new_state_dir()
    with Node.embedded(state_dir=state) as first:
        budget = first.client().fanout.create(root_run_id="v1", limit=5)
        first.client().fanout.claim(budget, ["x", "y"])
    # Rebuild the version-1 layout: one file with every owner's tables.
    v1 = state / "state.db"
    with sqlite3.connect(v1) as conn:
        for name in OWNER_SOCKETS:
            path = owner_db(state, name)
            conn.execute(f"ATTACH DATABASE '{path}' AS src")
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM src.sqlite_master WHERE type='table' "
                    "AND name NOT LIKE 'sqlite_%'"
                )
            ]
            for table in tables:
                if table == "schema_migrations":
                    conn.execute(
                        "CREATE TABLE IF NOT EXISTS schema_migrations "
                        "(family TEXT PRIMARY KEY, version INTEGER NOT NULL)"
                    )
                    conn.execute(
                        "INSERT OR REPLACE INTO schema_migrations "
                        "SELECT * FROM src.schema_migrations"
                    )
                else:
                    conn.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
            conn.commit()
            conn.execute("DETACH DATABASE src")
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
    with Node.embedded(state_dir=state) as second:
        snap = second.client().fanout.snapshot(budget)
        assert snap.used == 2
    assert not v1.exists() and (state / "state.db.v1").exists(), "imported once, kept aside"
    for name in OWNER_SOCKETS:
        assert owner_db(state, name).exists()


def test_an_owner_whose_start_keeps_failing_is_failed_and_the_node_serves_the_others() -> None:
    """Issue 11: a `recover()` or store open that fails is a failed start, retried within the
    owner's restart intensity and then reported `failed` (status --json, doctor); its callers
    get OwnerUnavailable at once; every other owner serves."""
    state = new_state_dir()
    (state / "capacity.db").write_bytes(b"this is not a sqlite database" * 100)
    with running_node(state_dir=state) as node:
        status = run_cli("status", "--json", state_dir=state)
        assert status.returncode == 0, status.stderr
        owners = {a["name"]: a for a in json.loads(status.stdout)["actors"]}
        assert owners["capacity"]["state"] == "failed"
        assert "capacity.db" in owners["capacity"]["reason"]
        assert {owners[n]["state"] for n in ("fanout", "session", "supervisor")} == {"running"}
        client = node.client(timeout=10.0)
        started = time.monotonic()
        with pytest.raises(OwnerUnavailable) as refused:
            client.capacity.snapshot("s-1")
        assert time.monotonic() - started < 5, "refused at once, not after a timeout"
        assert refused.value.details["owner"] == "capacity"
        budget = client.fanout.create(root_run_id="still-serving", limit=2)
        assert client.fanout.claim(budget, ["a"]).used == 1
        doctor = run_cli("doctor", state_dir=state)
        assert doctor.returncode == 1
        assert "[FAIL] owner capacity: failed" in doctor.stdout


def socket_fds(pid: int) -> int:
    fd_dir = Path(f"/proc/{pid}/fd")
    links = []
    for fd in fd_dir.iterdir():
        try:
            links.append(os.readlink(fd))
        except OSError:
            continue  # closed while listed
    return sum(1 for link in links if link.startswith("socket:"))


def test_a_restarted_owner_holds_none_of_the_client_connections_the_node_had(
    node: NodeProcess,
) -> None:
    """An owner is forked from the node, so a restart used to copy every descriptor the node
    held at that moment into the new owner: with 40 clients connected, the new owner held 40
    client connections for its whole life, long after the clients had gone. It keeps only its
    own (and the state dir's claim)."""
    clients = 40
    victim = "session"
    before = owner_pids(node)[victim]
    own = socket_fds(before)
    zctx = zmq.Context()
    try:
        peers = [zctx.socket(zmq.DEALER) for _ in range(clients)]
        for peer in peers:
            peer.connect(node.address)
        wait_until(
            lambda: socket_fds(node.pid) >= clients,
            timeout=15,
            what="the node accepted every client",
        )
        os.kill(before, signal.SIGKILL)
        wait_until(
            lambda: owner_pids(node).get(victim) not in (None, 0, before),
            timeout=15,
            what=f"{victim} restarted",
        )
        for peer in peers:
            peer.close(linger=0)
    finally:
        zctx.term()
    after = owner_pids(node)[victim]
    assert socket_fds(after) <= own + 4, (socket_fds(after), own)  # its own links at most
    assert node.client().session.status("restarted-owner").active == 0  # and it serves


def test_an_owner_is_never_shown_running_without_a_process() -> None:
    """Between the reap of a killed owner and the fork of its successor the node's status showed
    it `running` with no pid: a caller that waited for "running again" (CI did) went on while
    the owner was still down. Status is read here as fast as the node can answer it, in its own
    process, through kill -9s: at least five, and more (at most 30) until a read has landed in
    that window at least once (on a loaded machine the reader may sleep through a few)."""
    state_dir = new_state_dir()
    node = Node(NodeOptions(state_dir=state_dir, restart_max=100, restart_window_s=60.0))
    node.start()
    seen: list[tuple[str, int | None]] = []
    try:
        for kills in range(30):
            if kills >= 5 and ("restarting", None) in seen:
                break
            before = {a.name: a.pid for a in node.owner_statuses()}["fanout"]
            assert before is not None
            os.kill(before, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                now = {a.name: a for a in node.owner_statuses()}["fanout"]
                seen.append((now.state, now.pid))
                if now.state == "running" and now.pid not in (None, before):
                    break
            else:
                pytest.fail("fanout was not restarted")
        client = node.client()
        budget = client.fanout.create(root_run_id="after-five-kills", limit=1)
        assert client.fanout.claim(budget, ["a"]).used == 1  # and it serves
    finally:
        node.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
    assert ("running", None) not in seen
    assert ("restarting", None) in seen  # the window was read: the test can see the fault


def test_an_owner_reaped_by_the_embedding_program_is_not_said_to_have_exited_with_status_0() -> (
    None
):
    """A program that embeds the node and ignores SIGCHLD (or reaps every child itself) takes
    an owner's exit status before the node can: the node's log said "owner capacity (pid N)
    exited with status 0" of an owner killed with -9. It now says the status went elsewhere."""
    script = f"""
import logging, os, signal, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps every child at once
logging.basicConfig(stream=sys.stdout, level=logging.ERROR, format="%(message)s")
from subagents_node.node.node import Node
from tests.support.runs import WAIT_S, wait_until
with Node.embedded() as node:  # its own temporary state dir, removed afterwards
    [capacity] = [a for a in node.owner_statuses() if a.name == "capacity"]
    os.kill(capacity.pid, signal.SIGKILL)
    restarted = lambda: [a.restarts for a in node.owner_statuses() if a.name == "capacity"]
    wait_until(lambda: restarted() == [1], {WAIT_S}, what="the capacity owner's restart")
    print("served", node.client().capacity.snapshot("s", 1).used)
"""
    done = run_python(script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "served 0" in done.stdout
    said = [line for line in done.stdout.splitlines() if line.startswith("owner capacity")]
    assert said and "exit status was collected by another waiter" in said[0], done.stdout
    assert "exited with status 0" not in done.stdout
