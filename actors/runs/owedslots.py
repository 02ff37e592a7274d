"""Owed slots: the capacity an admission gave up without being able to give it back itself.

Owns one decision of a launch's admission (runs/admission.py): when its slot's acquire (or a
resume's transfer) failed in a way that may have taken the slot all the same, the rollback of
that grant is owed through the run supervisor's outbox (runs/outbox.py), durable with the
launch's failure and sent until the capacity owner answers it.

Why: on a worker node the capacity ledger is the home's (DESIGN §1 "Multi-host"). An acquire
that the home's capacity owner committed, whose answer never reached the worker (the home went
down, or the link to it was lost, between the commit and the answer), fails the launch with
"outcome unknown" (`home_unreachable_in_flight`), and no run will ever hold that slot. Before,
it stayed held on the home until its TTL (60 s by default, counted again from a home's
restart), refusing the session's launches at a limit of 1 meanwhile. The same holds for one that
went unanswered (`timeout`) after its resends.

The rollback names the acquire by its id, which is the grant's token (R-CAP-4;
`capacity.rollback_acquire`): a grant never made, or already rolled back or expired, makes it
a no-op, and it never frees a grant a run holds. The id is this admission's alone and nothing
sends that acquire again once the admission gave it up (a launch sent again under its launch id
acquires under an id of its own), and a started slot is never rolled back (R-CAP-17). A
transfer that found its source's slot lends it under the source's token, not its id: that one is
left to its TTL, which gives the source its slot back.

It never sends anything itself and never decides about a grant whose handle the admission
holds (that rollback is the admission's own, R-ADM-2/3).
"""

from __future__ import annotations

import logging
from typing import Protocol

from subagents_node.messages.base import Request
from subagents_node.messages.capacity import Acquire, RollbackAcquire, Transfer
from subagents_node.messages.errors import OwnerUnavailable, SubagentsError

log = logging.getLogger(__name__)


class Owes(Protocol):
    def owe(self, request: Request, run_id: str) -> None: ...


def outcome_unknown(err: SubagentsError) -> bool:
    """Whether a write that failed with `err` may have been applied all the same: it went
    unanswered (its owner killed or restarting with it in flight, or no answer in time, also
    when sent again: actors/pipelines.py), or it was in flight to a worker's home when the home
    was lost (`outcome: unknown`). A refusal, or a request that was not sent, applied nothing."""
    if not isinstance(err, OwnerUnavailable):
        return False
    return err.details.get("outcome") == "unknown" or err.details.get("reason") == "timeout"


def give_up(host: Owes, take: Request, err: SubagentsError) -> SubagentsError:
    """The admission's `take` (an acquire or a transfer) failed with `err`: when it may have
    taken a slot, that grant's rollback is owed (in the current transaction). What the launch
    answers: for an acquire so owed, that the run was not launched and its slot is given back
    (its outcome is known: no run; "look before sending it again" would send the user to look
    for a run that cannot exist), else `err` as it is."""
    if not outcome_unknown(err):
        return err
    if isinstance(take, Acquire) and take.acquire_id is not None:
        grant, session_id, run_id = take.acquire_id, take.session_id, take.run_id
    elif isinstance(take, Transfer) and take.transfer_id is not None:
        # Its token only when it acquired (its source held no slot): see above.
        grant, session_id, run_id = take.transfer_id, take.session_id, take.run_id
    else:
        return err
    log.warning(
        "run %s: %s's outcome is unknown (%s); the rollback of what it took is owed",
        run_id,
        take.type,
        err.message,
    )
    host.owe(RollbackAcquire(session_id=session_id, run_id=run_id, acquire_id=grant), run_id)
    if not isinstance(take, Acquire):
        return err
    details = {k: v for k, v in err.details.items() if k != "outcome"}
    if details.get("reason") == "home_unreachable_in_flight":
        why, who = "this worker lost its home with it in flight", "the home"
    else:
        why, who = "no answer in time", "the capacity owner"
    return OwnerUnavailable(
        f"The run was not launched: its {take.type} went unanswered ({why}); the slot it may "
        f"have taken is given back as soon as {who} answers again; launch again then",
        **details,
        launched=False,
        cause=err.message,
    )
