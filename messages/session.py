"""Protocol of the session owner: the session spawn budget with grants (SPEC §6, R-SPN-1..6).

Owns the request/result models of `session.*`, the session's typed errors and the texts of
R-SPN-2/R-SPN-4/R-SPN-6. R-SPN-3 (how many spawns a launch requests) depends on the launch's
shape and lives with the launch plan (actors.runplan). It must never import runtime or actors.

Errors defined here (all carry their numbers in `details`):

    SubagentsError
    ├── SpawnBudgetExceeded   spawn_budget_exceeded   session_id, used, limit, requested, remaining
    ├── GrantRejected         grant_rejected          session_id, reason (GRANT_REFUSALS), …
    ├── NestedCallBlocked     nested_call_blocked     depth, max_depth           (R-CFG-8)
    └── InvalidTimeout        invalid_timeout         name, value                (R-TMO-3)

The last two belong to launch admission rather than to the owner; they live here because a
launch is admitted for a session, and runtime.config (which raises them) may not define wire
errors itself.
"""

from typing import ClassVar, Literal

from subagents_node.messages.base import Message, Request, ResultType
from subagents_node.messages.domains import Count, Depth, SessionId, SignedCount, Token
from subagents_node.messages.domains import RunId as RunId
from subagents_node.messages.runs import RunState

SESSION = "session"

#: History entries kept per session (R-SPN-6: "keeps only the last 20 entries").
GRANT_HISTORY_MAX = 20


#: Runs in these states block grants (R-SPN-6: "queued or running").
ACTIVE_RUN_STATES: frozenset[str] = frozenset({"queued", "running"})
#: Runs in these states are forgotten by the session owner.
TERMINAL_RUN_STATES: frozenset[str] = frozenset({"complete", "failed", "stopped", "rejected"})

GrantAuthority = Literal["confirm", "auto", "forbid"]


# -- results ----------------------------------------------------------------------------------


class GrantRecord(Message):
    """One applied grant (R-SPN-6). `granted_at` is wall-clock milliseconds since the epoch."""

    session_id: str
    amount: int
    granted_at: int
    previous_limit: int
    limit: int


class SpawnSnapshot(Message):
    """The session's spawn budget (R-SPN-2). `None` limits mean unlimited.

    A session that was never opened reads as unlimited with nothing used (`opened` False): the
    owner knows no cap for it, and unlimited sessions never accumulate usage (R-SPN-5).
    """

    session_id: str
    opened: bool
    used: int
    limit: int | None
    granted: int
    remaining: int | None
    grant_remaining: int | None
    configured: int | None
    history: list[GrantRecord]

    @property
    def unlimited(self) -> bool:
        return self.limit is None

    def text(self) -> str:
        """The spec's text form (R-SPN-2)."""
        if self.limit is None:
            return "Spawn budget: unlimited"
        return (
            f"Spawn budget: {self.used}/{self.limit} used, {self.remaining} remaining "
            f"(configured {self.configured}; granted {self.granted}; "
            f"grant allowance {self.grant_remaining})"
        )


class OpenSessionResult(Message):
    """`created` is False for a repeated open; the first configured limit always stays."""

    created: bool
    requested_limit: int | None
    limit_differs: bool
    note: str
    snapshot: SpawnSnapshot


class ReserveResult(Message):
    """`counted` is what was added to `used`: 0 for an unlimited session (R-SPN-5), and 0 for a
    reservation made already under the same `reservation_id` (`repeated`: it counted then)."""

    counted: int
    snapshot: SpawnSnapshot
    repeated: bool = False


class GrantBasis(Message):
    """The budget state a user confirmed a grant against (R-SPN-6's last condition)."""

    used: Count
    granted: Count


class GrantResult(Message):
    """The answer to a grant that was not refused.

    outcome:
    - `granted`: applied; `entry` is the history record;
    - `confirmation_required`: authority `confirm` and not yet confirmed; nothing changed. Show
      `snapshot` to the user and resend with `confirmed=True, expected=basis`;
    - `cancelled`: the user declined (built by the client; not an error, adds nothing).
    """

    applied: bool
    outcome: Literal["granted", "confirmation_required", "cancelled"]
    additional: int
    entry: GrantRecord | None
    basis: GrantBasis
    snapshot: SpawnSnapshot

    def text(self) -> str:
        spawns = "spawn" if self.additional == 1 else "spawns"  # "1 more spawns" read wrong
        if self.entry is not None:
            head = (
                f"Granted {self.additional} more {spawns} "
                f"(limit {self.entry.previous_limit} -> {self.entry.limit})."
            )
        elif self.outcome == "cancelled":
            head = "Spawn budget grant cancelled; nothing changed."
        else:
            head = f"Grant {self.additional} more {spawns}? Confirmation required."
        return f"{head}\n{self.snapshot.text()}"


class TrackRunResult(Message):
    """How many of the session's runs are queued or running after the update."""

    active: int


class TrackedRun(Message):
    run_id: str
    state: RunState
    updated_at: float


class SessionStatus(Message):
    snapshot: SpawnSnapshot
    active: int
    runs: list[TrackedRun]

    def text(self) -> str:
        lines = [self.snapshot.text(), f"Active runs: {self.active}"]
        lines += [f"  {r.run_id}  {r.state}" for r in self.runs]
        return "\n".join(lines)


# -- requests ---------------------------------------------------------------------------------


class OpenSession(Request):
    """Open a session with its configured spawn cap (R-SPN-1; R-CFG-4: None or 0 = unlimited).

    Idempotent: a second open keeps the first limit and says so (`limit_differs`).
    """

    type: Literal["session.open"] = "session.open"
    target: ClassVar[str] = SESSION
    Result: ClassVar[ResultType] = OpenSessionResult
    session_id: SessionId
    configured_limit: Count | None = None


class SpawnSnapshotQuery(Request):
    type: Literal["session.spawn_snapshot"] = "session.spawn_snapshot"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = SESSION
    Result: ClassVar[ResultType] = SpawnSnapshot
    session_id: SessionId


class SpawnPreflight(Request):
    """Would `requested` spawns fit (R-SPN-4)? Changes nothing; answers the snapshot.

    A reservation made already under `reservation_id` (SpawnReserve) fits: it is counted."""

    type: Literal["session.spawn_preflight"] = "session.spawn_preflight"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = SESSION
    Result: ClassVar[ResultType] = SpawnSnapshot
    session_id: SessionId
    requested: Count
    reservation_id: Token | None = None


class SpawnReserve(Request):
    """Preflight, then count the spawns when a cap exists (R-SPN-5).

    With `reservation_id` (one per launch, kept when the launch is sent again) the spawns are
    counted at most once: the same id, session and count again (its first answer was lost with
    its node) counts nothing more and is not refused, however full the budget is now
    (`repeated`); the id with another session or count is refused. Nothing is refunded."""

    type: Literal["session.spawn_reserve"] = "session.spawn_reserve"
    target: ClassVar[str] = SESSION
    Result: ClassVar[ResultType] = ReserveResult
    session_id: SessionId
    requested: Count
    reservation_id: Token | None = None

    def resendable_as_sent(self) -> bool:
        return self.reservation_id is not None


class GrantSpawns(Request):
    """Raise the session's limit by `additional` (R-SPN-6).

    `depth` 0 is the root interactive parent. `additional` may be zero or negative on the wire
    so that R-SPN-6's own rule refuses it, in the rule's order; only its magnitude is bounded.
    """

    type: Literal["session.grant"] = "session.grant"
    target: ClassVar[str] = SESSION
    Result: ClassVar[ResultType] = GrantResult
    session_id: SessionId
    additional: SignedCount
    depth: Depth = 0
    authority: GrantAuthority = "confirm"
    confirmed: bool = False
    expected: GrantBasis | None = None


class TrackRun(Request):
    """Record a run's state; terminal runs are forgotten. Answers the active-run count."""

    type: Literal["session.track_run"] = "session.track_run"
    target: ClassVar[str] = SESSION
    Result: ClassVar[ResultType] = TrackRunResult
    #: The same state twice is the state once (SessionActor.track_run); the run supervisor's
    #: outbox relies on it.
    idempotent: ClassVar[bool] = True
    session_id: SessionId
    run_id: RunId
    state: RunState


class SessionStatusQuery(Request):
    type: Literal["session.status"] = "session.status"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = SESSION
    Result: ClassVar[ResultType] = SessionStatus
    session_id: SessionId


REQUESTS: tuple[type[Request], ...] = (
    OpenSession,
    SpawnSnapshotQuery,
    SpawnPreflight,
    SpawnReserve,
    GrantSpawns,
    TrackRun,
    SessionStatusQuery,
)
