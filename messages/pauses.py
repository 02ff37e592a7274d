"""Protocol of pauses and checkpoints (R-RUN-2): `runs.pause`, `runs.approve`, `runs.reject`,
served by the run supervisor, which owns the runs.

Owns the shapes of these three requests only; why a paused run waits (`PauseKind`) is part of
the run's view and stays with it in supervisor.py. The rules of each request (what a paused run
holds, when an approval relaunches it) live with the supervisor, in actors/runs/pauses.py and
checkpoints.py. Like every module in messages/, it never imports anything of ours outside it.
"""

from typing import ClassVar, Literal

from pydantic import Field

from subagents_node.messages.base import Request, ResultType
from subagents_node.messages.domains import (
    Count,
    Depth,
    EncodedDescriptor,
    Environment,
    RunId,
    ShortText,
)
from subagents_node.messages.supervisor import LAUNCH_ID, SUPERVISOR, LaunchResult, RunView


class Pause(Request):
    """R-RUN-2 interrupt-as-pause: stop a background run's child tree; the run is `paused`
    (it holds no process, keeps its slot until it is resumed, R-CAP-18 / A-2)."""

    type: Literal["runs.pause"] = "runs.pause"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = RunView
    run_id: RunId


class Approve(Request):
    """R-RUN-2: a run waiting at a checkpoint goes on past it. Answers the run that continues
    (the same run; a new one, holding the same slot, when the node restarted meanwhile)."""

    type: Literal["runs.approve"] = "runs.approve"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = LaunchResult
    run_id: RunId
    #: The approving launcher's depth, limit and environment, used only when the run must be
    #: relaunched from its checkpoint (a node restart ended the execution that paused).
    depth: Depth = 0
    capacity_limit: Count = 0
    env: Environment | None = None
    #: The approving launcher's inherited route ($SUBAGENTS_RUN_FANOUT), as for `Resume`:
    #: with one (or at depth > 0) that relaunch is nested and takes no capacity (R-TOP-1,
    #: R-RES-3); at depth > 0 it is refused without one (R-FAN-4). The relaunch runs on its
    #: source's budget (R-RES-4) and claims one path on this route (`resume[RUN]`).
    inherited_fanout: EncodedDescriptor | None = None
    #: The client's id for this approval (docs/api.md, "Launching again"): the same approve
    #: sent again under it (its answer lost) is answered with the run that went on, never
    #: refused as "not waiting at a checkpoint"; another approve of the run under it is
    #: refused (`BadRequest`). Scoped to the run, as an append id is to its chain.
    approve_id: str | None = Field(default=None, max_length=64, pattern=LAUNCH_ID)

    added_later: ClassVar[tuple[str, ...]] = ("approve_id",)


class Reject(Request):
    """R-RUN-2: a run waiting at a checkpoint ends `rejected`, with the reason as its error."""

    type: Literal["runs.reject"] = "runs.reject"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = RunView
    run_id: RunId
    reason: ShortText = ""


REQUESTS = (Pause, Approve, Reject)
