"""Protocol of run retention: `runs.prune` (served by the run supervisor, which owns the runs).

A finished run (complete, failed, stopped, rejected) whose end is older than the cutoff loses
its records and its directory under `<state>/runs/`; a run that is still going, or that has a
sub-run still going, is never pruned. The node applies its configured retention
(`run_retention_days`) by itself on a timer; `subagents-node prune` asks for it now.
"""

from typing import ClassVar, Literal

from pydantic import Field

from subagents_node.messages.base import Message, Request, ResultType

SUPERVISOR = "supervisor"
#: At most this many runs are pruned per request (the rest by the next one): one message never
#: holds the supervisor for long.
MAX_PRUNED_PER_REQUEST = 1000


class PruneResult(Message):
    pruned: list[str]
    #: Run directories with no record (a refused launch's, a crash's) removed: their names.
    orphans: list[str] = []
    #: The end time before which finished runs were pruned (Unix seconds).
    cutoff: float
    dry_run: bool
    #: True when more runs were past the cutoff than one request prunes.
    more: bool = False
    #: Runs whose directories were removed but whose records the full disk kept (deleting
    #: rows is a write too): they show with no directory; the next prune deletes them.
    records_kept: list[str] = []


class Prune(Request):
    """Prune finished runs that ended more than `older_than_s` ago (None: the configured
    retention; refused when retention is off and no age is given)."""

    type: Literal["runs.prune"] = "runs.prune"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = PruneResult
    older_than_s: float | None = Field(default=None, ge=0, le=100 * 365 * 86_400)
    # Strict: a destructive request must not read `0` or "no" as "not a dry run".
    dry_run: bool = Field(default=False, strict=True)


REQUESTS = (Prune,)
