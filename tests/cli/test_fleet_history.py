"""The live `fleet` view starts from the node's runs going and its newest runs, then follows
the events from the node's last one: it never replays the event history.

With the default retention (30 days) a fleet's node keeps tens of thousands of runs and
hundreds of thousands of events. The view long-polled `runs.watch_all` from event 0: hundreds
of requests, each reading the views of up to 500 runs on the supervisor's one thread, before
it caught up, and it kept every run it was ever told of. A real node serves rows copied from a
real run (and that run's events, one set per copy), more than the view lists.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from subagents_node.cli.fleet import FleetState, poll
from subagents_node.client.paths import owner_db
from subagents_node.messages.supervisor import ListRuns, RunList, TaskItem
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runrows import copy_run
from tests.support.runs import Gate, launch_context, wait_until

StartNode = Callable[..., NodeProcess]
#: More finished runs than the view lists (its 100 newest), each with its events kept.
COPIES = 150


def test_the_live_fleet_view_follows_from_the_last_event_and_never_replays_the_history(
    start_node: StartNode, state_dir: Path, agents: Path, gate: Gate
) -> None:
    first = start_node(state_dir=state_dir)
    client = first.client()
    ctx = launch_context(agents)
    going = client.runs.launch(
        ctx.launch("single", True, items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))])
    )
    (child,) = gate.accept(1)
    source = client.runs.launch(
        ctx.launch("single", True, items=[TaskItem(agent=ctx.plan("echo"), task="seed")])
    )
    assert client.runs.wait(source.run_id, timeout=30).state == "complete"
    first.close_clients()
    assert first.stop().returncode == 0  # the gate child goes on under its shim
    copies = copy_run(state_dir, source.run_id, COPIES)
    with closing(sqlite3.connect(owner_db(state_dir, "supervisor"))) as db, db:
        db.execute(
            "INSERT INTO run_events (run_id, ts, kind, data) SELECT c.run_id, e.ts, e.kind, "
            "e.data FROM run_events e, runs c WHERE e.run_id = ? AND c.run_id LIKE ? "
            "ORDER BY c.run_id, e.seq",
            (source.run_id, f"{source.run_id}-copy%"),
        )

    node = start_node(state_dir=state_dir)
    last = node.client().ask(ListRuns(limit=1), RunList).last_seq
    assert last is not None and last > COPIES
    state, stop = FleetState(), threading.Event()
    follower = threading.Thread(target=poll, args=(node.address, "", state, stop), daemon=True)
    follower.start()
    try:
        wait_until(lambda: state.last_seq.get("", 0) >= last, what="the view to catch up")
        seen = set(state.runs)
    finally:
        stop.set()
        follower.join(timeout=30)
    assert not state.error
    assert going.run_id in seen  # a run going is shown, however old
    assert copies[-1] in seen  # the newest
    assert copies[0] not in seen  # an old finished run's events were never read again
    assert len(seen) < COPIES
    child.release(0)
    assert node.client().runs.wait(going.run_id, timeout=30).state == "complete"
