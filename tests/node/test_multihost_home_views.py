"""A home's views of what its workers run (DESIGN §1 "Multi-host"): the holders of a session's
capacity slots on every host, and every active run a worker reports.

A home and two workers, each a real node with its own state dir, talking tcp + CURVE on
loopback (a second host changes nothing here: what is probed is what the home knows, not the
network). `capacity` on the home must name each run holding one of the session's slots,
wherever it runs, with its host, read from the home's capacity ledger (no worker is asked),
not only the home's own runs. A worker's heartbeat must count every active run it has, not
the first page (1,000) of its run listing: over a thousand active runs are its runs.db rows,
copied from a real running run behind the node's back (tests/support/runrows.py), since
launching that many would take minutes.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest

from tests.support.fleet import EXAMPLE_AGENTS, Fleet, fleet
from tests.support.nodes import run_cli
from tests.support.runrows import copy_run, remove_copies
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow

#: The session's capacity limit: one slot for a run on each host.
LIMIT = 3
#: More active runs on a worker than one page of its run listing (1,000) holds.
RUNS = 1_010


@pytest.fixture(scope="module")
def crew() -> Iterator[Fleet]:
    with fleet(("w1", "w2")) as started:
        yield started


def _session() -> str:
    return f"hv-{uuid.uuid4().hex[:8]}"


def _launched(done: tuple[int, str, str]) -> str:
    code, out, err = done
    assert code == 0, err
    return out.strip().splitlines()[0].strip()


def _placed_on(crew: Fleet, worker: str, session: str) -> str:
    """`run --async --on WORKER` on the home: the home's operator places a run there."""
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": str(LIMIT)}
    args = ("run", "--async", "--on", worker, "--session", session)
    done = run_cli(
        *args,
        "--agents-dir",
        str(EXAMPLE_AGENTS),
        "sleeper",
        "seconds=300",
        state_dir=crew.home.state_dir,
        env=env,
    )
    return _launched((done.returncode, done.stdout, done.stderr))


def _stop_on_home(crew: Fleet, run_ids: list[str], session: str) -> None:
    """The home stops each run wherever it runs, and its slot is freed."""
    for run_id in run_ids:
        code, _, err = crew.cli(crew.home, "stop", run_id)
        assert code == 0, err
    pool = crew.client(crew.home).capacity
    wait_until(lambda: pool.snapshot(session, LIMIT).used == 0, what="every slot freed")


def test_r_cap_26_capacity_on_a_home_names_the_runs_holding_slots_on_its_workers_with_their_host(
    crew: Fleet,
) -> None:
    session = _session()
    on_home = _launched(crew.run_background(crew.home, session, "seconds=300", limit=LIMIT))
    runs = [on_home]
    try:
        # One admitted by a CLI on w1 (w1 asks the home's ledger), one the home placed on w2.
        w1 = crew.workers["w1"]
        runs.append(_launched(crew.run_background(w1, session, "seconds=300", limit=LIMIT)))
        runs.append(_placed_on(crew, "w2", session))
        expected = {on_home: "", runs[1]: "w1", runs[2]: "w2"}

        args = ("capacity", "--session", session, "--limit", str(LIMIT))
        code, out, err = crew.cli(crew.home, *args, "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert (shown["used"], shown["limit"]) == (LIMIT, LIMIT)  # the count was right before
        assert sorted(h["run_id"] for h in shown["holders"]) == sorted(expected)
        assert {h["run_id"]: h["host"] for h in shown["holders"]} == expected
        for holder in shown["holders"]:
            assert holder["relation"] == "current"
            assert holder["owner"]["host"] == holder["host"]
            assert holder["verdict"]["verdict"] == "retained", holder
        assert "holders_cut_at" not in shown and "holders_unreadable" not in shown

        code, out, err = crew.cli(crew.home, *args)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == f"Active async capacity: {LIMIT}/{LIMIT} used"
        for run_id, host in expected.items():
            if host:
                assert any(line.split()[:3] == [run_id, "on", host] for line in lines), out
            else:
                assert any(line.split()[:1] == [run_id] for line in lines), out

        # The programmatic view the command reads: every slot, each with its host.
        pool = crew.client(crew.home).capacity.holders(session)
        named = {i.owner.run_id: i.owner.host for i in pool.holders if i.owner}
        assert (named, pool.unreadable, pool.cut) == (expected, 0, False)
    finally:
        _stop_on_home(crew, runs, session)


def test_a_worker_reports_every_active_run_to_its_home_beyond_the_first_page_of_its_listing(
    crew: Fleet,
) -> None:
    worker = crew.workers["w1"]
    client = crew.client(worker)
    run_id = _launched(crew.run_background(worker, _session(), "seconds=300"))
    try:
        wait_until(
            lambda: [c.state for c in client.runs.show(run_id).children] == ["running"],
            what=f"{run_id}'s child running on w1",
        )
        # Rows of runs w1 does not drive, in another session: active (running, each with a
        # running child) as its listing reads them; one of them unreadable, so left out.
        copies = copy_run(worker.state_dir, run_id, RUNS, session_id=_session())
        active = 1 + len(copies)
        assert active > 1000
        view = wait_until(
            lambda: (v := crew.nodes()["w1"]).runs == active and v,
            timeout=30,
            what=f"the home counting {active} active runs on w1",
        )
        assert view.children == active
    finally:
        remove_copies(worker.state_dir, run_id)
        client.runs.stop(run_id)
        wait_until(lambda: client.runs.show(run_id).state == "stopped", what=f"{run_id} stopped")


def test_wait_on_a_home_waits_for_a_workers_run_and_its_own_in_the_order_given(
    crew: Fleet,
) -> None:
    """`wait RUN` on the home used to say "Run not found" for a run on a worker, which `runs`
    on the same home listed (and which a foreground `run --on` whose home went told the user
    to wait for)."""
    session = _session()
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": str(LIMIT)}
    args = ("run", "--async", "--session", session, "--agents-dir", str(EXAMPLE_AGENTS))
    on_w1 = _launched(
        crew.cli(crew.home, *args[:2], "--on", "w1", *args[2:], "sleeper", "seconds=1")
    )
    here = run_cli(*args, "sleeper", "seconds=0", state_dir=crew.home.state_dir, env=env)
    at_home = _launched((here.returncode, here.stdout, here.stderr))

    code, out, err = crew.cli(crew.home, "wait", on_w1, at_home)
    assert code == 0, err
    assert out.splitlines() == [f"run {on_w1} complete", f"run {at_home} complete"]

    longer = _placed_on(crew, "w2", session)
    code, out, err = crew.cli(crew.home, "wait", "--timeout", "0.5", longer)
    assert code == 124 and out.strip() == f"run {longer} still running", (out, err)
    _stop_on_home(crew, [longer], session)
