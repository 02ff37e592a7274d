"""Protocol of the capacity owner's holders view: who holds a session pool's slots (R-CAP-26,
R-CAP-27; DESIGN §1 "Multi-host").

Owns one read-only request, `capacity.holders`, and its result. Every slot names the host its
run executes on ("" = the home node), so the ledger alone names every holder of a pool, a
home's workers' runs included: a view (the `capacity` command) needs no round trip to a
worker to say which of its runs hold slots. Kept apart from messages/capacity.py, which owns
the slot protocol itself; it must never import anything but messages/.
"""

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from subagents_node.messages.base import Message, Request, ResultType
from subagents_node.messages.capacity import CAPACITY, MAX_LISTED, Inspection
from subagents_node.messages.domains import Count, SessionId, Slot


class SessionSlots(Message):
    """One page of a session pool's occupied slots, in slot order: each as `inspect` shows
    its owner (relation `current`, the record naming its `host`, the verdict). `next_after`
    is the `after_slot` of the next page (None: this page was the last); `unreadable` counts
    this page's slots that do not parse (quarantined, still occupied, not in `holders`)."""

    holders: list[Inspection]
    next_after: Slot | None = None
    unreadable: Count = 0


class Holders(Request):
    """The occupied slots of `session_id` after index `after_slot` (None: from the first), at
    most `limit`, each with its record and release verdict, whichever host its run is on."""

    type: Literal["capacity.holders"] = "capacity.holders"
    read_only: ClassVar[bool] = True
    target: ClassVar[str] = CAPACITY
    Result: ClassVar[ResultType] = SessionSlots

    session_id: SessionId
    after_slot: Slot | None = None
    limit: Annotated[int, Field(strict=True, ge=1, le=MAX_LISTED)] = MAX_LISTED


REQUESTS: tuple[type[Request], ...] = (Holders,)
