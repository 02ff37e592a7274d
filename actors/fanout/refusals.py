"""The fan-out owner's refusals of a batch, a reservation or a caller's id, built from what it read.

Owns the wording and details of R-FAN-16's rejection (the first path that does not fit, with the
numbers before the batch), of a reservation that is unknown, committed already or ended (expired
or aborted), and of a caller's claim or reservation id sent with another request than the one it
named. Pure: it reads no table and never decides whether to refuse; the owner (budget.py) does,
and passes the budget's snapshot it read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from subagents_node.messages.errors import (
    BadRequest,
    FanoutLimitExceeded,
    FanoutReservationCommitted,
    FanoutReservationExpired,
    FanoutReservationUnknown,
)
from subagents_node.messages.fanout import FanoutRejection, FanoutSnapshot


def refuse_batch(qualified: Sequence[str], before: FanoutSnapshot) -> NoReturn:
    """R-FAN-16: the rejection of a batch larger than the room left (numbers before it)."""
    n = len(qualified)
    if n <= before.remaining:  # ADMIT and the manifest disagree: a bug, never a refusal
        raise RuntimeError(f"a batch of {n} was not admitted with {before.remaining} left")
    index = before.remaining if before.remaining < n else 0
    raise FanoutLimitExceeded.of(
        FanoutRejection(
            path=qualified[index],
            requested=n,
            used=before.used,
            limit=before.limit,
            remaining=before.remaining,
        )
    )


def unknown(reservation_id: str) -> FanoutReservationUnknown:
    return FanoutReservationUnknown(
        f"Run fan-out reservation {reservation_id} is unknown.",
        reservation_id=reservation_id,
    )


def committed(
    reservation_id: str, budget_id: str, snapshot: FanoutSnapshot
) -> FanoutReservationCommitted:
    return FanoutReservationCommitted(
        f"Run fan-out reservation {reservation_id} is already committed; its claims are permanent.",
        reservation_id=reservation_id,
        budget_id=budget_id,
        snapshot=snapshot.model_dump(),
    )


def ended(
    reservation_id: str, budget_id: str, state: str, snapshot: FanoutSnapshot
) -> FanoutReservationExpired:
    why = "expired" if state == "expired" else "was aborted"
    return FanoutReservationExpired(
        f"Run fan-out reservation {reservation_id} {why}; its claims were released and "
        "nothing was committed.",
        reservation_id=reservation_id,
        budget_id=budget_id,
        state=state,
        snapshot=snapshot.model_dump(),
    )


def reused_id(kind: str, given: str) -> BadRequest:
    """A caller's id (`claim` or `reservation`) sent with another request than the one it named:
    refused, and it claims or reserves nothing more."""
    return BadRequest(
        f"{kind} id {given} was used for another {kind}; pick a new id per "
        f"{'batch' if kind == 'claim' else kind}",
        reason=f"{kind}_id",
        field=f"{kind}_id",
    )
