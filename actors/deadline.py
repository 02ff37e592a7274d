"""EarliestDeadline: one owner timer, armed for the earliest of the deadlines it is given.

Owns, for one owner, the rule that keeps a single timer however many deadlines it holds (the
capacity owner's unstarted slots, the fan-out owner's pending reservations and its claim
compaction): `arm(deadline)` makes sure a tick comes no later than `deadline` (an earlier one
already armed stands, a later one is cancelled and replaced), `fired()` forgets it when the
tick arrives, and the owner then arms for the next deadline its table holds. A timer per
deadline kept every grant in memory until its tick (issue 11's capacity owner grew by 0.7 KiB
per grant); this one costs nothing per deadline.

It never reads a table or decides what is due (its owner does, when the tick comes), and it
never blocks: the tick arrives through the owner's inbox (`OwnerActor.after`).
"""

from __future__ import annotations

from collections.abc import Callable

from subagents_node.actors.context import Cancel
from subagents_node.actors.inbox import Tick


class EarliestDeadline:
    def __init__(
        self,
        after: Callable[[float, Tick], Cancel],
        clock: Callable[[], float],
        tick: Callable[[], Tick],
    ) -> None:
        self._after = after
        self._clock = clock
        self._tick = tick
        #: The deadline (wall s) the timer is armed for; None when no timer is armed.
        self.armed: float | None = None
        self._cancel: Cancel | None = None

    def arm(self, deadline: float | None, not_before: float = 0.0) -> None:
        """A tick no later than `deadline` (and not before `not_before`); None arms nothing. A
        deadline past already fires at once."""
        if deadline is None:
            return
        deadline = max(deadline, not_before)
        if self.armed is not None and self.armed <= deadline:
            return
        self.disarm()
        self.armed = deadline
        self._cancel = self._after(max(0.0, deadline - self._clock()), self._tick())

    def due(self, now: float) -> bool:
        """Has the armed deadline come (a request may act on it before its tick arrives)?"""
        return self.armed is not None and now >= self.armed

    def fired(self) -> None:
        """The tick arrived: nothing is armed until the owner arms the next deadline."""
        self.armed = self._cancel = None

    def disarm(self) -> None:
        if self._cancel is not None:
            self._cancel()
        self.armed = self._cancel = None
