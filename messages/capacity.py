"""Protocol of the capacity owner: active async run slots per session (SPEC §4, R-CAP-*).

Owns the request and result models the CapacityLedger serves and the errors it raises:

    SubagentsError
    └── CapacityError                    capacity_error
        ├── CapacityExhausted            capacity_exhausted            used, limit
        ├── CapacityOwnershipChanged     capacity_ownership_changed    run_id, session_id,
        │                                                              slot, reason
        ├── CapacityNotTransferable      capacity_not_transferable     source_run_id, reason
        └── CapacityRunAlreadyHeld       capacity_run_already_held     run_id, session_id, slot

A handle (`SlotHandle`) is what a launcher holds after an acquire or a transfer: the slot's
place (session, index) and its compare-and-set identity (token, run id, generation; R-CAP-4).
Every handle operation names all of it, so a stale or forged handle is refused (rollback
answers false instead, R-CAP-17). Times are wall-clock seconds since the epoch.

Hosts (DESIGN §1, multi-host): every slot records the node its run executes on (`host`, ""
for the home node). A lost worker's slots stay held until its runs are proven ended, or until
an operator declares the worker lost: `capacity.release_host` frees every slot of that host
in one transaction and writes one audit row per slot (proof state `operator`), which
`capacity.releases` lists; `capacity.hosts` counts the slots each host holds. Those three are
messages/capacity_hosts.py's, and `capacity.holders` (who holds a session's slots) is
messages/capacity_holders.py's. A release is an operator's act: the node serves it on its ipc
socket only (`local_only`), never to a peer.
"""

from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from subagents_node.messages.base import Message, Request, ResultType
from subagents_node.messages.domains import (
    Count,
    ErrorText,
    ExitStatus,
    FsPath,
    Generation,
    HostOrHome,
    Pid,
    RunId,
    SessionId,
    ShortText,
    Slot,
    Timestamp,
    Token,
)
from subagents_node.messages.domains import Ttl as DomainTtl

CAPACITY = "capacity"

SlotKind = Literal["runner", "workflow"]
#: States a run supervisor reports when a run stops running (R-RUN-2 minus queued/running).
ReportedState = Literal["complete", "failed", "stopped", "rejected", "paused"]
TERMINAL_STATES: frozenset[str] = frozenset({"complete", "failed", "stopped", "rejected"})
ProofState = Literal["observed", "unknown", "not-started"]
#: The proof state an operator's release records: no process was seen to end (DESIGN §2).
OPERATOR_PROOF = "operator"
Relation = Literal["current", "source", "none"]
VerdictKind = Literal["releasable", "retained", "not-owned"]

#: A pool cap: 0 means unlimited (R-CFG-2). Strict, so 2.5, "4" and True are schema errors: the
#: lenient mapping of odd config values to "unlimited" (R-CFG-1) is the config layer's job.
Limit = Count
Ttl = DomainTtl
#: Most entries one listing answers with (`capacity.releases`, `capacity.hosts`, the handles a
#: release names): a reply stays far below the frame limit however much the ledger holds.
MAX_LISTED = 1000


# -- models ---------------------------------------------------------------------------------


class SlotHandle(Message):
    """The holder's copy of a slot: its place and its fencing identity."""

    session_id: SessionId
    slot: Slot
    token: Token
    run_id: RunId
    generation: Generation
    kind: SlotKind


class CapacitySnapshot(Message):
    """Occupied slots of a session pool, and the cap (0 = unlimited), R-CAP-26."""

    used: int
    limit: int


class AcquireResult(Message):
    """A granted slot, or no handle when the cap is unlimited (R-CAP-8), plus the snapshot."""

    handle: SlotHandle | None
    snapshot: CapacitySnapshot


class RollbackResult(Message):
    """R-CAP-15..17: whether the rollback happened and, for a transfer, the restored source."""

    rolled_back: bool
    handle: SlotHandle | None = None


#: a child's proof states that end it for good (R-RUN-5): seen to end, or never started
SETTLED_PROOFS = ("observed", "not-started")


class RunnerProof(Message):
    """Process-terminal proof of one runner execution, written by the process's parent."""

    state: ProofState
    runner_id: Annotated[str, Field(max_length=128)] = ""
    pid: Pid | None = None
    process_start_time: Timestamp | None = None
    exit_code: ExitStatus | None = None
    signal: ExitStatus | None = None
    observed_at: Timestamp | None = None
    reason: ShortText = ""
    error: ErrorText = ""

    @classmethod
    def of_children(
        cls, proofs: Sequence[str], runner_id: str, pid: int | None, now: float, error: str
    ) -> "RunnerProof":
        """The run-level proof from its children's: observed only when every child's tree was
        seen to end, not-started when no child process ever existed (R-RUN-5, R-CAP-21).
        Here, not in the supervisor, because `debug-run` shows the same verdict client-side."""
        state: ProofState
        if proofs and all(p == "not-started" for p in proofs):
            state, reason = "not-started", "no child process started"
        elif all(p in SETTLED_PROOFS for p in proofs):
            state, reason = "observed", "every child's process tree was observed to end"
        else:
            state, reason = "unknown", "a child's process tree was not observed to end"
        return cls(
            state=state,
            runner_id=runner_id,
            pid=pid,
            observed_at=now,
            reason=reason,
            error=error if state == "not-started" else "",
        )


class TerminalFacts(Message):
    """What the run supervisor last reported about a slot's run (kept for verdicts)."""

    state: ReportedState
    live_process: bool = False
    proof: RunnerProof | None = None
    workflow_children_proven: bool = False
    reason: str = ""
    reported_at: float


class SlotRecord(Message):
    """The owner record of one occupied slot (R-CAP-2), as stored and as `inspect` shows it."""

    session_id: str
    session_key: str
    slot: int
    token: str
    run_id: str
    source_run_id: str | None = None
    generation: int
    kind: SlotKind
    async_dir: str = ""
    #: The node the run executes on; "" = the home node (and every record written before
    #: hosts existed, so old rows and old `prev_record` JSON read as home).
    host: str = ""
    reserved_at: float
    expires_at: float | None = None
    runner_id: str | None = None
    runner_started_at: float | None = None
    pid: int | None = None
    process_start_time: float | None = None
    terminal_state: ReportedState | None = None
    proof_state: str | None = None
    terminal: TerminalFacts | None = None
    #: The complete record this one replaced by a transfer; a rollback restores it (R-CAP-16).
    prev_record: "SlotRecord | None" = None

    @property
    def started(self) -> bool:
        """R-CAP-6: a record is started iff it has a runner id or a start time."""
        return self.runner_id is not None or self.runner_started_at is not None

    def handle(self) -> SlotHandle:
        return SlotHandle(
            session_id=self.session_id,
            slot=self.slot,
            token=self.token,
            run_id=self.run_id,
            generation=self.generation,
            kind=self.kind,
        )


class Verdict(Message):
    """A release verdict (§4.6) and the reason `inspect` and `debug.run` show."""

    verdict: VerdictKind
    reason: str


class Inspection(Message):
    """R-CAP-27: how a run relates to the slots, the owner record, and the release verdict."""

    relation: Relation
    owner: SlotRecord | None = None
    verdict: Verdict


# -- requests -------------------------------------------------------------------------------


#: A slot request's asker: a worker's name (stamped by the home, whatever the worker wrote),
#: "" for the home node and its operators. A worker acts only on the slots of its own host.
AskingHost = HostOrHome


class Acquire(Request):
    """Take the lowest free slot in [0, limit) for `run_id` (R-CAP-8..12).

    With `acquire_id` (any id its caller picks once per acquire, a uuid) the slot's token is
    that id, and the same acquire sent again, after its answer was lost with a restarted
    capacity owner, is answered with the slot it took instead of being refused as the run's
    second slot: a launch no longer fails, its slot held until its TTL, because the owner
    died between committing the slot and answering. An id that already names another run's
    slot in the session is refused (BadRequest, field `acquire_id`) and takes nothing."""

    type: Literal["capacity.acquire"] = "capacity.acquire"
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = AcquireResult

    session_id: SessionId
    limit: Limit
    run_id: RunId
    kind: SlotKind = "runner"
    async_dir: FsPath = ""
    #: Seconds an unstarted slot lives; default: the node setting `reservation_ttl_s` (60).
    ttl_s: Ttl | None = None
    #: The node the run executes on ("" = the home node); `release_host` frees by it.
    host: HostOrHome = ""
    acquire_id: Token | None = None

    added_later: ClassVar[tuple[str, ...]] = ("acquire_id",)

    def resendable_as_sent(self) -> bool:
        return self.acquire_id is not None


class MarkStarted(Request):
    """Record the runner's identity on the slot (R-CAP-13); idempotent for one runner id."""

    type: Literal["capacity.mark_started"] = "capacity.mark_started"
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = SlotHandle
    idempotent: ClassVar[bool] = True  # R-CAP-13: the same runner id twice

    handle: SlotHandle
    runner_id: Token
    pid: Pid | None = None
    process_start_time: Timestamp | None = None
    host: AskingHost = ""


class MarkWorkflowStarted(Request):
    """Record that a workflow controller is live on its `workflow` slot (R-CAP-14)."""

    type: Literal["capacity.mark_workflow_started"] = "capacity.mark_workflow_started"
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = SlotHandle
    idempotent: ClassVar[bool] = True  # R-CAP-14: a start time already set is kept

    handle: SlotHandle
    host: AskingHost = ""


class Rollback(Request):
    """Undo an unstarted acquire or transfer (R-CAP-15..17). Never raises for a mismatch."""

    type: Literal["capacity.rollback"] = "capacity.rollback"
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = RollbackResult

    handle: SlotHandle
    host: AskingHost = ""
    #: The handle fences it, so an admission that could not send it owes it through its
    #: outbox (actors/runs/outbox.py) until the capacity owner answers.
    idempotent: ClassVar[bool] = True

    def resendable_as_sent(self) -> bool:
        """The handle fences it (token, run, generation): sent again after its answer was lost,
        one that was applied finds its record gone or restored and changes nothing (it
        answers `rolled_back` false), so the slot is freed once either way."""
        return True


class RollbackAcquire(Request):
    """Undo the grant an acquire made under `acquire_id`, for a caller that never learned its
    handle: its answer was lost (a worker's home went down, or the link to it was lost, after
    the capacity owner committed the slot and before its answer arrived), so the caller gave
    the acquire up and owes it back. The slot `run_id` holds in the session is freed when its
    token is `acquire_id` (the id is the grant's token, `Acquire`) and it is unstarted
    (R-CAP-15); otherwise (no such grant: the acquire was never applied, or was rolled back or
    expired since; another grant; a started slot, R-CAP-17) it answers `rolled_back` false and
    changes nothing. So it is idempotent, and a run supervisor owes it through its outbox until
    the capacity owner answers."""

    type: Literal["capacity.rollback_acquire"] = "capacity.rollback_acquire"
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = RollbackResult
    idempotent: ClassVar[bool] = True

    session_id: SessionId
    run_id: RunId
    acquire_id: Token
    host: AskingHost = ""


class Transfer(Request):
    """Move a finished source run's slot to its resume (R-CAP-18..20, A-2 resolved).

    With `transfer_id` (one per transfer, a uuid) it may be sent again after its answer was
    lost with a restarted capacity owner: the slot it lent to `run_id` is answered again (or,
    where the source held none, the slot acquired under that id)."""

    type: Literal["capacity.transfer"] = "capacity.transfer"
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = AcquireResult

    session_id: SessionId
    limit: Limit
    source_run_id: RunId
    run_id: RunId
    async_dir: FsPath = ""
    ttl_s: Ttl | None = None
    #: Where the resume executes ("" = home), not where the source ran: the slot moves with
    #: the run that now holds it.
    host: HostOrHome = ""
    transfer_id: Token | None = None

    added_later: ClassVar[tuple[str, ...]] = ("transfer_id",)

    def resendable_as_sent(self) -> bool:
        return self.transfer_id is not None


class ReportTerminal(Request):
    """The run supervisor's report that a run ended or paused; applies §4.6's verdict."""

    type: Literal["capacity.report_terminal"] = "capacity.report_terminal"
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = Verdict
    #: A second copy finds the slot freed, or the same facts stored: nothing changes
    #: (CapacityLedger.report_terminal). The run supervisor's outbox relies on it.
    idempotent: ClassVar[bool] = True

    session_id: SessionId
    run_id: RunId
    #: The slot generation the run held; None = whichever the run holds now.
    generation: Generation | None = None
    state: ReportedState
    #: Whether a process (runner, or a workflow controller) of this run is still alive.
    live_process: bool = False
    proof: RunnerProof | None = None
    #: Workflow slots only: every async child has matching observed proof (R-CAP-22 rule 7).
    workflow_children_proven: bool = False
    #: Workflow slots only: why the children are not proven, shown by `inspect`.
    reason: ShortText = ""
    host: AskingHost = ""


class Inspect(Request):
    """R-CAP-27: find the slot that records `run_id` as its owner or as its transfer source."""

    type: Literal["capacity.inspect"] = "capacity.inspect"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = Inspection

    run_id: RunId
    session_id: SessionId | None = None


class Snapshot(Request):
    """R-CAP-26: `{used, limit}` of a session pool (limit 0 = unlimited)."""

    type: Literal["capacity.snapshot"] = "capacity.snapshot"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = CapacitySnapshot

    session_id: SessionId
    limit: Limit = 0


REQUESTS: tuple[type[Request], ...] = (
    *(Acquire, MarkStarted, MarkWorkflowStarted, Rollback, RollbackAcquire, Transfer),
    ReportTerminal,
    *(Inspect, Snapshot),
)
