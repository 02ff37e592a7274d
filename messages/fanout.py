"""Protocol of the fan-out budget owner (SPEC §5, R-FAN-*): descriptor, requests, results, errors.

Owns the shape of a run-tree budget as callers see it: the `FanoutDescriptor` a run carries (and
hands its children in `$SUBAGENTS_RUN_FANOUT`), its env encoding, path qualification, the
request/result models of the `fanout` owner and the typed errors it raises. Everything here is
pure; it never reads a store or a clock, and it never decides admission (the owner does).

    FanoutError                          code
    ├── FanoutLimitInvalid               fanout_limit_invalid        limit, max
    ├── FanoutDescriptorInvalid          fanout_descriptor_invalid   reason
    ├── FanoutBudgetUnavailable          fanout_budget_unavailable   budget_id, reason
    ├── FanoutDescriptorMismatch         fanout_descriptor_mismatch  budget_id, mismatched
    ├── FanoutLimitExceeded              RUN_FANOUT_LIMIT            the rejection (R-FAN-16)
    └── FanoutReservationError
        ├── FanoutReservationUnknown     fanout_reservation_unknown  reservation_id
        ├── FanoutReservationExpired     fanout_reservation_expired  reservation_id, state, snapshot
        └── FanoutReservationCommitted   fanout_reservation_committed reservation_id, snapshot
"""

import base64
import binascii
import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from subagents_node.messages.base import Message, Request, ResultType
from subagents_node.messages.constants import MAX_INT32
from subagents_node.messages.domains import Address, BudgetId, ShallowValue, Token
from subagents_node.messages.domains import Ttl as DomainTtl
from subagents_node.messages.errors import FanoutDescriptorInvalid

FANOUT = "fanout"

#: Largest limit a budget accepts (like timeouts, capped at 2^31-1; SPEC §0.4).
MAX_LIMIT = MAX_INT32
MAX_PATHS = 10_000
MAX_PATH_CHARS = 512
MAX_PARENT_PATH_CHARS = 2048
MAX_TTL_S = 3600.0
#: Budgets one `fanout.snapshots` reads at once: a view's runs (a few hundred descriptors of a
#: few hundred bytes each) fit one frame; a caller with more sends more batches.
MAX_READINGS = 1000
#: An encoded descriptor is a few hundred bytes; anything far larger is not one.
MAX_ENCODED_CHARS = 8192

DESCRIPTOR_MISSING = "Run fan-out budget descriptor is missing or invalid."
DESCRIPTOR_INVALID = "Run fan-out budget descriptor is invalid."
DESCRIPTOR_MISMATCH = "Run fan-out budget descriptor does not match its manifest."
INHERITED_INVALID = "Invalid inherited run fan-out budget: {reason}"

_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")

ClaimPath = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH_CHARS)]


# -- the descriptor ---------------------------------------------------------------------------


class FanoutDescriptor(Message):
    """What a run carries to name its budget (R-FAN-1, A-1): the budget's id at its owner.

    `limit` and `root_run_id` must equal the owner's manifest (a descriptor can never raise its
    own limit); `parent_path` prefixes every path this holder claims (R-FAN-11); `node` is the
    owner's address, for people and for children that were not told one.
    """

    model_config = ConfigDict(strict=True)
    #: Its dump, made once (`fields`): not a field nor a private attribute, so equality,
    #: hashing, copies and pickles never see it.
    __slots__ = ("_dumped",)

    version: Literal[1] = 1
    root_run_id: BudgetId
    budget_id: BudgetId
    limit: int = Field(gt=0, le=MAX_LIMIT)
    parent_path: str = Field(default="", max_length=MAX_PARENT_PATH_CHARS)
    node: Address = ""

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_an_int(cls, value: Any) -> Any:
        if isinstance(value, bool):  # True == 1 would otherwise pass as version 1
            raise ValueError("version must be the integer 1")
        return value

    @field_validator("parent_path")
    @classmethod
    def _trimmed(cls, value: str) -> str:
        # R-FAN-11 ignores surrounding whitespace; storing it trimmed keeps equality meaningful.
        return value.strip()

    def fields(self) -> dict[str, Any]:
        """`model_dump()`, made once per descriptor object (it is frozen) and copied: a caller
        sends the same descriptor in every claim on its budget (ClaimPaths.to_body)."""
        dumped: dict[str, Any] | None = getattr(self, "_dumped", None)
        if dumped is None:
            dumped = self.model_dump()
            object.__setattr__(self, "_dumped", dumped)  # a slot: frozen fields untouched
        return dict(dumped)


def qualify(parent_path: str, path: str) -> str:
    """R-FAN-11: `path` under `parent_path` (labels for diagnostics, not uniqueness keys)."""
    parent = parent_path.strip()
    return f"{parent}/{path}" if parent else path


def extend(descriptor: FanoutDescriptor, segment: str) -> FanoutDescriptor:
    """R-FAN-12: the descriptor a child receives, its parent path extended by one segment."""
    if not segment.strip():
        raise ValueError("a parent-path segment must not be empty")
    fields = descriptor.model_dump()
    fields["parent_path"] = qualify(descriptor.parent_path, segment)
    return FanoutDescriptor.model_validate(fields)


def encode_descriptor(descriptor: FanoutDescriptor) -> str:
    """R-FAN-4: unpadded base64url of the UTF-8 JSON; keys sorted, empty optional fields omitted."""
    fields = descriptor.model_dump()
    for optional in ("parent_path", "node"):
        if not fields[optional]:
            del fields[optional]
    raw = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(raw.encode("utf-8")).rstrip(b"=").decode("ascii")


def decode_descriptor(value: str) -> FanoutDescriptor:
    """The descriptor in an encoded value, or `FanoutDescriptorInvalid` (R-FAN-3 wording)."""
    if not isinstance(value, str) or not value.strip():
        raise FanoutDescriptorInvalid(DESCRIPTOR_MISSING, reason="empty")
    text = value.strip()
    if len(text) > MAX_ENCODED_CHARS or not _BASE64URL.fullmatch(text):
        raise FanoutDescriptorInvalid(DESCRIPTOR_MISSING, reason="not unpadded base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        fields = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise FanoutDescriptorInvalid(DESCRIPTOR_MISSING, reason=f"undecodable: {exc}") from None
    if not isinstance(fields, dict):
        raise FanoutDescriptorInvalid(DESCRIPTOR_MISSING, reason="not a JSON object")
    if "version" not in fields:
        raise FanoutDescriptorInvalid(DESCRIPTOR_INVALID, reason="version: missing")
    try:
        return FanoutDescriptor.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        reason = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        raise FanoutDescriptorInvalid(DESCRIPTOR_INVALID, reason=reason) from None


# -- results ----------------------------------------------------------------------------------


class FanoutSnapshot(Message):
    """R-FAN-17: the budget as it stands; reserved claims count as used."""

    used: int
    limit: int
    remaining: int

    @classmethod
    def of(cls, used: int, limit: int) -> "FanoutSnapshot":
        return cls(used=used, limit=limit, remaining=max(0, limit - used))

    @property
    def text(self) -> str:
        return f"Run fan-out: {self.used}/{self.limit} used, {self.remaining} remaining"


class BudgetReading(Message):
    """One descriptor's part of a batch read: its live snapshot, or why it has none (the
    refusal `fanout.snapshot` would have raised for it, by code and message)."""

    snapshot: FanoutSnapshot | None = None
    code: str = ""
    error: str = ""


class BudgetReadings(Message):
    """The answer to `fanout.snapshots`: one reading per descriptor, in the request's order."""

    readings: list[BudgetReading]


class FanoutRejection(Message):
    """R-FAN-16: why a batch was refused. Numbers are the values before the batch."""

    code: Literal["RUN_FANOUT_LIMIT"] = "RUN_FANOUT_LIMIT"
    path: str
    requested: int
    used: int
    limit: int
    remaining: int


class ReservationGrant(Message):
    """The answer to `reserve`: claims held until `commit`, `abort` or `expires_at` (wall s)."""

    reservation_id: str
    budget_id: str
    claims: int
    expires_at: float
    snapshot: FanoutSnapshot


# -- requests ---------------------------------------------------------------------------------


class CreateBudget(Request):
    """Make a new, empty budget (R-FAN-2). `limit` is checked by the owner, so that any
    non-positive or non-integer value gets the spec's own message, not a schema error."""

    type: Literal["fanout.create"] = "fanout.create"
    target: ClassVar[str] = FANOUT
    Result: ClassVar[ResultType] = FanoutDescriptor

    root_run_id: BudgetId
    #: Any small value: the owner answers a wrong one with R-FAN-2's message; a large or deep
    #: one is a schema error (one error, however many elements it has).
    limit: ShallowValue = None

    def resendable_as_sent(self) -> bool:
        """Sent again after its answer was lost, it makes a second budget (each has a fresh
        id): the first, never named to anyone, stays empty and counts nothing."""
        return True


class ValidateDescriptor(Request):
    """Check a descriptor against its owner's manifest (R-FAN-3); answers it normalized."""

    type: Literal["fanout.validate"] = "fanout.validate"
    target: ClassVar[str] = FANOUT
    Result: ClassVar[ResultType] = FanoutDescriptor
    idempotent: ClassVar[bool] = True  # reads the manifest

    descriptor: FanoutDescriptor


class ClaimPaths(Request):
    """Claim one permanent unit per path, all or nothing (R-FAN-13/14/15).

    With `claim_id` (any id its caller picks once per batch, a uuid) the batch is made at most
    once: sent again with the same id and the same paths (its first answer was lost with its
    node), it claims nothing more and answers the budget as it stands; with other paths it is
    refused. Paths alone cannot tell a batch sent again from a new one: they are labels, not
    keys (R-FAN-11)."""

    type: Literal["fanout.claim"] = "fanout.claim"
    target: ClassVar[str] = FANOUT
    Result: ClassVar[ResultType] = FanoutSnapshot

    descriptor: FanoutDescriptor
    paths: list[ClaimPath] = Field(max_length=MAX_PATHS)
    claim_id: Token | None = None

    added_later: ClassVar[tuple[str, ...]] = ("claim_id",)

    def resendable_as_sent(self) -> bool:
        # An empty batch writes nothing (it validates the descriptor, R-FAN-13).
        return self.claim_id is not None or not self.paths

    def to_body(self) -> dict[str, Any]:
        """`Message.to_body`, with the descriptor's dump made once per descriptor (a client
        claims on one budget many times; the dump was a third of building a claim's frame)."""
        body: dict[str, Any] = {"descriptor": self.descriptor.fields(), "paths": list(self.paths)}
        if self.claim_id is not None:  # added later: absent while None
            body["claim_id"] = self.claim_id
        return body


class ReservePaths(Request):
    """Hold claims for `ttl_s` (two-phase claim-with-commit, R-FAN-14): they count as used
    until committed (then permanent), aborted or expired (then freed).

    With `reservation_id` (any id its caller picks once per reservation, a uuid) the
    reservation is made at most once and its caller knows its id before any answer: sent again
    (its first answer was lost with its owner) it is answered with the same grant while it is
    pending, and refused once it ended or for other paths; and a caller that never got an
    answer can still end it (`AbortReservation`). Without one, the id is the owner's."""

    type: Literal["fanout.reserve"] = "fanout.reserve"
    target: ClassVar[str] = FANOUT
    Result: ClassVar[ResultType] = ReservationGrant

    descriptor: FanoutDescriptor
    paths: list[ClaimPath] = Field(max_length=MAX_PATHS)
    ttl_s: Annotated[DomainTtl, Field(le=MAX_TTL_S)]
    reservation_id: Token | None = None

    added_later: ClassVar[tuple[str, ...]] = ("reservation_id",)

    def resendable_as_sent(self) -> bool:
        return self.reservation_id is not None


class CommitReservation(Request):
    """Make a pending reservation's claims permanent. Committing twice is harmless."""

    type: Literal["fanout.commit"] = "fanout.commit"
    target: ClassVar[str] = FANOUT
    Result: ClassVar[ResultType] = FanoutSnapshot
    #: pending -> committed once; a second commit changes nothing (FanoutBudget.commit).
    idempotent: ClassVar[bool] = True

    reservation_id: Token


class AbortReservation(Request):
    """Free a pending reservation's claims. Aborting an ended one is harmless."""

    type: Literal["fanout.abort"] = "fanout.abort"
    target: ClassVar[str] = FANOUT
    Result: ClassVar[ResultType] = FanoutSnapshot
    #: pending -> aborted once; a second abort changes nothing (a committed one is refused).
    idempotent: ClassVar[bool] = True

    reservation_id: Token


class ReadSnapshot(Request):
    type: Literal["fanout.snapshot"] = "fanout.snapshot"
    target: ClassVar[str] = FANOUT
    Result: ClassVar[ResultType] = FanoutSnapshot
    idempotent: ClassVar[bool] = True  # expiring what is due is the same twice

    descriptor: FanoutDescriptor


class ReadSnapshots(Request):
    """Read many budgets at once (a view of many runs: `fleet`, `runs --json`): one round trip,
    and a budget that cannot be read spoils only its own reading, never the batch."""

    type: Literal["fanout.snapshots"] = "fanout.snapshots"
    target: ClassVar[str] = FANOUT
    Result: ClassVar[ResultType] = BudgetReadings
    idempotent: ClassVar[bool] = True  # like fanout.snapshot: expiring what is due is the same

    descriptors: list[FanoutDescriptor] = Field(max_length=MAX_READINGS)


REQUESTS = (
    CreateBudget,
    ValidateDescriptor,
    ClaimPaths,
    ReservePaths,
    CommitReservation,
    AbortReservation,
    ReadSnapshot,
    ReadSnapshots,
)
