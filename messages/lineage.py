"""Protocol of what makes a run from an existing one, served by the run supervisor: `runs.resume`
(R-RES-1..7, R-WF-5), `runs.rerun` (R-MISC-2) and `runs.append` (a chain's new steps).

Owns the shapes of these requests only; the run they act on, and the launch each becomes, are
supervisor.py's. The rules (what moves a slot, what a relaunch claims) live with the supervisor,
in actors/runs/relaunch.py, rerun.py, attach.py and appends.py. Like every module in messages/,
it never imports anything of ours outside it.
"""

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from subagents_node.messages.base import Message, Request, ResultType
from subagents_node.messages.domains import (
    Count,
    Depth,
    EncodedDescriptor,
    Environment,
    RunId,
    TaskText,
    Token,
)
from subagents_node.messages.runs import MAX_PID
from subagents_node.messages.supervisor import (
    LAUNCH_ID,
    SUPERVISOR,
    WORKFLOW_KEY,
    ChainStep,
    IntercomMode,
    LaunchResult,
)

#: Its meaning on a relaunch (docs/api.md, "Launching again"): the id of the run it makes,
#: kept when the request is sent again after its answer was lost, so that the second send is
#: answered with the run the first one made, never a second one.
_LAUNCH_ID_FIELD = Field(default=None, max_length=64, pattern=LAUNCH_ID)


class Resume(Request):
    """Relaunch a finished background run, or go on with an interrupt-paused one from its
    interrupted step, moving its capacity slot (R-RES-1..5) and keeping its absolute deadline
    (R-TMO-8). A workflow run resumes as a new workflow run of the same script whose host
    reuses the source's finished steps and claims (R-WF-5, R-FAN-23)."""

    type: Literal["runs.resume"] = "runs.resume"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = LaunchResult
    run_id: RunId
    message: TaskText = ""
    #: The resuming launcher's depth and limit (R-TOP-1, R-CAP-18).
    depth: Depth = 0
    capacity_limit: Count = 0
    #: The resuming launcher's inherited route ($SUBAGENTS_RUN_FANOUT), if any. With one (or
    #: at depth > 0) the resume is nested: it takes no capacity (R-TOP-1, R-RES-3), and at
    #: depth > 0 it is refused without one (R-FAN-4: only a `fanout: true` agent launches).
    #: The relaunch runs on its source's budget (R-RES-4); this route is charged one path
    #: (`resume[RUN]`, `attach[RUN]`), so a child's resumes count against its own tree.
    inherited_fanout: EncodedDescriptor | None = None
    #: The resuming launcher's environment (never persisted; None: the node's own).
    env: Environment | None = None
    #: A `resume` item of a workflow (R-WF-5, R-FAN-23): the relaunch becomes workflow
    #: `parent_run_id`'s child under `workflow_key`, takes no capacity (R-RES-3) and reuses its
    #: source's claim. Refused without that workflow's token (R-FAN-24).
    parent_run_id: RunId | None = None
    workflow_key: str | None = Field(default=None, max_length=128, pattern=WORKFLOW_KEY)
    workflow_token: Token | None = None
    #: Whether the relaunch runs in the background (a workflow's resume items may await it).
    background: bool = True
    #: R-RES-7: the relaunch's intercom setting; None keeps the one persisted with the source.
    intercom: IntercomMode | None = None
    #: R-RES-6 attach as chain root: with steps, live background run `run_id` is not
    #: relaunched; it becomes step 0 of a new background chain of these steps, with its own
    #: capacity slot and a new fan-out budget (the source keeps its own).
    attach: list[ChainStep] = Field(default_factory=list, max_length=256)
    #: The client's id for this relaunch, as `Launch.launch_id`: sent again under it, the
    #: resume (or attach) is answered with the run it made; another request under it is
    #: `LaunchIdConflict`.
    launch_id: str | None = _LAUNCH_ID_FIELD

    added_later: ClassVar[tuple[str, ...]] = ("launch_id",)

    @model_validator(mode="after")
    def _one_key(self) -> "Resume":
        if self.launch_id is not None and self.workflow_key is not None:
            # A workflow's resume item is launched once per key already (R-WF-4).
            raise ValueError("a workflow resume item is sent again under its key, not a launch_id")
        return self


class Rerun(Request):
    """Launch a run's child again with the same parameters and a new task, in the foreground
    (R-MISC-2). A finished run stays as it is; a live foreground run with one child is
    superseded: it is stopped, and linked to the rerun (`superseded_by`, `source_run_id`)."""

    type: Literal["runs.rerun"] = "runs.rerun"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = LaunchResult
    run_id: RunId
    task: TaskText = Field(min_length=1)
    child: Count = 0
    #: The rerunning launcher's environment (never persisted; None: the node's own).
    env: Environment | None = None
    #: As `Launch.foreground_pid`: the command that follows the rerun, whose kill -9 ends it
    #: on a node it embeds.
    foreground_pid: int | None = Field(default=None, ge=1, le=MAX_PID)
    #: The client's id for this rerun, as `Launch.launch_id`.
    launch_id: str | None = _LAUNCH_ID_FIELD

    added_later: ClassVar[tuple[str, ...]] = ("foreground_pid", "launch_id")


class AppendResult(Message):
    run_id: str
    steps: int
    pending_appends: int
    text: str


class Append(Request):
    """Queue steps on a running background chain; claims and the append exist together."""

    type: Literal["runs.append"] = "runs.append"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = AppendResult
    run_id: RunId
    steps: list[ChainStep] = Field(min_length=1, max_length=64)
    #: The client's id for this append (docs/api.md, "Launching again"): the same append sent
    #: again under it (its answer lost) is answered as the first one was and queues nothing
    #: more; another append under it, on the same chain, is refused (`BadRequest`).
    append_id: str | None = _LAUNCH_ID_FIELD

    added_later: ClassVar[tuple[str, ...]] = ("append_id",)


REQUESTS = (Resume, Rerun, Append)
