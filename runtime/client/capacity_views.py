"""Run views with live capacity figures: what `fleet`, `runs --json` and `show --json` print
for the session pool a run took its slot in.

A background top-level run records its session's capacity snapshot (used/limit) when it is
admitted; every later admission and release in the session changes the pool, so the recorded
figure goes stale at once (a view showing "9/30" long after every slot was freed). This module
owns the step that swaps it for the capacity owner's live snapshot: one `capacity.snapshot`
request per session of a view, never one per run, whichever client, sync or asyncio, performs
the plan. A run that recorded no capacity figure (foreground, nested, a workflow's child) keeps
none. A session whose pool cannot be read keeps its runs' recorded figures, and the view says
so for those runs only: it never fails the whole view. It must never import server code, nor
do I/O itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from subagents_node.client.capacity import snapshot_plan
from subagents_node.client.hosts import HostRuns, regrouped
from subagents_node.client.plans import Plan
from subagents_node.messages.capacity import CapacitySnapshot
from subagents_node.messages.errors import NodeError, OwnerUnavailable, SubagentsError
from subagents_node.messages.supervisor import RunView


class LiveCapacity(NamedTuple):
    """The runs, in their order, each with its session's live snapshot where it was read."""

    runs: list[RunView]
    #: run id -> why its capacity figure is the one it recorded (its pool was not read).
    recorded: dict[str, str]


def with_capacity(run: RunView, live: CapacitySnapshot) -> RunView:
    """The run with `live` as its capacity figures (its other snapshots untouched)."""
    update = {"capacity_used": live.used, "capacity_limit": live.limit}
    return run.model_copy(update={"snapshots": run.snapshots.model_copy(update=update)})


def session_limits(runs: Sequence[RunView]) -> dict[str, int]:
    """Each session with a recorded capacity figure -> the limit to read its pool against:
    the one its newest shown run was admitted under (the session's most recent setting)."""
    newest: dict[str, RunView] = {}
    for run in runs:
        if run.snapshots.capacity_limit is None:
            continue
        seen = newest.get(run.session_id)
        if seen is None or run.created_at > seen.created_at:
            newest[run.session_id] = run
    return {session: run.snapshots.capacity_limit or 0 for session, run in newest.items()}


def live_capacity_plan(runs: Sequence[RunView], timeout: float | None = None) -> Plan[LiveCapacity]:
    """Read each session's pool once and put its live snapshot in the views of its runs that
    recorded a capacity figure. A session that cannot be read keeps its runs' figures, marked
    with the reason; once the owner (or the node) cannot answer at all, the sessions not yet
    read are not asked, each waiting `timeout` in turn: they keep theirs with the same reason."""
    live: dict[str, CapacitySnapshot] = {}
    failed: dict[str, str] = {}
    unanswered = ""
    for session, limit in session_limits(runs).items():
        if unanswered:
            failed[session] = unanswered
            continue
        try:
            live[session] = yield from snapshot_plan(session, limit, timeout)
        except SubagentsError as err:
            failed[session] = err.message or err.code
            if isinstance(err, (OwnerUnavailable, NodeError)):
                unanswered = failed[session]
    shown, recorded = [], {}
    for run in runs:
        if run.snapshots.capacity_limit is not None:
            if run.session_id in live:
                run = with_capacity(run, live[run.session_id])
            elif run.session_id in failed:
                recorded[run.run_id] = failed[run.session_id]
        shown.append(run)
    return LiveCapacity(shown, recorded)


def live_capacity_parts_plan(
    parts: Sequence[HostRuns], timeout: float | None = None
) -> Plan[tuple[list[HostRuns], dict[str, str]]]:
    """`live_capacity_plan` over a home's view of every host (the pools are all the home's):
    the parts with live figures, and the runs whose figures are their records."""
    live = yield from live_capacity_plan([run for part in parts for run in part.runs], timeout)
    return regrouped(parts, live.runs), live.recorded
