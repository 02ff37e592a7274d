"""ClaimCompaction: how long the fan-out owner keeps claim rows, which are labels, not counts.

Owns, for the fan-out owner (budget.py), the rule that bounds `fanout.db` and its one timer.
Admission reads a budget's `used` and `claim_limit` from its budget row (R-FAN-13) and a pending
reservation's own claims (to release them if it ends without commit); a claim row is otherwise
only its path and time, a label for diagnostics (R-FAN-11). Without a bound, every child ever
launched left one row for good (the original's budget stores were never collected either,
SPEC §17). So once a budget has had no claim for the retention period (`run_retention_days`,
the age at which finished runs are pruned) and holds no pending reservation, its claim rows are
deleted in one transaction and `claims_compacted_at` is set. Its settled reservations stay (a
row per reserve, not per path): a late commit or abort of one is answered exactly as before
(committed, or `FanoutReservationExpired` with its state), never `FanoutReservationUnknown`.

The budget row stays, `used` included: nothing is refunded (R-FAN-15), and every later decision
in that tree, a revival's children's claims included (R-RES-4), is the one it would have been.
A claim on a compacted budget clears the mark, so its new rows are kept until it is idle again.
A budget row costs about a hundred bytes per run tree; the claims it no longer keeps are up to
`limit` rows each.

The timer is armed for the moment the oldest budget not yet compacted could first be idle long
enough (created + retention); a pass looks at no more than `BUDGETS_PER_PASS` budgets (oldest
first, resuming after the last one looked at) and deletes no more than `CLAIMS_PER_PASS` rows,
so the owner answers requests between passes.
When a round has looked at every candidate, the next one is armed for the first moment a
budget it skipped could be idle long enough (its last claim + retention; `RECHECK_S` for one
held by a pending reservation), or the oldest budget too young to look at could. Retention 0
keeps every claim.

It never deletes a claim of a pending reservation, never changes `used`, `claim_limit` or
`next_seq`, and never touches a quarantined budget (its claims stay, fail closed).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from subagents_node.actors.context import Cancel
from subagents_node.actors.deadline import EarliestDeadline
from subagents_node.actors.fanout import schema
from subagents_node.actors.inbox import Tick

log = logging.getLogger(__name__)

#: Budgets one pass looks at, at most: a pass runs between requests and must stay short.
BUDGETS_PER_PASS = 200
#: Claim rows one pass deletes, at most (a budget's limit can reach 2**31 - 1).
CLAIMS_PER_PASS = 20_000
#: How soon a budget skipped for a pending reservation is looked at again (at most: never
#: later than the retention itself).
RECHECK_S = 3600.0

_CANDIDATES = (
    f"SELECT budget_id, created_at, {schema.BUDGET_PROBLEM} FROM fanout_budgets "
    "WHERE claims_compacted_at IS NULL AND created_at < ? AND (created_at, budget_id) > (?, ?) "
    "ORDER BY created_at, budget_id LIMIT ?"
)
_OLDEST = "SELECT MIN(created_at) FROM fanout_budgets WHERE claims_compacted_at IS NULL"
_OLDEST_FROM = (
    "SELECT MIN(created_at) FROM fanout_budgets "
    "WHERE claims_compacted_at IS NULL AND created_at >= ?"
)
_LAST_CLAIM = "SELECT claimed_at FROM fanout_claims WHERE budget_id = ? ORDER BY seq DESC LIMIT 1"
_DELETE_OLDEST_CLAIMS = (
    "DELETE FROM fanout_claims WHERE budget_id = ? AND seq IN "
    "(SELECT seq FROM fanout_claims WHERE budget_id = ? ORDER BY seq LIMIT ?)"
)
_PENDING = "SELECT 1 FROM fanout_reservations WHERE budget_id = ? AND state = 'pending' LIMIT 1"


class CompactionDue(Tick):
    """The oldest budget not yet compacted may have been idle for the retention period."""

    __slots__ = ()


class ClaimCompaction:
    def __init__(
        self,
        retention_s: float,
        after: Callable[[float, Tick], Cancel],
        clock: Callable[[], float],
    ) -> None:
        self.retention_s = retention_s
        self._clock = clock
        self._timer = EarliestDeadline(after, clock, CompactionDue)
        #: (created_at, budget_id) of the last budget the current round looked at.
        self._resume_after: tuple[float, str] = (float("-inf"), "")
        #: When the earliest budget this round skipped (still in use) is worth a look again.
        self._round_again: float | None = None

    def arm(self, db: sqlite3.Connection, not_before: float = 0.0) -> None:
        """Arm the timer for the oldest budget not yet compacted (nothing when retention is 0)."""
        if self.retention_s <= 0:
            return
        (oldest,) = db.execute(_OLDEST).fetchone()
        if oldest is not None:
            self._timer.arm(float(oldest) + self.retention_s, not_before)

    def budget_created(self, created_at: float) -> None:
        """A new budget (or a compacted one claimed again): arm for it if nothing is armed."""
        if self.retention_s > 0 and self._timer.armed is None:
            self._timer.arm(created_at + self.retention_s)

    def stop(self) -> None:
        self._timer.disarm()

    def due(self, db: sqlite3.Connection) -> int:
        """One pass, inside the owner's transaction; the number of budgets compacted."""
        self._timer.fired()
        now = self._clock()
        cutoff = now - self.retention_s
        after_at, after_id = self._resume_after
        rows = db.execute(_CANDIDATES, (cutoff, after_at, after_id, BUDGETS_PER_PASS)).fetchall()
        compacted = claims = 0
        more = len(rows) == BUDGETS_PER_PASS
        for budget_id, created_at, problem in rows:
            before = self._resume_after
            self._resume_after = (float(created_at), str(budget_id))
            if problem is not None:
                continue  # quarantined: its claims stay, and nothing is due for it
            if db.execute(_PENDING, (budget_id,)).fetchone():
                self._again_at(now + min(RECHECK_S, self.retention_s))
                continue
            last = db.execute(_LAST_CLAIM, (budget_id,)).fetchone()
            if last is not None and float(last[0]) > cutoff:
                self._again_at(float(last[0]) + self.retention_s)  # idle long enough by then
                continue
            room = CLAIMS_PER_PASS - claims
            gone = db.execute(_DELETE_OLDEST_CLAIMS, (budget_id, budget_id, room)).rowcount
            claims += gone
            if gone == room:  # a big budget: the next pass goes on with it (oldest rows first,
                self._resume_after = before  # so its last claim, and its idle time, stay)
                more = True
                break
            db.execute(
                "UPDATE fanout_budgets SET claims_compacted_at = ? WHERE budget_id = ?",
                (now, budget_id),
            )
            compacted += 1
        if compacted:
            log.info("compacted the claims of %d idle budgets (%d rows)", compacted, claims)
        if more:
            self._timer.arm(now)  # more to look at: the next pass after the requests waiting now
            return compacted
        # The round is over: the next starts when a budget skipped in it, or the oldest one
        # too young to look at yet, can first be idle long enough.
        again, self._round_again = self._round_again, None
        self._resume_after = (float("-inf"), "")
        (young,) = db.execute(_OLDEST_FROM, (cutoff,)).fetchone()
        dues = [
            d for d in (again, None if young is None else young + self.retention_s) if d is not None
        ]
        if dues:
            # Never at once: a round that found nothing idle must not start the next right away.
            self._timer.arm(min(dues), not_before=now + 1.0)
        return compacted

    def _again_at(self, due: float) -> None:
        if self._round_again is None or due < self._round_again:
            self._round_again = due
