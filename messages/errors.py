"""The one error tree: every error the product raises on purpose, and how it crosses the wire.

    SubagentsError                       code                        details
    ├── BadRequest                       bad_request                 reason, field errors
    │   ├── MalformedFrame               malformed_frame             reason
    │   ├── FrameTooLarge                frame_too_large             size, limit
    │   ├── UnsupportedProtocol          unsupported_protocol        got, supported
    │   ├── UnknownMessageType           unknown_type                type
    │   ├── FanoutNotAuthorized          fanout_not_authorized
    │   ├── RunCwdMissing                cwd_missing                 cwd
    │   ├── PreviousUnavailable          previous_unavailable
    │   ├── RunIdAmbiguous               run_id_ambiguous            run_id, matches
    │   ├── LaunchIdConflict             launch_id_conflict          launch_id, run_id
    │   ├── WorkflowChildRefused         workflow_child_refused
    │   └── RunFileInvalid               run_file_invalid            file
    ├── UnknownTarget                    unknown_target              target
    ├── Busy                             busy                        target, mailbox|watchers,
    │                                                                limit
    ├── Internal                         internal                    actor
    ├── OwnerUnavailable                 unavailable                 owner, state, reason
    ├── MembershipRefused                membership_refused          name, reason
    ├── RecordQuarantined                record_quarantined          owner, table, key, reason
    ├── StoreError                       store_error                 path
    │   └── StoreFull                    store_full                  actor, reason
    ├── NodeError (client side: the node could not be reached; never on the wire)
    │   ├── NodeNotRunning               node_not_running            address
    │   ├── NodeTimeout                  node_timeout                address, timeout_s
    │   ├── BadAddress                   bad_address                 address
    │   ├── NotAuthenticated             not_authenticated           address, reason
    │   ├── NodeAlreadyRunning           node_already_running        pid, state_dir
    │   └── OutOfDescriptors             out_of_descriptors          limit
    ├── UnsafeStateDir                   unsafe_state_dir            path, reason, fix
    ├── KeyFileInvalid                   key_file_invalid            path, reason
    ├── AgentError                       agent_error
    │   ├── AgentNotFound                agent_not_found             name, available
    │   ├── AgentInvalid                 agent_invalid               path, reason
    │   └── AgentCommandNotFound         agent_command_not_found     name, command, path
    ├── CapacityError                    capacity_error
    │   ├── CapacityExhausted            capacity_exhausted          used, limit (R-CAP-12)
    │   ├── CapacityOwnershipChanged     capacity_ownership_changed  run_id, slot, reason
    │   ├── CapacityNotTransferable      capacity_not_transferable   source_run_id, reason
    │   └── CapacityRunAlreadyHeld       capacity_run_already_held   run_id, slot
    ├── FanoutError                      fanout                      snapshot?
    │   ├── FanoutLimitInvalid           fanout_limit_invalid        limit, max
    │   ├── FanoutDescriptorInvalid      fanout_descriptor_invalid   reason
    │   ├── FanoutBudgetUnavailable      fanout_budget_unavailable   budget_id, reason
    │   ├── FanoutDescriptorMismatch     fanout_descriptor_mismatch  budget_id, mismatched
    │   ├── FanoutLimitExceeded          RUN_FANOUT_LIMIT            path, requested, used,
    │   │                                                            limit, remaining (R-FAN-16)
    │   └── FanoutReservationError       fanout_reservation          reservation_id
    │       ├── FanoutReservationUnknown   fanout_reservation_unknown
    │       ├── FanoutReservationExpired   fanout_reservation_expired  state
    │       └── FanoutReservationCommitted fanout_reservation_committed
    ├── SpawnBudgetExceeded              spawn_budget_exceeded       used, limit, requested,
    │                                                                remaining (R-SPN-4)
    ├── GrantRejected                    grant_rejected              reason (R-SPN-6)
    ├── NestedCallBlocked                nested_call_blocked         depth, max_depth (R-CFG-8)
    ├── InvalidTimeout                   invalid_timeout             name, value (R-TMO-3)
    ├── RunStorageFailed                 run_storage_failed          reason (R-ADM-2)
    ├── InjectedFault                    injected_fault              point (tests only)
    ├── RunNotFound                      run_not_found               run_id
    ├── RunNotResumable                  run_not_resumable           run_id (R-RES-1/2)
    ├── DeadlineExpired                  deadline_expired            run_id, deadline_at (R-TMO-8)
    ├── PauseRefused                     pause_refused               run_id, reason (R-RUN-2)
    ├── AppendRejected                   append_rejected             run_id (R-APP-1/2)
    ├── IntercomOff                      intercom_off                run_id (R-ICB-2)
    ├── ConfigError                      config_invalid              key, source, reason
    └── WorkflowError                    workflow_error              key (raised in the host;
                                                                     a key conflict by the node too)
        ├── WorkflowCallInvalid          workflow_call_invalid       key, field   (+BadRequest)
        ├── WorkflowKeyInvalid           workflow_key_invalid        key          (+BadRequest)
        ├── WorkflowKeyConflict          workflow_key_conflict       key          (+BadRequest)
        ├── WorkflowOutputCollision      workflow_output_collision   key, path, first (+BadRequest)
        ├── WorkflowSettled              workflow_settled            key
        ├── WorkflowResultTooLarge       workflow_result_too_large   size, limit
        └── WorkflowHostError            workflow_host_error         variable

An error crosses the wire as ``{code, message, details}``. Every class is defined in this
module, so any process that imports it can rebuild any error: ``SubagentsError.from_wire``
looks the code up in `WIRE_CODES` (built once, below, with every code unique) and re-creates
the exact class with its details. Errors of the layers below (zmq, sqlite3, OSError) are
translated into these types where they are caught, never passed through.

This module imports nothing of ours but constants; the few errors that rebuild a model from
their details (a snapshot, a rejection) import it when asked, and rebuild it as a client reads
a reply (`base.validated_reply`): details a newer node added are dropped, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from subagents_node.messages.constants import MAX_INT32

if TYPE_CHECKING:  # the models a few errors rebuild from their details; imported when used
    from subagents_node.messages.capacity import CapacitySnapshot, SlotHandle
    from subagents_node.messages.fanout import FanoutRejection, FanoutSnapshot


class SubagentsError(Exception):
    """Base of every error this project raises on purpose."""

    code: ClassVar[str] = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> SubagentsError:
        """The exact error a reply carries (its class found by code; unknown codes rebuild as
        the root class, so a newer node's error still reads as a SubagentsError)."""
        code = str(body.get("code", "error"))
        details = body.get("details")
        return _rebuild(
            WIRE_CODES.get(code, SubagentsError),
            str(body.get("message", "")),
            details if isinstance(details, dict) else {},
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.details))


def _rebuild(kind: type[SubagentsError], message: str, details: dict[str, Any]) -> SubagentsError:
    err = kind.__new__(kind)
    SubagentsError.__init__(err, message, **details)
    return err


class BadRequest(SubagentsError):
    code = "bad_request"


class MalformedFrame(BadRequest):
    code = "malformed_frame"


class FrameTooLarge(BadRequest):
    code = "frame_too_large"


class UnsupportedProtocol(BadRequest):
    code = "unsupported_protocol"


class UnknownMessageType(BadRequest):
    code = "unknown_type"


class UnknownTarget(SubagentsError):
    code = "unknown_target"


class Busy(SubagentsError):
    """The target's mailbox is full; nothing was queued. Retry later."""

    code = "busy"


class Internal(SubagentsError):
    """An actor failed unexpectedly on this message; it was restarted from the store."""

    code = "internal"


class OwnerUnavailable(SubagentsError):
    """The owner that serves this request is not serving: it is restarting, or it crashed more
    often than its restart-intensity limit allows and the node marked it `failed`. Nothing was
    applied, unless `details["outcome"] == "unknown"`: a worker did not answer its home in
    time (reason `host_timeout`) a request it may still apply (a launch, a stop), or a worker's
    home became unreachable with the request in flight (reason `home_unreachable_in_flight`).
    The other owners keep serving; `status` and `doctor` say why."""

    code = "unavailable"


class MembershipRefused(SubagentsError):
    """The home node refused a worker: its key's name is not the name it joins as, another
    live process is that worker, the operator forgot it (it is fenced until it joins again),
    or the node it asked is not a home. Nothing was applied."""

    code = "membership_refused"


class RecordQuarantined(SubagentsError):
    """The stored record this request needs does not parse or breaks its invariants, so its
    owner quarantined it: nothing was applied, and the record counts as occupied (a slot) or
    unavailable (a budget, a session, a run) until an operator repairs or removes it. Every
    other record keeps working; `status` and `doctor` list it."""

    code = "record_quarantined"

    @classmethod
    def of(cls, owner: str, table: str, key: str, reason: str) -> RecordQuarantined:
        return cls(
            f"The {owner} record {table}[{key}] is quarantined ({reason}); it cannot be used "
            "until it is repaired. See `subagents-node doctor`.",
            owner=owner,
            table=table,
            key=key,
            reason=reason,
        )


class StoreError(SubagentsError):
    """The owner's database cannot be opened, migrated or trusted; the owner cannot serve."""

    code = "store_error"


class StoreFull(StoreError):
    """The disk under the state dir is full: this write changed nothing. Reads keep answering,
    and the owner serves writes again by itself as soon as space returns; retry later."""

    code = "store_full"


class NodeError(SubagentsError):
    """The node could not be reached; raised by clients, never sent on the wire."""

    code = "node_error"


class NodeNotRunning(NodeError):
    code = "node_not_running"


class NodeTimeout(NodeError):
    code = "node_timeout"


class BadAddress(NodeError):
    code = "bad_address"


class NotAuthenticated(NodeError):
    """A tcp node refused this client's CURVE handshake (unknown, revoked or wrong key), or
    the client has no key to offer. The node never answers such a peer, so this is raised by
    the client from its own socket's handshake events, within a bounded wait."""

    code = "not_authenticated"


class UnsafeStateDir(SubagentsError):
    """A state dir (or a parent of it) that another user owns or could write to (DESIGN §3)."""

    code = "unsafe_state_dir"


class KeyFileInvalid(SubagentsError):
    """A CURVE key file or allow-list that is missing, unreadable or malformed."""

    code = "key_file_invalid"


# -- agents (SPEC §0.2, R-AGT-1, R-EXT-3) ------------------------------------------------------


class AgentError(SubagentsError):
    """Base of the agent-definition errors. Nothing was launched and nothing was charged."""

    code = "agent_error"


class AgentNotFound(AgentError):
    """No agent of that name in any agent directory; lists the names that exist."""

    code = "agent_not_found"

    @classmethod
    def of(cls, name: str, available: Sequence[str]) -> AgentNotFound:
        names = sorted(available)
        listing = ", ".join(names) if names else "none"
        return cls(
            f"Unknown agent '{name}'. Available agents: {listing}.",
            name=name,
            available=names,
        )

    @property
    def name(self) -> str:
        return str(self.details.get("name", ""))

    @property
    def available(self) -> list[str]:
        return [str(n) for n in self.details.get("available", [])]


class AgentInvalid(AgentError):
    """An agent file (or agents directory) that cannot be used, and why."""

    code = "agent_invalid"

    @classmethod
    def of(cls, path: object, reason: str) -> AgentInvalid:
        return cls(f"Invalid agent file {path}: {reason}", path=str(path), reason=reason)

    @property
    def path(self) -> str:
        return str(self.details.get("path", ""))

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))


class AgentCommandNotFound(AgentError):
    """The agent's command (argv[0]) is not an executable file on PATH or beside the agent."""

    code = "agent_command_not_found"

    @classmethod
    def of(cls, name: str, command: str, path: object, where: str) -> AgentCommandNotFound:
        return cls(
            f"Agent '{name}': command '{command}' not found ({where}).",
            name=name,
            command=command,
            path=str(path),
        )

    @property
    def name(self) -> str:
        return str(self.details.get("name", ""))

    @property
    def command(self) -> str:
        return str(self.details.get("command", ""))

    @property
    def path(self) -> str:
        return str(self.details.get("path", ""))


# -- capacity owner (SPEC §4) ------------------------------------------------------------------


class CapacityError(SubagentsError):
    """Base of the capacity owner's refusals. A refused request changed nothing."""

    code = "capacity_error"


class CapacityExhausted(CapacityError):
    """R-CAP-9/10/12: no free slot below the limit; carries the snapshot."""

    code = "capacity_exhausted"

    @classmethod
    def of(cls, used: int, limit: int) -> CapacityExhausted:
        return cls(
            f"Active async run capacity exhausted: {used}/{limit} used.", used=used, limit=limit
        )

    @property
    def used(self) -> int:
        return int(self.details.get("used", 0))

    @property
    def limit(self) -> int:
        return int(self.details.get("limit", 0))

    @property
    def snapshot(self) -> CapacitySnapshot:
        from subagents_node.messages.capacity import CapacitySnapshot

        return CapacitySnapshot(used=self.used, limit=self.limit)


class CapacityOwnershipChanged(CapacityError):
    """R-CAP-4/13/14: the handle no longer names the stored record (stale, forged or gone)."""

    code = "capacity_ownership_changed"

    @classmethod
    def of(
        cls, handle: SlotHandle, reason: str, workflow: bool = False
    ) -> CapacityOwnershipChanged:
        what = "workflow" if workflow else "run"
        return cls(
            f"Active async capacity ownership changed for {what} '{handle.run_id}'.",
            run_id=handle.run_id,
            session_id=handle.session_id,
            slot=handle.slot,
            reason=reason,
        )

    @property
    def run_id(self) -> str:
        return str(self.details.get("run_id", ""))

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))


class CapacityNotTransferable(CapacityError):
    """R-CAP-18 step 2 with A-2 resolved: the source is not terminal (or paused and live)."""

    code = "capacity_not_transferable"

    @classmethod
    def of(cls, source_run_id: str, reason: str) -> CapacityNotTransferable:
        return cls(
            f"Active async capacity source '{source_run_id}' is not transferable.",
            source_run_id=source_run_id,
            reason=reason,
        )

    @property
    def source_run_id(self) -> str:
        return str(self.details.get("source_run_id", ""))

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))


class CapacityRunAlreadyHeld(CapacityError):
    """A run may own at most one slot per session; a second acquire for it is refused."""

    code = "capacity_run_already_held"

    @classmethod
    def of(cls, session_id: str, run_id: str, slot: int) -> CapacityRunAlreadyHeld:
        return cls(
            f"Run '{run_id}' already holds active async capacity slot {slot} "
            f"in session '{session_id}'.",
            run_id=run_id,
            session_id=session_id,
            slot=slot,
        )

    @property
    def run_id(self) -> str:
        return str(self.details.get("run_id", ""))

    @property
    def slot(self) -> int:
        return int(self.details.get("slot", -1))


# -- fan-out budget owner (SPEC §5) ------------------------------------------------------------


LIMIT_INVALID = "Run fan-out limit must be a positive integer."


class FanoutError(SubagentsError):
    """Base of the fan-out owner's refusals. A refusal never changes the budget."""

    code = "fanout"

    @property
    def snapshot(self) -> FanoutSnapshot | None:
        """The budget when the request was refused, where the error knows it."""
        from subagents_node.messages.base import validated_reply
        from subagents_node.messages.fanout import FanoutSnapshot

        # Rebuilt from a reply: a newer node's snapshot may hold fields this one does not know.
        raw = self.details.get("snapshot")
        return validated_reply(FanoutSnapshot, raw) if isinstance(raw, dict) else None


class FanoutLimitInvalid(FanoutError):
    code = "fanout_limit_invalid"

    @classmethod
    def of(cls, limit: object) -> FanoutLimitInvalid:
        too_large = isinstance(limit, int) and not isinstance(limit, bool) and limit > MAX_INT32
        message = f"{LIMIT_INVALID[:-1]} no greater than {MAX_INT32}." if too_large else None
        shown = limit if isinstance(limit, int | float | str | bool) or limit is None else None
        return cls(message or LIMIT_INVALID, limit=shown, max=MAX_INT32)


class FanoutDescriptorInvalid(FanoutError):
    code = "fanout_descriptor_invalid"

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))


class FanoutBudgetUnavailable(FanoutError):
    code = "fanout_budget_unavailable"

    @classmethod
    def unknown(cls, budget_id: str) -> FanoutBudgetUnavailable:
        return cls(
            f"Run fan-out budget directory is unavailable: unknown budget {budget_id}",
            budget_id=budget_id,
            reason="unknown budget",
        )

    @property
    def budget_id(self) -> str:
        return str(self.details.get("budget_id", ""))


class FanoutDescriptorMismatch(FanoutError):
    code = "fanout_descriptor_mismatch"

    @property
    def budget_id(self) -> str:
        return str(self.details.get("budget_id", ""))

    @property
    def mismatched(self) -> list[str]:
        """The descriptor fields that differ from the manifest (`limit`, `root_run_id`)."""
        return [str(f) for f in self.details.get("mismatched", [])]


class FanoutLimitExceeded(FanoutError):
    """R-FAN-16. Details are exactly the rejection; no member of the batch was claimed."""

    code = "RUN_FANOUT_LIMIT"

    @classmethod
    def of(cls, rejection: FanoutRejection) -> FanoutLimitExceeded:
        r = rejection
        return cls(
            f"Run fan-out limit reached at {r.path} ({r.used}/{r.limit} used; "
            f"{r.requested} requested, {r.remaining} remaining). No children from this "
            "admission group were started. Start a new top-level run or raise "
            "max_subagent_spawns_per_run.",
            **r.model_dump(),
        )

    @property
    def rejection(self) -> FanoutRejection:
        from subagents_node.messages.base import validated_reply
        from subagents_node.messages.fanout import FanoutRejection

        # Rebuilt from a reply: a newer node's rejection may hold fields this one does not know.
        return validated_reply(FanoutRejection, self.details)

    @property
    def snapshot(self) -> FanoutSnapshot:
        from subagents_node.messages.fanout import FanoutSnapshot

        return FanoutSnapshot.of(int(self.details["used"]), int(self.details["limit"]))


class FanoutReservationError(FanoutError):
    code = "fanout_reservation"

    @property
    def reservation_id(self) -> str:
        return str(self.details.get("reservation_id", ""))


class FanoutReservationUnknown(FanoutReservationError):
    """No reservation with this id was ever granted by this owner."""

    code = "fanout_reservation_unknown"


class FanoutReservationExpired(FanoutReservationError):
    """The reservation is no longer pending: its deadline passed (`state` "expired") or its
    holder aborted it ("aborted"). Its claims were freed; nothing was committed."""

    code = "fanout_reservation_expired"

    @property
    def state(self) -> str:
        return str(self.details.get("state", ""))


class FanoutReservationCommitted(FanoutReservationError):
    """Abort of a committed reservation: its claims are permanent (R-FAN-15)."""

    code = "fanout_reservation_committed"


# -- session owner (SPEC §6, R-CFG-8, R-TMO-3) -------------------------------------------------


class SpawnBudgetExceeded(SubagentsError):
    """R-SPN-4: the declared run does not fit the session's remaining spawn budget."""

    code = "spawn_budget_exceeded"

    @classmethod
    def build(
        cls, session_id: str, used: int, limit: int, requested: int, remaining: int
    ) -> SpawnBudgetExceeded:
        return cls(
            f"Subagent spawn limit reached for this session ({used}/{limit} used, "
            f"{requested} requested). {remaining} remaining; the declared run cannot fit, so no "
            "children were started. Grant budget explicitly from the root interactive session "
            "or start a new session.",
            session_id=session_id,
            used=used,
            limit=limit,
            requested=requested,
            remaining=remaining,
        )

    @property
    def used(self) -> int:
        return int(self.details["used"])

    @property
    def limit(self) -> int:
        return int(self.details["limit"])

    @property
    def requested(self) -> int:
        return int(self.details["requested"])

    @property
    def remaining(self) -> int:
        return int(self.details["remaining"])


GrantReason = Literal[
    "not_root",
    "unknown_session",
    "children_active",
    "not_positive",
    "no_cap",
    "over_allowance",
    "forbidden",
    "changed",
]


#: R-SPN-6's refusals, in the order the rules are checked, with their texts (spec wording
#: where the spec gives one). Placeholders are filled from the error's details.
GRANT_REFUSALS: Mapping[GrantReason, str] = {
    "not_root": "Action 'grant-spawn-budget' is available only from the root interactive "
    "parent session.",
    "unknown_session": "Spawn budget grant rejected: session '{session_id}' is not known to "
    "this node (it was never opened).",
    "children_active": "Spawn budget grants are rejected while current-session children are "
    "queued or running. {active} run(s) of this session are active; grant again once they have "
    "finished or been stopped.",
    "not_positive": "Spawn budget grant rejected: the additional budget must be a positive "
    "integer (got {additional}).",
    "no_cap": "The current session has no configured spawn cap, so it does not need a budget "
    "grant.",
    "over_allowance": "Spawn budget grant rejected: {additional} requested but only "
    "{grant_remaining} of the original configured limit remains grantable.",
    "forbidden": "Spawn budget grant rejected: the grant authority policy is 'forbid' "
    "(grant_authority).",
    "changed": "Spawn budget grant not applied: the session's budget changed after "
    "confirmation (used {expected_used} -> {used}, granted {expected_granted} -> {granted}). "
    "Review the budget and grant again.",
}


class GrantRejected(SubagentsError):
    """A grant refused by one of R-SPN-6's rules; `reason` names the rule (GRANT_REFUSALS)."""

    code = "grant_rejected"

    @classmethod
    def build(cls, reason: GrantReason, session_id: str, **numbers: int) -> GrantRejected:
        text = GRANT_REFUSALS[reason].format(session_id=session_id, **numbers)
        return cls(text, reason=reason, session_id=session_id, **numbers)

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))


class NestedCallBlocked(SubagentsError):
    """R-CFG-8: the launch is at or beyond the maximum nesting depth; nothing was admitted."""

    code = "nested_call_blocked"

    @property
    def depth(self) -> int:
        return int(self.details["depth"])

    @property
    def max_depth(self) -> int:
        return int(self.details["max_depth"])


class InvalidTimeout(SubagentsError):
    """R-TMO-3: a call's timeout_ms / max_runtime_ms is not acceptable."""

    code = "invalid_timeout"

    @property
    def name(self) -> str:
        return str(self.details.get("name", ""))


# -- run supervisor (SPEC §8-13) ---------------------------------------------------------------


class FanoutNotAuthorized(BadRequest):
    """A nested launcher that inherited no fan-out budget: its agent lacks `fanout: true`."""

    code = "fanout_not_authorized"


class RunCwdMissing(BadRequest):
    """The launch's working directory (or a task's) does not exist or cannot be used (a NUL
    byte, a name the system refuses); nothing started."""

    code = "cwd_missing"


class TaskUndeliverable(BadRequest):
    """A task its agent takes in argv that exec(2) would refuse (a NUL, an argument over
    Linux's limit); refused before any charge, instead of a child that fails to start."""

    code = "task_undeliverable"


class PreviousUnavailable(BadRequest):
    """A `{previous}` where no earlier chain step exists; nothing started."""

    code = "previous_unavailable"


class RunStorageFailed(SubagentsError):
    """R-ADM-2: the run directory could not be created; the capacity slot was rolled back."""

    code = "run_storage_failed"


class InjectedFault(SubagentsError):
    """A failure injected at a named admission step (nodes started with faults only; tests)."""

    code = "injected_fault"

    @property
    def point(self) -> str:
        return str(self.details.get("point", ""))


class RunNotFound(SubagentsError):
    code = "run_not_found"


class RunIdAmbiguous(BadRequest):
    code = "run_id_ambiguous"


class LaunchIdConflict(BadRequest):
    """A launch id sent again with another request than the one that launched its run."""

    code = "launch_id_conflict"


class RunNotResumable(SubagentsError):
    """R-RES-1/2: the run is running, stopped, or has no recovery descriptor."""

    code = "run_not_resumable"


class DeadlineExpired(SubagentsError):
    """R-TMO-8: the source run's absolute deadline passed before its resume could launch."""

    code = "deadline_expired"


class PauseRefused(SubagentsError):
    """R-RUN-2: pause, approve or reject of a run not in a state that allows it."""

    code = "pause_refused"


class AppendRejected(SubagentsError):
    """R-APP-1/2: the append's preconditions failed; nothing was claimed or queued."""

    code = "append_rejected"


class IntercomOff(SubagentsError):
    """R-ICB-2: intercom is off for the target run."""

    code = "intercom_off"


class WorkflowChildRefused(BadRequest):
    """R-FAN-24: internal workflow fields without the workflow's token."""

    code = "workflow_child_refused"


# -- configuration (SPEC §0.4, A-16) -----------------------------------------------------------


class ConfigError(SubagentsError):
    """A configuration value cannot be used; `key` and `source` say which and where."""

    code = "config_invalid"

    @property
    def key(self) -> str:
        return str(self.details.get("key", ""))

    @property
    def source(self) -> str:
        return str(self.details.get("source", ""))

    @property
    def file(self) -> str:
        """The config file the value came from ('' for variables and overrides)."""
        return str(self.details.get("file", ""))


# -- launcher ----------------------------------------------------------------------------------


class RunFileInvalid(BadRequest):
    """A parallel or chain file that cannot be read or does not have the documented shape."""

    code = "run_file_invalid"


# -- node --------------------------------------------------------------------------------------


class NodeAlreadyRunning(NodeError):
    code = "node_already_running"


class OutOfDescriptors(NodeError):
    """This process (or the whole system) has no file descriptor left to reach the node with:
    nothing was sent. `limit` is the process's own limit on open files (None for the system's)."""

    code = "out_of_descriptors"


# -- workflows (SPEC §12), raised in the host process ------------------------------------------


class WorkflowError(SubagentsError):
    code = "workflow_error"

    @property
    def key(self) -> str:
        return str(self.details.get("key", ""))


class WorkflowCallInvalid(WorkflowError, BadRequest):
    """A `runs.run` / `runs.all` spec with a missing, unknown or mistyped field."""

    code = "workflow_call_invalid"


class WorkflowKeyInvalid(WorkflowError, BadRequest):
    """R-WF-4: keys match `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`."""

    code = "workflow_key_invalid"


class WorkflowKeyConflict(WorkflowError, BadRequest):
    """R-WF-4: a key reused with different parameters (identical ones reuse the result)."""

    code = "workflow_key_conflict"


class WorkflowOutputCollision(WorkflowError, BadRequest):
    """R-WF-8: a child output on the aggregate path or on another child's path. `first` is
    the other child's key (empty when the clash is with the aggregate)."""

    code = "workflow_output_collision"

    @property
    def path(self) -> str:
        return str(self.details.get("path", ""))

    @property
    def first(self) -> str:
        return str(self.details.get("first", ""))


class WorkflowSettled(WorkflowError):
    """R-WF-5: a launch attempted after the script ended; nothing is admitted."""

    code = "workflow_settled"


class WorkflowResultTooLarge(WorkflowError):
    """A workflow's return value, or its emitted values together, over the size limit as JSON
    (docs/workflows.md); `size` and `limit` are in bytes of UTF-8 JSON."""

    code = "workflow_result_too_large"

    @property
    def size(self) -> int:
        return int(self.details.get("size", 0))

    @property
    def limit(self) -> int:
        return int(self.details.get("limit", 0))


class WorkflowHostError(WorkflowError):
    """The host was started without what a workflow run gives it (not run by a node)."""

    code = "workflow_host_error"


# -- the registry ------------------------------------------------------------------------------


def _every_class(root: type[SubagentsError]) -> list[type[SubagentsError]]:
    found = [root]
    for sub in root.__subclasses__():
        found += [c for c in _every_class(sub) if c not in found]
    return found


def _by_code() -> Mapping[str, type[SubagentsError]]:
    table: dict[str, type[SubagentsError]] = {}
    for kind in _every_class(SubagentsError):
        if kind.__module__ != __name__:
            continue  # a subclass defined elsewhere (a test double) is not part of the protocol
        other = table.setdefault(kind.code, kind)
        if other is not kind:
            raise TypeError(
                f"error code {kind.code!r} is used by {other.__name__} and {kind.__name__}"
            )
    return MappingProxyType(table)


#: wire code -> class, for every error in this module (read-only; built once at import)
WIRE_CODES: Mapping[str, type[SubagentsError]] = _by_code()
