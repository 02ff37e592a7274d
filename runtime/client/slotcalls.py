"""A call that takes a capacity slot or holds fan-out claims, answered once, and given back
when its caller cuts it short.

Owns the client's side of the requests that take something until they are undone
(`capacity.acquire`, `capacity.transfer`: a slot; `fanout.reserve`: claims until commit), for
the blocking and the asyncio client alike:

- each call carries an id (`acquire_id`, `transfer_id`, `reservation_id`): its caller's, else a
  fresh one (a uuid4's hex). Its owner answers the same request sent again under its id with
  what the first send took, never a second one (R-CAP-18, R-FAN-14; actors/capacity/ledger.py,
  actors/fanout/budget.py);
- a call whose answer did not come in time (`NodeTimeout`: the owner was slow, or restarted
  with it in flight) is sent once more under its id, so its caller gets what the first send
  took (or the refusal), not a timeout while something it cannot name stays held;
- a call cut short by its caller (Ctrl-C in a blocking call, a cancelled task, `wait_for` that
  ran out) is given back (`give_back_plan`): a slot by sending the call again under its id,
  which answers the slot the first send took if it took one (or takes one now), and rolling
  that back (R-CAP-15..17; a transfer's gives its source's slot back); a reservation by
  aborting it under its id (one never made is refused, and nothing was held). Before, a slot
  stayed held until its TTL: 60 s in which a session with a limit of 1 refused every acquire;
  a reservation's claims until its `ttl_s`. Only an id of this client's own is given back: a
  caller who chose the id may send the call again under it instead;
- a node one release older, which knows no such id, refuses the id this client chose as an
  unknown field: the call is sent once more without it, as that release's clients sent it
  (and then neither sent again nor given back: no id names it).

It never gives back what its caller received (a handle or a reservation returned is the
caller's), and a give back that fails (no node, or no answer within GIVE_BACK_TIMEOUT_S) is left
to the TTL. It does no I/O itself: the calls are plans (client/plans.py).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypeVar

from subagents_node.client.plans import Ask, Plan, build
from subagents_node.messages.capacity import (
    Acquire,
    AcquireResult,
    Rollback,
    RollbackResult,
    Transfer,
)
from subagents_node.messages.errors import BadRequest, NodeTimeout, SubagentsError
from subagents_node.messages.fanout import (
    AbortReservation,
    FanoutSnapshot,
    ReservationGrant,
    ReservePaths,
)

#: How long each request of a give back waits for its answer (the caller is leaving: briefly).
GIVE_BACK_TIMEOUT_S = 5.0

#: Each such request's id field.
_ID_FIELD = {Acquire: "acquire_id", Transfer: "transfer_id", ReservePaths: "reservation_id"}

#: What a call answers: a slot's grant, or a reservation's.
A = TypeVar("A", AcquireResult, ReservationGrant)
T = TypeVar("T")


def unknown_field(err: BadRequest, field: str) -> bool:
    """Whether `err` is a strict node refusing `field` as one it does not know (a node of an
    earlier release: it changed nothing)."""
    details = err.details
    named = details.get("reason") == "schema" and details.get("field") == field
    return named and "Extra inputs" in err.message


class OnceCall(ABC, Generic[A]):
    """One call: its request under its id, sent as `plan()` says; `give_back_plan()` (each
    kind's) undoes what it took when its caller cut it short."""

    def __init__(
        self,
        kind: type[Acquire] | type[Transfer] | type[ReservePaths],
        result: type[A],
        fields: dict[str, Any],
        call_id: str | None,
    ) -> None:
        self._kind = kind
        self._result: type[A] = result
        self._field = _ID_FIELD[kind]
        self._fields = fields
        #: The id is this client's own choice (the caller gave none).
        self.ours = call_id is None
        #: The id the call goes under; None once a node that knows none refused it.
        self.call_id: str | None = call_id or uuid.uuid4().hex
        # Built now: a bad argument is the caller's BadRequest before anything is sent.
        self._request = self._under(self.call_id)

    def _under(self, call_id: str | None) -> Acquire | Transfer | ReservePaths:
        return build(self._kind, **self._fields, **{self._field: call_id})

    def plan(self) -> Plan[A]:
        """The call: once, again under its id after a timeout, or once more without this
        client's id when an older node refused it."""
        answer: A
        try:
            answer = yield Ask(self._request, self._result)
        except BadRequest as err:
            if not (self.ours and unknown_field(err, self._field)):
                raise
            self.call_id = None
            self._request = self._under(None)
            answer = yield Ask(self._request, self._result)
        except NodeTimeout:
            if self.call_id is None:
                raise
            # Its outcome is unknown: asked again under its id, the owner answers what the
            # first send took, if it took anything. A second timeout is raised.
            answer = yield Ask(self._request, self._result)
        return answer

    def give_back_plan(self) -> Plan[None]:
        """After the call was cut short: what it took, if anything, undone. Nothing is sent for
        a caller's own id (theirs to send again) or a call that went without one."""
        if not self.ours or self.call_id is None:
            return
        try:
            yield from self._undo(self.call_id)
        except SubagentsError:
            # Refused (nothing was taken), or no answer: the TTL frees what this could not.
            return

    @abstractmethod
    def _undo(self, call_id: str) -> Plan[None]:
        """The requests that undo what the call under `call_id` took (each kind's own)."""


class SlotCall(OnceCall[AcquireResult]):
    """An acquire or a transfer; given back by sending it again under its id (which answers
    the slot it took, or takes one) and rolling that slot back."""

    def __init__(
        self, kind: type[Acquire] | type[Transfer], fields: dict[str, Any], call_id: str | None
    ) -> None:
        super().__init__(kind, AcquireResult, fields, call_id)

    def _undo(self, call_id: str) -> Plan[None]:
        taken = yield Ask(self._request, AcquireResult, GIVE_BACK_TIMEOUT_S)
        if taken.handle is not None:
            rollback = build(Rollback, handle=taken.handle)
            yield Ask(rollback, RollbackResult, GIVE_BACK_TIMEOUT_S)


class ReserveCall(OnceCall[ReservationGrant]):
    """A reservation; given back by aborting it under its id. One its owner never made is
    refused (nothing held): a reserve sent on the same connection is answered before."""

    def __init__(self, fields: dict[str, Any], call_id: str | None) -> None:
        super().__init__(ReservePaths, ReservationGrant, fields, call_id)

    def _undo(self, call_id: str) -> Plan[None]:
        abort = build(AbortReservation, reservation_id=call_id)
        yield Ask(abort, FanoutSnapshot, GIVE_BACK_TIMEOUT_S)


class Performs(Protocol):
    """A blocking client's `perform`."""

    def __call__(self, plan: Plan[T], /) -> T: ...


def performed(perform: Performs, call: OnceCall[A]) -> A:
    """The blocking client's call: its answer; cut short by its caller (Ctrl-C, SystemExit),
    what it took is given back first."""
    try:
        return perform(call.plan())
    except BaseException as err:
        if not isinstance(err, Exception):
            perform(call.give_back_plan())
        raise
