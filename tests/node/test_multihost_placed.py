"""A worker's key follows only the runs it placed through the home (DESIGN §1 "Multi-host",
§3): `runs.watch`, `runs.show` and `runs.stop` from a worker's key are carried (to another
worker) or served (on the home) for a run that worker's nested launch placed there, by its full
id, and refused (`bad_request`, reason `not_placed_by_you`, nothing changed) for any other: the
home's own top-level runs, an operator's run on a worker, another worker's placed run. The
record is the home's (members.db), so the allowance outlives a home restart, and it goes when
the run's host no longer has the run (pruned).

Probed from this process over the home's tcp socket on loopback with each worker's own CURVE
key, as test_multihost_peers.py does; the workers are real nodes that carry and run the runs.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator

import pytest

from subagents_node.client.client import Client
from subagents_node.client.keys import CLIENT_KEY, ClientCredentials, keys_dir, read_keypair
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Request
from subagents_node.messages.errors import BadRequest, RunNotFound, SubagentsError
from subagents_node.messages.fanout import encode_descriptor
from subagents_node.messages.retention import Prune, PruneResult
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import (
    AgentPlan,
    Launch,
    LaunchResult,
    RunEvents,
    RunView,
    Show,
    Stop,
    TaskItem,
    Watch,
)
from tests.support.fleet import Fleet, fleet
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow

#: A child that sleeps until it is stopped (or the test's fleet is torn down).
NAP = AgentPlan(name="nap", command=[sys.executable, "-c", "import time; time.sleep(300)"])


@pytest.fixture(scope="module")
def crew() -> Iterator[Fleet]:
    with fleet(("w1", "w2")) as started:
        try:
            yield started
        finally:  # a failed test's runs: their children would outlive the nodes
            for node in [started.home, *started.workers.values()]:
                with contextlib.suppress(SubagentsError):
                    client = started.client(node)
                    for view in client.runs.list(active_only=True, limit=1000):
                        client.runs.stop(view.run_id)


def _as_worker(crew: Fleet, name: str, host: str) -> Client:
    """A client holding worker `name`'s own key, asking the home for `host`."""
    pair = read_keypair(keys_dir(crew.workers[name].state_dir) / CLIENT_KEY)
    keys = ClientCredentials(pair, crew.home_key)
    return Client(ZmqTransport(crew.endpoint, credentials=keys, host=host), timeout=20.0)


def _launch(crew: Fleet, nested: bool) -> Launch:
    """A background run of one sleeping child; `nested`: a child's launch, with its tree's
    fan-out descriptor (what a worker may place)."""
    descriptor = crew.client(crew.home).fanout.create(f"root-{uuid.uuid4().hex[:8]}", 8)
    return Launch(
        session_id=f"pl-{uuid.uuid4().hex[:8]}",
        mode="single",
        background=True,
        items=[TaskItem(agent=NAP, task="nap")],
        cwd="/",
        depth=1 if nested else 0,
        max_depth=3,
        inherited_fanout=encode_descriptor(descriptor) if nested else None,
    )


def _place(crew: Fleet, worker: str, host: str) -> str:
    """Run id of a nested run worker `worker`'s key placed on `host` through the home."""
    with _as_worker(crew, worker, host) as client:
        return client.ask(_launch(crew, nested=True), LaunchResult).run.run_id


def _on(crew: Fleet, host: str) -> Client:
    """The home operator's client for `host` (kept by the home's client)."""
    return crew.client(crew.home).hosts.on(host)


def _running(crew: Fleet, host: str, run_id: str) -> RunView:
    client = _on(crew, host)
    return wait_until(
        lambda: (view := client.runs.show(run_id)).state == "running" and view,
        what=f"run {run_id} running on {host}",
    )


def _follow_ups(run_id: str) -> list[tuple[Request, type[RunView] | type[RunEvents]]]:
    return [
        (Show(run_id=run_id), RunView),
        (Watch(run_id=run_id, wait_s=0), RunEvents),
        (Stop(run_id=run_id), RunView),
    ]


def _refused_every_follow_up(crew: Fleet, worker: str, host: str, run_id: str) -> None:
    with _as_worker(crew, worker, host) as client:
        for request, result in _follow_ups(run_id):
            with pytest.raises(BadRequest) as refused:
                client.ask(request, result)  # type: ignore[arg-type]
            assert refused.value.details["reason"] == "not_placed_by_you", refused.value
            assert refused.value.details["run_id"] == run_id
            assert run_id in refused.value.message
    assert _on(crew, host).runs.show(run_id).state == "running"  # nothing changed


def _stop(crew: Fleet, host: str, run_id: str) -> None:
    """The operator stops the run, unless it ended already."""
    client = _on(crew, host)
    if client.runs.show(run_id).state in TERMINAL_RUN_STATES:
        return
    client.runs.stop(run_id)
    wait_until(lambda: client.runs.show(run_id).state == "stopped", what=f"{run_id} stopped")


def test_a_workers_key_may_not_watch_show_or_stop_a_top_level_run_on_the_home(
    crew: Fleet,
) -> None:
    run_id = crew.client(crew.home).runs.launch(_launch(crew, nested=False)).run_id
    _running(crew, "home", run_id)
    try:
        for host in ("", "home"):  # the home, named or not
            _refused_every_follow_up(crew, "w1", host or "home", run_id)
    finally:
        _stop(crew, "home", run_id)


def test_a_workers_key_may_not_follow_an_operators_or_another_workers_run_on_any_host(
    crew: Fleet,
) -> None:
    operators = _on(crew, "w2").runs.launch(_launch(crew, nested=False)).run_id
    w2_on_w1 = _place(crew, "w2", "w1")
    w2_on_home = _place(crew, "w2", "home")
    runs = [("w2", operators), ("w1", w2_on_w1), ("home", w2_on_home)]
    try:
        for host, run_id in runs:
            _running(crew, host, run_id)
            _refused_every_follow_up(crew, "w1", host, run_id)
        # Nor by a prefix of another's id, nor of its own: only a run's full id is followed.
        with _as_worker(crew, "w2", "home") as w2:
            assert w2.ask(Show(run_id=w2_on_home), RunView).run_id == w2_on_home
            with pytest.raises(BadRequest) as prefix:
                w2.ask(Show(run_id=w2_on_home[:6]), RunView)
            assert prefix.value.details["reason"] == "not_placed_by_you"
    finally:
        for host, run_id in runs:
            _stop(crew, host, run_id)


def test_a_workers_key_follows_the_runs_it_placed_and_still_may_after_a_home_restart(
    crew: Fleet,
) -> None:
    placed = [("w2", _place(crew, "w1", "w2")), ("home", _place(crew, "w1", "home"))]
    try:
        for host, run_id in placed:
            _running(crew, host, run_id)
            with _as_worker(crew, "w1", host) as w1:
                assert w1.ask(Show(run_id=run_id), RunView).state == "running"
                assert w1.ask(Watch(run_id=run_id, wait_s=0), RunEvents).run.run_id == run_id
        crew.close_client(crew.home)
        stopped = crew.home.stop()
        assert stopped.returncode == 0, stopped.stderr
        crew.home.start()
        wait_until(
            lambda: all(v.state == "up" for v in crew.nodes().values()),
            timeout=60,
            what="workers back up",
        )
        for host, run_id in placed:
            _refused_every_follow_up(crew, "w2", host, run_id)  # still w1's alone
            with _as_worker(crew, "w1", host) as w1:
                assert w1.ask(Show(run_id=run_id), RunView).run_id == run_id
                w1.ask(Stop(run_id=run_id), RunView)
                wait_until(
                    lambda w1=w1, run_id=run_id: (
                        w1.ask(Show(run_id=run_id), RunView).state == "stopped"
                    ),
                    what=f"{run_id} stopped by the worker that placed it",
                )
    finally:
        for host, run_id in placed:
            _stop(crew, host, run_id)  # what a failure above left running


def test_a_placed_run_pruned_on_its_host_leaves_the_homes_record_on_the_next_follow_up(
    crew: Fleet,
) -> None:
    run_id = _place(crew, "w1", "w2")
    _running(crew, "w2", run_id)
    with _as_worker(crew, "w1", "w2") as w1:
        w1.ask(Stop(run_id=run_id), RunView)
        wait_until(lambda: w1.ask(Show(run_id=run_id), RunView).state == "stopped", what="stopped")
        w2 = crew.client(crew.workers["w2"])
        # Pruned once it has settled (a run still live in its supervisor is not yet prunable).
        wait_until(
            lambda: run_id in w2.ask(Prune(older_than_s=0), PruneResult).pruned,
            what=f"{run_id} pruned on w2",
        )
        with pytest.raises(RunNotFound):
            w1.ask(Show(run_id=run_id), RunView)
        with pytest.raises(BadRequest) as forgotten:  # the home's record went with the run
            w1.ask(Show(run_id=run_id), RunView)
        assert forgotten.value.details["reason"] == "not_placed_by_you"
