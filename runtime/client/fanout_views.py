"""Run views with live fan-out figures (R-FAN-26): what `show`, `fleet`, `runs --json` and the
MCP tools print for a run's budget.

A run records its budget's snapshot when it is admitted and when it settles; meanwhile its
children's nested launches claim on the same budget, so the recorded figure falls behind. This
module owns the step that swaps it for the budget owner's live one: one `fanout.snapshots`
request for all the runs of a view (each distinct descriptor read once), whichever client,
sync or asyncio, performs the plan. A budget that cannot be read (its owner is unreachable, the
record is gone or quarantined) keeps the recorded figure, and the view says so for that run
only: it never fails the whole view. It must never import server code, nor do I/O itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from subagents_node.client.fanout import snapshots_plan
from subagents_node.client.hosts import HostRuns, regrouped
from subagents_node.client.plans import Plan
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.fanout import FanoutSnapshot, decode_descriptor
from subagents_node.messages.supervisor import RunView

#: What a view prints beside a figure that is the run's record, not its budget's live count.
RECORDED = "recorded"


class LiveFanout(NamedTuple):
    """The runs, in their order, each with its budget's live snapshot where it could be read."""

    runs: list[RunView]
    #: run id -> why its figure is the one it recorded (no live reading of its budget).
    recorded: dict[str, str]


def with_snapshot(run: RunView, live: FanoutSnapshot) -> RunView:
    """The run with `live` as its fan-out figures (its other snapshots untouched)."""
    update = {
        "fanout_used": live.used,
        "fanout_limit": live.limit,
        "fanout_remaining": live.remaining,
    }
    return run.model_copy(update={"snapshots": run.snapshots.model_copy(update=update)})


def live_fanout_plan(runs: Sequence[RunView], timeout: float | None = None) -> Plan[LiveFanout]:
    """Read every budget the runs name in one request (per 1,000 budgets), and put each live
    snapshot in its runs' views. A run without a budget (none recorded) keeps its figure as is,
    unmarked; a run whose budget cannot be read keeps it, marked with the reason."""
    recorded: dict[str, str] = {}
    wanted: dict[str, int] = {}  # encoded descriptor -> its place in the request
    descriptors = []
    for run in runs:
        encoded = run.fanout_descriptor
        if not encoded or encoded in wanted:
            continue
        try:
            descriptors.append(decode_descriptor(encoded))
        except SubagentsError as err:
            recorded[run.run_id] = err.message
            continue
        wanted[encoded] = len(wanted)
    if not descriptors:
        return LiveFanout(list(runs), recorded)
    try:
        readings = yield from snapshots_plan(descriptors, timeout)
    except SubagentsError as err:  # the owner cannot answer (or predates the request)
        reason = err.message or err.code
        why = {run.run_id: reason for run in runs if run.fanout_descriptor in wanted}
        return LiveFanout(list(runs), {**recorded, **why})
    shown = []
    for run in runs:
        place = wanted.get(run.fanout_descriptor)
        reading = readings[place] if place is not None else None
        if reading is not None and reading.snapshot is not None:
            run = with_snapshot(run, reading.snapshot)
        elif reading is not None:
            recorded[run.run_id] = reading.error or reading.code
        shown.append(run)
    return LiveFanout(shown, recorded)


def live_parts_plan(
    parts: Sequence[HostRuns], timeout: float | None = None
) -> Plan[tuple[list[HostRuns], dict[str, str]]]:
    """`live_fanout_plan` over a home's view of every host (the budgets are all the home's):
    the parts with live figures, and the runs whose figures are their records."""
    live = yield from live_fanout_plan([run for part in parts for run in part.runs], timeout)
    return regrouped(parts, live.runs), live.recorded
