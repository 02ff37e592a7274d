"""A capacity acquire or transfer that is answered once, and given back when it is cut short.

Owns the client's side of the two slot requests that take a slot (`capacity.acquire`,
`capacity.transfer`), for the blocking and the asyncio client alike:

- each call carries an id (`acquire_id`, `transfer_id`): its caller's, else a fresh one (a
  uuid4's hex). The ledger answers the same request sent again under its id with the slot it
  took, never a second one (R-CAP-18; actors/capacity/ledger.py);
- a call whose answer did not come in time (`NodeTimeout`: the owner was slow, or restarted
  with it in flight) is sent once more under its id, so its caller gets the slot the first send
  took (or the refusal), not a timeout while a slot it cannot name stays held;
- a call cut short by its caller (Ctrl-C in a blocking call, a cancelled task, `wait_for` that
  ran out) is given back (`give_back_plan`): sent again under its id, which answers the slot the
  first send took if it took one (or takes one now), and that slot rolled back (R-CAP-15..17,
  a transfer's gives its source's slot back). Before, such a slot stayed held until its TTL:
  60 s in which a session with a limit of 1 refused every acquire. Only an id of this client's
  own is given back: a caller who chose the id may send the call again under it instead;
- a node one release older, which knows no such id, refuses the id this client chose as an
  unknown field: the call is sent once more without it, as that release's clients sent it
  (and then neither sent again nor given back: no id names it).

It never gives back a slot its caller received (a handle returned is the caller's), and a give
back that fails (no node, or no answer within GIVE_BACK_TIMEOUT_S) is left to the slot's TTL.
It does no I/O itself: the calls are plans (client/plans.py).
"""

from __future__ import annotations

import uuid
from typing import Any

from subagents_node.client.plans import Ask, Plan, build
from subagents_node.messages.capacity import (
    Acquire,
    AcquireResult,
    Rollback,
    RollbackResult,
    Transfer,
)
from subagents_node.messages.errors import BadRequest, NodeTimeout, SubagentsError

#: How long each request of a give back waits for its answer (the caller is leaving: briefly).
GIVE_BACK_TIMEOUT_S = 5.0

#: Each slot request's id field.
_ID_FIELD = {Acquire: "acquire_id", Transfer: "transfer_id"}


def unknown_field(err: BadRequest, field: str) -> bool:
    """Whether `err` is a strict node refusing `field` as one it does not know (a node of an
    earlier release: it changed nothing)."""
    details = err.details
    named = details.get("reason") == "schema" and details.get("field") == field
    return named and "Extra inputs" in err.message


class SlotCall:
    """One acquire or transfer call: its request under its id, sent as `plan()` says, and
    given back by `give_back_plan()` when its caller cut it short."""

    def __init__(
        self, kind: type[Acquire] | type[Transfer], fields: dict[str, Any], call_id: str | None
    ) -> None:
        self._kind = kind
        self._field = _ID_FIELD[kind]
        self._fields = fields
        #: The id is this client's own choice (the caller gave none).
        self.ours = call_id is None
        #: The id the call goes under; None once a node that knows none refused it.
        self.call_id: str | None = call_id or uuid.uuid4().hex
        # Built now: a bad argument is the caller's BadRequest before anything is sent.
        self._request = self._under(self.call_id)

    def _under(self, call_id: str | None) -> Acquire | Transfer:
        return build(self._kind, **self._fields, **{self._field: call_id})

    def plan(self) -> Plan[AcquireResult]:
        """The call: once, again under its id after a timeout, or once more without this
        client's id when an older node refused it."""
        answer: AcquireResult
        try:
            answer = yield Ask(self._request, AcquireResult)
        except BadRequest as err:
            if not (self.ours and unknown_field(err, self._field)):
                raise
            self.call_id = None
            self._request = self._under(None)
            answer = yield Ask(self._request, AcquireResult)
        except NodeTimeout:
            if self.call_id is None:
                raise
            # Its outcome is unknown: asked again under its id, the ledger answers the slot
            # the first send took, if it took one. A second timeout is raised.
            answer = yield Ask(self._request, AcquireResult)
        return answer

    def give_back_plan(self) -> Plan[None]:
        """After the call was cut short: the slot it took, if any, rolled back. Nothing is sent
        for a caller's own id (theirs to send again) or a call that went without one."""
        if not self.ours or self.call_id is None:
            return
        try:
            taken = yield Ask(self._request, AcquireResult, GIVE_BACK_TIMEOUT_S)
            if taken.handle is not None:
                rollback = build(Rollback, handle=taken.handle)
                yield Ask(rollback, RollbackResult, GIVE_BACK_TIMEOUT_S)
        except SubagentsError:
            # Refused (the pool is full, the run holds another slot: nothing was taken), or
            # no answer: the slot's TTL frees what this could not.
            return
