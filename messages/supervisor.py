"""Protocol of the RunSupervisor: launch, watch, show, list and stop runs (its pause and
checkpoint requests are in pauses.py, what makes a run from an existing one (resume, rerun,
append) in lineage.py, `runs.prune` in retention.py).

A launch carries everything the launcher resolved on its side (the agent definitions it found,
its depth, its inherited fan-out descriptor and its configured limits), so a node can serve
launchers with different project directories and configs. Limits are validated here; the
lenient config resolvers of SPEC §2 live in runtime.config and run before a request is built.
"""

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from subagents_node.messages.base import Message, Request, ResultType
from subagents_node.messages.domains import (
    MAX_TASK_CHARS,
    Command,
    Count,
    Depth,
    EncodedDescriptor,
    Environment,
    FsPath,
    NonEmptyFsPath,
    NonEmptyLabel,
    NonEmptyShortText,
    PositiveCount,
    RunId,
    Seq,
    SessionId,
    ShortText,
    TaskText,
    TimeoutMs,
    Timestamp,
    Token,
    WaitS,
)
from subagents_node.messages.runs import MAX_PID, ProofState, RunState

SUPERVISOR = "supervisor"

RunMode = Literal["single", "parallel", "chain", "workflow"]
#: How a run came from its source run: resumed (R-RES), rerun (R-MISC-2), or a background chain
#: the live source was attached to as step 0 (R-RES-6).
SourceKind = Literal["resume", "rerun", "attach"]
IntercomMode = Literal["on", "off"]
#: R-WF-4: workflow child keys.
WORKFLOW_KEY = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
#: A client's id for one launch (a uuid4's hex fits): bounded, and only characters that need no
#: quoting in a log line or a file name.
LAUNCH_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: A child the run has not started yet is `pending`; the others are messages.runs.ChildState.
ChildViewState = Literal["pending", "running", "complete", "failed", "stopped"]
TaskDelivery = Literal["argv", "stdin", "file", "auto"]
PauseKind = Literal["interrupt", "checkpoint"]
_MAX_TASK = MAX_TASK_CHARS


class AgentPlan(Message):
    """An agent as the launcher resolved it (runtime.agents): a command line and its settings."""

    name: NonEmptyLabel
    command: Command
    task_delivery: TaskDelivery = "auto"
    timeout_ms: TimeoutMs | None = None
    env: Environment = Field(default_factory=dict)
    output: FsPath | None = None
    fanout: bool = False
    max_subagent_depth: Depth | None = None
    system_prompt: TaskText = ""
    agent_dir: FsPath = ""


class TaskItem(Message):
    agent: AgentPlan
    task: TaskText
    cwd: FsPath | None = None
    output: FsPath | None = None


#: R-FAN-21: the most items one dynamic step may materialize.
MAX_EXPAND_ITEMS = 1024
#: R-FAN-21: where an expand step's template task receives its item.
ITEM = "{item}"
StepKind = Literal["run", "expand", "checkpoint"]


class ChainStep(Message):
    """A chain step: `run` (one item, or several run together with `parallel`), `expand`
    (R-FAN-21: one template item, run once per line of the previous step's output, or per
    element of the JSON list it wrote, with `{item}` replaced) or `checkpoint` (R-RUN-2: no
    item; the run pauses until `approve` or `reject`, with `note` shown while it waits)."""

    items: list[TaskItem] = Field(default_factory=list, max_length=256)
    parallel: bool = False
    kind: StepKind = "run"
    #: expand only: the most items it may materialize (R-SPN-3 counts it as the step's spawns).
    max_items: int | None = Field(default=None, ge=1, le=MAX_EXPAND_ITEMS)
    note: ShortText = ""

    @model_validator(mode="after")
    def _items_match_kind(self) -> "ChainStep":
        if self.kind == "checkpoint":
            if self.items or self.parallel:
                raise ValueError("a checkpoint step has no items")
        elif self.kind == "expand":
            if len(self.items) != 1 or self.parallel:
                raise ValueError("an expand step has exactly one template item")
        elif not self.items:
            raise ValueError("a chain step has one or more items")
        elif not self.parallel and len(self.items) != 1:
            raise ValueError("a sequential chain step has exactly one item")
        if self.max_items is not None and self.kind != "expand":
            raise ValueError("max_items is for expand steps only")
        return self


class Snapshots(Message):
    """The ledgers as this launch left them (R-ADM-7, R-FAN-25)."""

    capacity_used: int | None = None
    capacity_limit: int | None = None
    fanout_used: int
    fanout_limit: int
    fanout_remaining: int
    fanout_root: str = ""


class ChildView(Message):
    child_id: str
    index: int
    label: str
    agent: str
    state: ChildViewState
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    error: str = ""
    output: str = ""
    stdout_path: str = ""
    stderr_path: str = ""
    #: R-RUN-5: the proof its shim's reports gave when it ended (None while it runs).
    proof_state: ProofState | None = None


class IntercomMessage(Message):
    run_id: str
    child_id: str = ""
    text: str
    ts: float


class RunView(Message):
    run_id: str
    session_id: str
    mode: RunMode
    background: bool
    state: RunState
    label: str
    depth: int
    parent_run_id: str | None
    root_run_id: str
    run_dir: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    deadline_at: float | None
    error: str
    output: str
    snapshots: Snapshots
    #: The run's fan-out descriptor, encoded as children receive it (R-FAN-4).
    fanout_descriptor: str = ""
    #: This execution's runner id (§0.1): the identity its capacity slot records.
    runner_id: str = ""
    #: The run this one came from (R-RES, R-MISC-2, R-RES-6) and how; its workflow key if it is
    #: a workflow child.
    source_run_id: str | None = None
    source_kind: SourceKind | None = None
    workflow_key: str | None = None
    #: The rerun that replaced this run while it was live (R-MISC-2: `supersededByRunId`).
    superseded_by: str | None = None
    #: R-RUN-2: why a `paused` run waits (`checkpoint`: a decision; `interrupt`: a resume),
    #: and the chain step it continues from.
    paused: PauseKind | None = None
    paused_step: int | None = None
    checkpoint_note: str = ""
    #: The run that resumed (or, for an approved checkpoint after a restart, continued) this one.
    resumed_by: str | None = None
    #: Messages children sent to this run (R-ICB), oldest first.
    intercom: list[IntercomMessage] = Field(default_factory=list)
    children: list[ChildView]
    #: Multi-host: the node the run and its children are on, as its home names it (`home`, or
    #: a worker's name). Set by the client that gathered views of several hosts
    #: (`client.hosts`); "" in the answer of one node.
    host: str = ""


class LaunchResult(Message):
    run: RunView


class Launch(Request):
    type: Literal["runs.launch"] = "runs.launch"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = LaunchResult

    session_id: SessionId
    mode: RunMode
    background: bool
    items: list[TaskItem] = Field(default_factory=list, max_length=1024)
    chain: list[ChainStep] = Field(default_factory=list, max_length=256)
    concurrency: int = Field(default=4, ge=1, le=64)
    cwd: NonEmptyFsPath
    timeout_ms: TimeoutMs | None = None
    config_timeout_ms: TimeoutMs | None = None
    depth: Depth = 0
    max_depth: Depth = 2
    inherited_fanout: EncodedDescriptor | None = None
    parent_run_id: RunId | None = None
    capacity_limit: Count = 0
    spawns_per_run: PositiveCount = 64
    spawns_per_session: Count | None = None
    #: The launcher's environment, the base of every child's (None: the node's own).
    env: Environment | None = None
    #: R-ICB-1..3: `off` disables intercom for this run only (children cannot message it).
    intercom: IntercomMode = "on"
    #: Workflow children (R-WF-3): the key, and the host's proof that it already claimed
    #: `workflow[key]` (R-FAN-20). A launch carrying either without the workflow's token is
    #: refused (R-FAN-24), so no child can skip its own claim.
    workflow_key: str | None = Field(default=None, max_length=128, pattern=WORKFLOW_KEY)
    fanout_admitted: bool = False
    workflow_token: Token | None = None
    #: R-RES-6: the live background run that is this chain's step 0 (its output is the first
    #: step's `{previous}`). Set by the node for `runs.resume` with `attach`; a public launch
    #: carrying it is refused.
    attached_run_id: RunId | None = None
    #: A resume continues a chain from step `chain_offset` of its source (paths keep their
    #: indices, R-FAN-12) and inherits its absolute deadline (R-TMO-8).
    chain_offset: Count = 0
    deadline_at: Timestamp | None = None
    #: A resumed chain: its source's last output, what its first step's `{previous}` (or an
    #: expand step's input) refers to.
    seed_previous: TaskText | None = None
    #: The pid of the foreground command that launches this run and follows it. When that
    #: command embeds the node the run is launched on, the run's children (and its nested
    #: runs') end with that process: killed with -9, it can stop nothing, and its shims stop
    #: their trees themselves (DESIGN §1, embedded mode). Every node keeps it with the run (by
    #: pid and start time), so a node that this command embeds later, to take a lost node's
    #: place, binds the run to it as it adopts it (actors/runs/rebinding.py).
    foreground_pid: int | None = Field(default=None, ge=1, le=MAX_PID)
    #: The client's id for this launch (docs/api.md, "Launching again"): the same request sent
    #: again under it (its answer lost to a timeout or a lost node) is answered with the run it
    #: launched, never a second one; another request under it is `LaunchIdConflict`.
    launch_id: str | None = Field(default=None, max_length=64, pattern=LAUNCH_ID)

    added_later: ClassVar[tuple[str, ...]] = ("foreground_pid", "launch_id")

    @model_validator(mode="after")
    def _shape_matches_mode(self) -> "Launch":
        if self.mode == "single" and (len(self.items) != 1 or self.chain):
            raise ValueError("a single run has exactly one item and no chain")
        if self.mode == "parallel" and (not self.items or self.chain):
            raise ValueError("a parallel run has one or more items and no chain")
        if self.mode == "chain" and (not self.chain or self.items):
            raise ValueError("a chain run has one or more chain steps and no items")
        if self.mode == "chain" and all(step.kind == "checkpoint" for step in self.chain):
            raise ValueError("a chain run has a step with an agent, not only checkpoints")
        if self.mode == "workflow" and (len(self.items) != 1 or self.chain):
            raise ValueError("a workflow run has exactly one item (its host) and no chain")
        if self.fanout_admitted and not self.workflow_key:
            raise ValueError("fanout_admitted is set only by a workflow host, with a key")
        if self.launch_id is not None and self.workflow_key is not None:
            # A workflow child is launched once per key already (R-WF-4): one id is enough.
            raise ValueError("a workflow child is sent again under its key, not a launch_id")
        return self


class RunEvent(Message):
    seq: int
    ts: float
    kind: str
    data: dict[str, str | int | float | bool | None]
    run_id: str = ""


class RunEvents(Message):
    """A run's view and its events after the watch's `after_seq`, at most a page of them
    (MAX_WATCH_EVENTS): `more` says later ones wait for the next watch, from `last_seq`. A run
    with more events than a frame may list (a flood of intercom, thousands of children) made
    the whole list one reply that no decoder took, and every wait on it timed out."""

    run: RunView
    events: list[RunEvent]
    last_seq: int
    more: bool = False


class Watch(Request):
    """Long-poll: answered as soon as the run has events after `after_seq`, or after `wait_s`."""

    type: Literal["runs.watch"] = "runs.watch"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = RunEvents
    run_id: RunId
    after_seq: Seq = 0
    wait_s: WaitS = 10.0

    @property
    def held_s(self) -> float:
        return float(self.wait_s)


class Show(Request):
    type: Literal["runs.show"] = "runs.show"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = RunView
    run_id: RunId = Field(description="a run id or a unique prefix of one")


class RunList(Message):
    runs: list[RunView]
    #: The node's last run event when the listing was read (None from an older node): a view
    #: that lists the runs and then follows `runs.watch_all` from there never replays the
    #: event history (the fleet view).
    last_seq: int | None = None


class ListRuns(Request):
    type: Literal["runs.list"] = "runs.list"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = RunList
    session_id: SessionId | None = None
    root_run_id: RunId | None = None
    #: Only the runs this run launched (a workflow's children, by the index on parent_run_id).
    parent_run_id: RunId | None = None
    active_only: bool = False
    limit: int = Field(default=50, ge=1, le=1000)
    #: Paging: the runs after this one (the last of the previous page) in the listing's order,
    #: newest first; a listing longer than `limit` is read page by page, never all at once.
    after_run_id: RunId | None = None


class Stop(Request):
    type: Literal["runs.stop"] = "runs.stop"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = RunView
    run_id: RunId


class StopReleased(Request):
    """Stop every live run of this node that holds a capacity slot, with `reason`: its home
    forgot this worker while it was cut off, and released those slots (R-CAP-1: the home's
    ledger is the truth), so none of their children may go on (runtime/node/homejoin.py sends
    it when the link is told so). The node's own act: refused from every tcp peer."""

    type: Literal["runs.stop_released"] = "runs.stop_released"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = RunList
    local_only: ClassVar[bool] = True
    reason: NonEmptyShortText


#: The most events one `runs.watch` answer carries (RunEvents.more: the rest follow).
MAX_WATCH_EVENTS = 1000


class FleetEvents(Message):
    """Events of every run after `after_seq` (node-wide order) and the runs they touched."""

    events: list[RunEvent]
    runs: list[RunView]
    last_seq: int


class WatchAll(Request):
    """Long-poll over every run (the fleet view): answered on the next event, or after wait_s."""

    type: Literal["runs.watch_all"] = "runs.watch_all"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = FleetEvents
    after_seq: Seq = 0
    wait_s: WaitS = 10.0
    limit: int = Field(default=500, ge=1, le=5000)

    @property
    def held_s(self) -> float:
        return float(self.wait_s)


class Intercom(Request):
    """A child's message to its run (R-ICB): shown in the run's result and the fleet view."""

    type: Literal["runs.intercom"] = "runs.intercom"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = IntercomMessage
    run_id: RunId
    child_id: Annotated[str, Field(max_length=128)] = ""
    text: str = Field(min_length=1, max_length=4000)


REQUESTS = (
    Launch,
    Watch,
    WatchAll,
    Show,
    ListRuns,
    Stop,
    StopReleased,
    Intercom,
)
