"""Complete run listings: every run one `runs.list` filter matches, not its first page.

One `runs.list` request answers at most PAGE runs; a view that must name every run of a
session, a run tree or a workflow (`capacity`, `budget`, a resumed workflow's sources, the
children a workflow command waits for) follows the listing's `after_run_id` cursor page by
page, up to MAX_LISTED runs, and says when that bound cut it short. Owns that walk as a plan,
so the sync and the asyncio client perform the same one; it must never do I/O itself, nor
import server code.
"""

from __future__ import annotations

from typing import NamedTuple

from subagents_node.client.plans import Plan
from subagents_node.client.runs import list_plan
from subagents_node.messages.supervisor import RunView

#: Runs one page of the listing asks for (the request's own maximum).
PAGE = 1000
#: At most this many runs are listed (a bound on one view's memory and time, not a limit).
MAX_LISTED = 20 * PAGE


class Listing(NamedTuple):
    """The runs found, newest first, and whether MAX_LISTED cut the list short."""

    runs: list[RunView]
    cut: bool


def every_run_plan(
    session_id: str | None = None,
    active_only: bool = False,
    root_run_id: str | None = None,
    parent_run_id: str | None = None,
    bound: int | None = MAX_LISTED,
) -> Plan[Listing]:
    """Every run the filter matches, newest first, read a page at a time, at most `bound`
    (None: no bound, for a reader that must not miss a run whatever it costs).

    A page can come back short without being the last (a run the owner cannot read is left
    out of it), so only an empty page ends the listing."""
    found: list[RunView] = []
    after: str | None = None
    while bound is None or len(found) < bound:
        page = yield from list_plan(
            session_id, active_only, PAGE, root_run_id, parent_run_id, after
        )
        if not page:
            return Listing(found, False)
        found += page
        after = page[-1].run_id
    return Listing(found[:bound], True)
