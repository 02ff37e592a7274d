"""Multi-host (issue 13, DESIGN §1 "Multi-host"): a home node owns the ledgers, worker nodes run
the children, every link between nodes is tcp + CURVE.

The fleet tests run twice: on loopback (every node a process on this host, each with its own
state dir) and on "hosts" (one network namespace per node, made by the test, with addresses
that exist only inside them; skipped, saying why, when namespaces cannot be made). The tests
that probe the home's tcp socket from this process run on loopback only. Nodes are started
and asked through the real CLI and sockets; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Ack
from subagents_node.messages.errors import BadRequest, NodeTimeout, OwnerUnavailable
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.keys import AllowedKeys, KeysList
from subagents_node.messages.node import Shutdown
from subagents_node.node.node import Node
from tests.support.fleet import EXAMPLE_AGENTS, PLACES, Fleet, fleet_on
from tests.support.nodes import CLI, REPO, NodeProcess, run_cli
from tests.support.runs import stop_process, wait_until

pytestmark = pytest.mark.slow

WORKERS = ("w1", "w2", "w3")
#: Workers a test adds for itself (it kills, stops or forgets them).
SPARE = ("wk", "wf", "w8", "w9", "wd")
EXAMPLES = str(EXAMPLE_AGENTS)


@pytest.fixture(scope="module", params=PLACES)
def crew(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """A home and three workers, on loopback or each in its own network namespace, shared by
    the module's tests (a test that kills or forgets a worker adds its own)."""
    with fleet_on(request.param, WORKERS, SPARE) as started:
        yield started


def run_cli_on(node: NodeProcess, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`argv` run on `node`'s host (its namespaces), to completion."""
    return subprocess.run(
        [*node.prefix, *argv], capture_output=True, text=True, timeout=30, check=False
    )


def _session() -> str:
    return f"mh-{uuid.uuid4().hex[:8]}"


def _run_id(out: str) -> str:
    return out.strip().splitlines()[0].strip()


def _used(crew: Fleet, session: str, limit: int) -> int:
    return crew.client(crew.home).capacity.snapshot(session, limit).used


@pytest.fixture(autouse=True)
def _fleet_joined(crew: Fleet) -> None:
    """Each test starts with every worker joined (a test before may have cut the home off)."""
    for name in WORKERS:
        node = crew.workers[name]
        wait_until(
            lambda node=node: (c := node.status().cluster) is not None and c.state == "joined",
            what=f"{name} joined",
        )


def _all_up(crew: Fleet) -> bool:
    views = crew.nodes()
    return all(views[n].state == "up" and views[n].last_heartbeat for n in WORKERS)


# -- membership ----------------------------------------------------------------------------------


def test_workers_join_the_home_and_nodes_lists_each_up_with_its_heartbeat(crew: Fleet) -> None:
    wait_until(lambda: _all_up(crew), what="every worker up")
    views = crew.nodes()
    assert (views["home"].role, views["home"].state) == ("home", "up")
    assert all(views[n].role == "worker" and views[n].generation >= 1 for n in WORKERS)

    code, out, err = crew.cli(crew.home, "nodes", "--json")
    assert code == 0, err
    listed = {n["name"]: n for n in json.loads(out)["nodes"]}
    assert {"home", *WORKERS} <= set(listed)
    code, out, _ = crew.cli(crew.home, "nodes")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["NAME", "ROLE", "STATE"]

    status = crew.workers["w1"].status()
    assert status.cluster is not None
    assert (status.cluster.role, status.cluster.name, status.cluster.state) == (
        "worker",
        "w1",
        "joined",
    )
    assert [a.name for a in status.actors] == ["supervisor"]  # the ledgers are the home's
    home = crew.home.status().cluster
    assert home is not None and home.role == "home" and home.public_key == crew.home_key


def test_on_namespaced_hosts_no_node_sees_another_nodes_files(crew: Fleet) -> None:
    if crew.isolation is None:
        pytest.skip("on loopback every node shares this host's files")
    probe = "import os, sys; print(*(os.path.exists(p) for p in sys.argv[1:]))"
    paths = [str(n.state_dir / "addressbook.json") for n in (crew.home, *crew.workers.values())]
    for index, name in enumerate(["home", *WORKERS]):
        node = crew.home if name == "home" else crew.workers[name]
        done = run_cli_on(node, [sys.executable, "-c", probe, *paths])
        seen = done.stdout.split()
        assert seen == ["True" if i == index else "False" for i in range(len(paths))], (
            name,
            done.stdout,
            done.stderr,
        )


def test_the_homes_ledger_owners_each_listen_on_tcp_and_workers_send_admissions_straight_there(
    crew: Fleet,
) -> None:
    book = json.loads((crew.home.state_dir / "addressbook.json").read_text())
    host, _, port = crew.endpoint.rpartition(":")
    owners = {"capacity": 1, "fanout": 2, "session": 3}
    assert book["home"]["owners"] == {n: f"{host}:{int(port) + d}" for n, d in owners.items()}
    assert book["home"]["public_key"] == crew.home_key
    for name in WORKERS:
        worker = json.loads((crew.workers[name].state_dir / "addressbook.json").read_text())
        routes = {n: worker["owners"][n]["endpoint"] for n in owners}
        assert routes == book["home"]["owners"]  # no hop through the home node's gateway
    session = _session()
    handle = crew.client(crew.workers["w2"]).capacity.acquire(session, 2, f"r-{session}")
    assert handle is not None
    held = crew.client(crew.home).capacity.hosts()
    assert {h.host: h.reserved for h in held.hosts}.get("w2") == 1  # the owner stamped it
    assert handle.rollback()


def test_a_join_with_a_key_the_home_never_allowed_is_refused_and_the_worker_does_not_start(
    crew: Fleet,
) -> None:
    stranger = crew.add_worker("w9", allow=False, start=False)
    done = run_cli(
        "start",
        "--detach",
        *crew.worker_args("w9"),
        state_dir=stranger.state_dir,
        prefix=stranger.prefix,
    )
    code, err = done.returncode, done.stderr
    assert code != 0
    assert "refused this client's CURVE key" in err
    assert "w9" not in crew.nodes()


def test_a_join_with_a_revoked_key_is_refused(crew: Fleet) -> None:
    late = crew.add_worker("w8", start=False)
    code, _, err = crew.cli(crew.home, "keys", "revoke", "w8")
    assert code == 0, err
    done = run_cli(
        "start", "--detach", *crew.worker_args("w8"), state_dir=late.state_dir, prefix=late.prefix
    )
    assert done.returncode != 0 and "refused this client's CURVE key" in done.stderr


# -- admission across hosts ------------------------------------------------------------------


def test_one_sessions_capacity_limit_2_admits_exactly_2_of_3_runs_launched_on_three_workers(
    crew: Fleet,
) -> None:
    session = _session()
    results: dict[str, tuple[int, str, str]] = {}

    def launch(name: str) -> None:
        results[name] = crew.run_background(crew.workers[name], session, "seconds=60", limit=2)

    threads = [threading.Thread(target=launch, args=(n,)) for n in WORKERS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    admitted = sorted(n for n, (code, _, _) in results.items() if code == 0)
    refused = [n for n, (code, _, _) in results.items() if code != 0]
    assert len(admitted) == 2 and len(refused) == 1, results
    assert "capacity exhausted: 2/2 used" in results[refused[0]][2]
    assert _used(crew, session, 2) == 2
    held = crew.nodes()
    assert [held[n].slots for n in admitted] == [1, 1]
    assert held[refused[0]].slots == 0
    for name in admitted:  # each run lives on the worker it was launched on
        code, out, _ = crew.cli(crew.workers[name], "runs", "--json")
        assert code == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == [
            _run_id(results[name][1])
        ]
        code, _, err = crew.cli(crew.workers[name], "stop", _run_id(results[name][1]))
        assert code == 0, err
    wait_until(lambda: _used(crew, session, 2) == 0, what="both slots released after stop")


_CROSS_LAUNCH = """\
import os, re, sys
task = " ".join(sys.argv[1:])
depth = int(re.search(r"depth=(\\d+)", task).group(1))
workers = os.environ["MH_WORKERS"].split(",")
host = workers[depth % len(workers)]
os.execv(sys.executable, [sys.executable, "-m", "subagents_node", "run", "--on", host,
         *sys.argv[1:]])
"""


def test_a_run_tree_recursing_across_workers_is_admitted_against_one_fanout_budget_at_the_home(
    crew: Fleet, tmp_path: Path
) -> None:
    """depth=2 width=4 asks for 1 + 4 + 16 launches; the tree's budget of 8 admits exactly 8,
    whichever worker each launch goes to. The root on w1 places its children on w2 (`run --on`
    inside a run, carried by the home over the workers' own connections); a run placed on
    another host gets that host's environment, not its launcher's, so their own children
    (without the wrapper) run where they are, on w2."""
    wrapper = tmp_path / "cross.py"
    wrapper.write_text(_CROSS_LAUNCH)
    w1, w2, w3 = (crew.workers[n] for n in WORKERS)
    env = {
        "SUBAGENTS_MAX_DEPTH": "4",
        "SUBAGENTS_MAX_SPAWNS_PER_RUN": "8",
        "SUBAGENTS_LAUNCH": json.dumps([sys.executable, str(wrapper)]),
        "MH_WORKERS": "w2",
    }
    os.environ.update(env)  # the CLI below resolves its launch from its environment
    try:
        code, out, err = crew.run_background(w1, _session(), "depth=2 width=4", agent="recursive")
    finally:
        for name in env:
            del os.environ[name]
    assert code == 0, err
    run_id = _run_id(out)
    done = wait_until(
        lambda: (v := crew.client(w1).runs.show(run_id)).state in ("complete", "failed") and v,
        timeout=180,
        what="the recursive run settles",
    )
    assert done.state == "complete", done.error
    budget = crew.client(crew.home).fanout.snapshot(decode_descriptor(done.fanout_descriptor))
    assert (budget.used, budget.limit, budget.remaining) == (8, 8, 0)
    on = {
        name: len(crew.client(w).runs.list(root_run_id=done.root_run_id))
        for name, w in (("w1", w1), ("w2", w2), ("w3", w3))
    }
    assert on == {"w1": 1, "w2": 7, "w3": 0}, on


# -- loss, forget and fencing ------------------------------------------------------------------


def test_a_killed_worker_keeps_its_slots_until_nodes_forget_releases_them_and_fences_it(
    crew: Fleet,
) -> None:
    session = _session()
    w2 = crew.add_worker("wk")
    code, out, err = crew.run_background(w2, session, "seconds=60", limit=3)
    assert code == 0, err
    run_id = _run_id(out)
    assert _used(crew, session, 3) == 1
    w2.kill()
    wait_until(lambda: crew.nodes()["wk"].state == "unreachable", what="wk unreachable")
    assert crew.nodes()["wk"].slots == 1
    assert _used(crew, session, 3) == 1  # held: nothing proved its run's tree ended

    code, out, err = crew.cli(crew.home, "nodes", "forget", "wk", "--reason", "disk died")
    assert code == 0, err
    assert f"released 1 slot: {run_id}" in out
    assert _used(crew, session, 3) == 0
    lost = crew.nodes()["wk"]
    assert (lost.state, lost.forget_reason, lost.slots) == ("lost", "disk died", 0)
    releases = crew.client(crew.home).capacity.releases(host="wk").releases
    assert [(r.host, r.run_id, r.proof_state) for r in releases] == [("wk", run_id, "operator")]

    # Started again, wk joins again (a new generation). The run it adopts asks for its slot
    # again and finds it released by the operator: it may not run past the session's limit
    # without one, so it is stopped; its late reports change nothing at the home.
    w2.start()
    wait_until(lambda: crew.nodes()["wk"].state == "up", what="wk joined again")
    assert crew.nodes()["wk"].generation > lost.generation
    wait_until(lambda: crew.client(w2).runs.show(run_id).state != "running", what="its run ends")
    ended = crew.client(w2).runs.show(run_id)
    assert ended.state == "failed" and "capacity slot was lost" in (ended.error or ""), ended
    assert _used(crew, session, 3) == 0


def test_a_forgotten_worker_that_was_only_partitioned_is_fenced_when_it_comes_back(
    crew: Fleet,
) -> None:
    w3 = crew.add_worker("wf")
    os.kill(w3.pid, signal.SIGSTOP)  # silent, but alive: it will come back with its old state
    try:
        wait_until(lambda: crew.nodes()["wf"].state == "unreachable", what="wf unreachable")
        code, _, err = crew.cli(crew.home, "nodes", "forget", "wf", "--reason", "gone quiet")
        assert code == 0, err
    finally:
        os.kill(w3.pid, signal.SIGCONT)
    wait_until(
        lambda: (c := w3.status().cluster) is not None and c.state == "fenced",
        what="wf learns it is fenced",
    )
    code, _, err = crew.run_background(w3, _session(), "seconds=1", limit=1)
    assert code != 0 and "forgotten by the home's operator" in err
    assert crew.nodes()["wf"].state == "lost"


# -- the home unreachable -------------------------------------------------------------------------


def _cut_home(crew: Fleet) -> Callable[[], None]:
    """Make the home unreachable (its link down on hosts, stopped on loopback); the undo."""
    fabric = crew.fabric
    if fabric is not None:
        fabric.link_down("home")
        return lambda: fabric.link_up("home")
    stop_process(crew.home.pid)
    return lambda: os.kill(crew.home.pid, signal.SIGCONT)


def test_while_the_home_is_unreachable_admissions_fail_closed_at_once_and_children_keep_running(
    crew: Fleet,
) -> None:
    session = _session()
    w1 = crew.workers["w1"]
    code, out, err = crew.run_background(w1, session, "seconds=3", limit=5)
    assert code == 0, err
    run_id = _run_id(out)
    assert _used(crew, session, 5) == 1
    undo = _cut_home(crew)
    try:
        wait_until(
            lambda: (c := w1.status().cluster) is not None and c.state == "unreachable",
            what="w1 sees its home unreachable",
        )
        began = time.monotonic()
        code, _, err = crew.run_background(w1, session, "seconds=1", limit=5)
        assert code != 0 and "cannot reach" in err, err
        assert time.monotonic() - began < 5.0  # fails closed, never a long hang
        # The child runs on, and its end is recorded on the worker while the home is away.
        view = wait_until(
            lambda: (v := crew.client(w1).runs.show(run_id)).state == "complete" and v,
            what="the child completes while the home is away",
        )
        assert view.children[0].exit_code == 0
        # `show` on the worker still shows its own run; the home's ledgers are unknown.
        code, out, err = crew.cli(w1, "show", run_id)
        assert code == 0, err
        assert "Spawn budget and active async capacity: unknown" in out and "complete" in out
    finally:
        undo()
    wait_until(
        lambda: (c := w1.status().cluster) is not None and c.state == "joined", what="w1 back"
    )
    # Its report reaches the home when it is back: the slot is released, once.
    wait_until(lambda: _used(crew, session, 5) == 0, what="the slot released by the replay")


def test_a_partition_during_a_claim_storm_fails_claims_closed_and_leaves_the_budget_exact(
    crew: Fleet,
) -> None:
    """Three workers claim fan-out units on one budget as fast as they can; the home is cut off
    and brought back. Claims then fail closed quickly, and afterwards the home's count is every
    acknowledged claim plus at most those whose outcome was unknown (in flight at the cut)."""
    descriptor = crew.client(crew.workers["w1"]).fanout.create(f"storm-{uuid.uuid4().hex}", 10**6)
    stop = threading.Event()
    acked = {n: 0 for n in WORKERS}
    unknown = {n: 0 for n in WORKERS}
    closed: list[float] = []  # seconds a fail-closed refusal took

    def storm(name: str) -> None:
        client = Client(ZmqTransport(crew.workers[name].address), timeout=10.0)
        try:
            seq = 0
            while not stop.is_set():
                seq += 1
                began = time.monotonic()
                try:
                    client.fanout.claim(descriptor, [f"{name}/{seq}"])
                    acked[name] += 1
                except OwnerUnavailable as err:
                    if err.details.get("reason") == "home_unreachable":
                        closed.append(time.monotonic() - began)
                    else:
                        unknown[name] += 1  # lost in flight: applied or not
                except NodeTimeout:
                    unknown[name] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=storm, args=(n,)) for n in WORKERS]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: sum(acked.values()) >= 30, what="the storm under way")
        undo = _cut_home(crew)
        try:
            wait_until(lambda: len(closed) >= 30, what="claims failing closed")
        finally:
            undo()
        before = sum(acked.values())
        wait_until(lambda: sum(acked.values()) >= before + 30, what="claims admitted again")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert max(closed) < 1.0, sorted(closed)[-5:]
    used = crew.client(crew.home).fanout.snapshot(descriptor).used
    assert sum(acked.values()) <= used <= sum(acked.values()) + sum(unknown.values())


def test_a_home_killed_with_9_loses_no_admission_and_takes_its_workers_back(crew: Fleet) -> None:
    session = _session()
    w1 = crew.workers["w1"]
    code, out, err = crew.run_background(w1, session, "seconds=60", limit=4)
    assert code == 0, err
    run_id = _run_id(out)
    descriptor = crew.client(w1).fanout.create(f"kill-{uuid.uuid4().hex}", 10)
    crew.client(w1).fanout.claim(descriptor, ["a", "b", "c"])
    crew.close_client(crew.home)
    crew.home.kill()
    wait_until(
        lambda: (c := w1.status().cluster) is not None and c.state == "unreachable",
        what="w1 sees its home gone",
    )
    crew.home.start()
    wait_until(lambda: _all_up(crew), what="every worker heartbeating the new home")
    wait_until(
        lambda: (c := w1.status().cluster) is not None and c.state == "joined",
        what="w1 sees its home back",
    )
    assert _used(crew, session, 4) == 1
    assert crew.client(w1).fanout.snapshot(descriptor).used == 3
    assert crew.client(w1).fanout.claim(descriptor, ["d"]).used == 4  # admissions flow again
    code, _, err = crew.cli(w1, "stop", run_id)
    assert code == 0, err
    wait_until(lambda: _used(crew, session, 4) == 0, what="the slot released after stop")


# -- placement and the home's views of every host ----------------------------------------------


def _runs_by_id(crew: Fleet, node: NodeProcess, *args: str) -> dict[str, dict[str, object]]:
    code, out, err = crew.cli(node, "runs", "--json", *args)
    assert code == 0, err
    return {str(r["run_id"]): r for r in json.loads(out)["runs"]}


def test_run_on_a_worker_from_the_home_runs_it_there_and_every_view_on_the_home_names_its_host(
    crew: Fleet,
) -> None:
    session = _session()
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": "3"}
    args = ("run", "--async", "--on", "w2", "--session", session, "--agents-dir", EXAMPLES)
    done = run_cli(*args, "sleeper", "seconds=60", state_dir=crew.home.state_dir, env=env)
    assert done.returncode == 0, done.stderr
    run_id = _run_id(done.stdout)

    assert run_id in _runs_by_id(crew, crew.workers["w2"])  # it runs on w2, in w2's runs.db
    assert _used(crew, session, 3) == 1  # against the home's capacity ledger
    assert crew.nodes()["w2"].slots == 1
    on_home = _runs_by_id(crew, crew.home, "--session", session)
    assert on_home[run_id]["host"] == "w2"
    code, out, _ = crew.cli(crew.home, "runs", "--session", session)
    assert code == 0 and out.splitlines()[0].split()[:2] == ["HOST", "RUN"]
    assert any(line.split()[:2] == ["w2", run_id] for line in out.splitlines())

    code, out, err = crew.cli(crew.home, "show", run_id, "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["host"], shown["state"]) == ("w2", "running")
    assert shown["active_async_capacity"]["used"] == 1
    code, out, err = crew.cli(crew.home, "debug-run", run_id)
    assert code == 0, err
    assert "host: w2" in out.splitlines()
    code, out, err = crew.cli(crew.home, "fleet", "--once", "--json")
    assert code == 0, err
    [listed] = [r for r in json.loads(out)["runs"] if r["run_id"] == run_id]
    assert listed["host"] == "w2"
    # Its budget is the home's: read live there, for a run on any host (R-FAN-26).
    assert "fanout_recorded" not in listed and listed["snapshots"]["fanout_used"] == 1
    # So is its session's pool: read live there too (one reading per session).
    assert "capacity_recorded" not in listed and listed["snapshots"]["capacity_used"] == 1
    code, out, err = crew.cli(crew.home, "status")
    assert code == 0, err
    assert any(line.strip().startswith("host w2: up") for line in out.splitlines()), out
    code, out, err = crew.cli(crew.home, "status", "--json")
    assert code == 0, err
    assert json.loads(out)["hosts"]["w2"]["status"]["actors"][0]["name"] == "supervisor"

    code, _, err = crew.cli(crew.home, "stop", run_id)  # the home finds it on w2
    assert code == 0, err
    wait_until(lambda: _used(crew, session, 3) == 0, what="the slot released after stop")
    assert _runs_by_id(crew, crew.home, "--session", session)[run_id]["state"] == "stopped"


def test_a_foreground_run_on_a_worker_is_followed_from_the_home_to_its_end(crew: Fleet) -> None:
    args = ("run", "--on", "w1", "--session", _session(), "--agents-dir", EXAMPLES, "--json")
    done = run_cli(*args, "sleeper", "seconds=0.2", state_dir=crew.home.state_dir)
    assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout)
    assert final["state"] == "complete" and final["children"][0]["exit_code"] == 0
    assert final["run_id"] in _runs_by_id(crew, crew.workers["w1"])


def _cut_worker(crew: Fleet, name: str) -> Callable[[], None]:
    """Cut worker `name` off its home (its link down on hosts, its node stopped on loopback:
    its shims and children run on either way); the undo."""
    fabric = crew.fabric
    if fabric is not None:
        fabric.link_down(name)
        return lambda: fabric.link_up(name)
    pid = crew.workers[name].pid
    stop_process(pid)
    return lambda: os.kill(pid, signal.SIGCONT)


def test_a_foreground_run_on_a_worker_is_followed_across_a_partition_to_its_true_end(
    crew: Fleet,
) -> None:
    """The worker is cut off while the home's CLI follows its run, longer than one watch may
    take: the follow waits the partition out (saying so) and ends with the run's own end (the
    child ended meanwhile) once the worker is back."""
    session = _session()
    args = ("run", "--on", "w1", "--session", session, "--agents-dir", EXAMPLES, "--json")
    cmd = [*CLI, "--state-dir", str(crew.home.state_dir), "--timeout", "2", *args]
    follower = subprocess.Popen(
        [*cmd, "sleeper", "seconds=3"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    assert follower.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(follower.stderr or ()), daemon=True)
    reader.start()
    try:
        # The first event line: the launch was answered and the follow is under way.
        wait_until(lambda: any(" started " in line for line in said), what="the run followed")
        undo = _cut_worker(crew, "w1")
        try:  # one watch lost in the cut (10 s + the 2 s timeout), then held by the home
            wait_until(
                lambda: follower.poll() is not None or any("still following" in s for s in said),
                timeout=60,
                what="the follower waiting out the partition",
            )
        finally:
            undo()
        follower.wait(timeout=90)
        out = follower.stdout.read() if follower.stdout is not None else ""
    finally:
        follower.kill()
        follower.wait()
        reader.join(10)
        for pipe in (follower.stdout, follower.stderr):
            if pipe is not None:
                pipe.close()
    assert follower.returncode == 0, "".join(said)
    final = json.loads(out)
    assert final["state"] == "complete" and final["children"][0]["exit_code"] == 0


def test_a_run_launched_on_a_worker_is_found_by_the_homes_show_and_listed_with_its_host(
    crew: Fleet,
) -> None:
    session = _session()
    code, out, err = crew.run_background(crew.workers["w3"], session, "seconds=60", limit=2)
    assert code == 0, err
    run_id = _run_id(out)
    code, out, err = crew.cli(crew.home, "show", run_id[:13])  # a unique prefix, on any host
    assert code == 0, err
    assert "host: w3" in out.splitlines()
    assert _runs_by_id(crew, crew.home, "--active")[run_id]["host"] == "w3"
    code, _, err = crew.cli(crew.workers["w3"], "stop", run_id)
    assert code == 0, err


def test_run_on_a_name_that_is_no_worker_or_a_top_level_run_on_from_a_worker_is_refused_at_once(
    crew: Fleet,
) -> None:
    args = ("run", "--async", "--agents-dir", EXAMPLES, "--session", _session())
    done = run_cli(*args, "--on", "nosuch", "sleeper", "seconds=1", state_dir=crew.home.state_dir)
    assert done.returncode != 0
    assert "no worker named 'nosuch' has joined this home" in done.stderr
    w1 = crew.workers["w1"].state_dir
    for other in ("w2", "home"):  # the home is a host like any other: no top-level run on it
        done = run_cli(*args, "--on", other, "sleeper", "seconds=1", state_dir=w1)
        assert done.returncode != 0
        assert "a worker may place only a nested child's run on another host" in done.stderr
    code, _, err = crew.cli(crew.home, "show", "no-such-run")
    assert code != 0 and "no run 'no-such-run' on any host of this home" in err


def test_a_node_that_is_neither_home_nor_worker_has_no_host_to_carry_a_request_to() -> None:
    with Node.embedded() as node, node.client().on("w2") as elsewhere:
        with pytest.raises(BadRequest) as refused:
            elsewhere.runs.list(limit=1)
        assert refused.value.details["reason"] == "not_home"


def test_a_worker_that_is_down_is_refused_for_run_on_at_once_and_named_by_the_homes_runs(
    crew: Fleet,
) -> None:
    gone = crew.add_worker("wd")
    wait_until(lambda: crew.nodes()["wd"].state == "up", what="wd up")
    code, _, err = crew.cli(gone, "stop")
    assert code == 0, err
    wait_until(lambda: crew.nodes()["wd"].state == "unreachable", what="wd unreachable")
    args = ("run", "--async", "--agents-dir", EXAMPLES, "--session", _session(), "--on", "wd")
    done = run_cli(*args, "sleeper", "seconds=1", state_dir=crew.home.state_dir)
    assert done.returncode != 0
    assert "worker 'wd' is unreachable" in done.stderr
    code, out, err = crew.cli(crew.home, "runs")
    assert code == 0 and "host wd: runs not listed (unreachable: not asked)" in err
    code, out, err = crew.cli(crew.home, "runs", "--json")
    assert code == 0 and "wd" in json.loads(out)["hosts_not_listed"]


def test_a_worker_serves_its_home_the_run_supervisor_ping_and_status_and_nothing_else(
    crew: Fleet,
) -> None:
    with crew.client(crew.home).on("w1") as w1:
        pong = w1.ping()
        assert pong.node_id == crew.workers["w1"].status().node_id  # the worker answered
        assert w1.runs.list(limit=1) is not None
        for request, result in ((KeysList(), AllowedKeys), (Shutdown(), Ack)):
            with pytest.raises(BadRequest) as refused:
                w1.ask(request, result)  # type: ignore[arg-type]
            assert refused.value.details["reason"] in ("not_served_to_home", "local_only")
        with pytest.raises(BadRequest) as ledger:
            w1.capacity.snapshot(_session(), 1)  # the ledgers are the home's, never a worker's
        assert ledger.value.details["reason"] == "not_served_to_home"
    assert crew.workers["w1"].status().cluster is not None  # still up: no shutdown reached it
