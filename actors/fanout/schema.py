"""The fan-out owner's tables (SPEC §5): their migrations, and what makes a stored row readable.

Owns the SQL that defines `fanout_budgets`, `fanout_reservations` and `fanout_claims`, the
checks that decide whether a stored row is quarantined (DESIGN §2), and the statements both the
budget owner (budget.py) and its claim compaction (compaction.py) share. It holds no state and
runs nothing: it must never open a connection or import the owner.
"""

from __future__ import annotations

from subagents_node.actors import quarantine
from subagents_node.messages.fanout import MAX_LIMIT

SCHEMA_V1 = """
CREATE TABLE fanout_budgets (
    budget_id   TEXT PRIMARY KEY,
    root_run_id TEXT NOT NULL,
    claim_limit INTEGER NOT NULL CHECK (claim_limit > 0),
    used        INTEGER NOT NULL DEFAULT 0 CHECK (used >= 0 AND used <= claim_limit),
    next_seq    INTEGER NOT NULL DEFAULT 0,
    created_at  REAL NOT NULL
);
CREATE TABLE fanout_reservations (
    reservation_id TEXT PRIMARY KEY,
    budget_id      TEXT NOT NULL REFERENCES fanout_budgets(budget_id),
    claims         INTEGER NOT NULL CHECK (claims >= 0),
    state          TEXT NOT NULL
                   CHECK (state IN ('pending', 'committed', 'aborted', 'expired')),
    created_at     REAL NOT NULL,
    expires_at     REAL NOT NULL,
    settled_at     REAL
);
CREATE INDEX fanout_reservations_due ON fanout_reservations(expires_at)
    WHERE state = 'pending';
CREATE TABLE fanout_claims (
    budget_id      TEXT NOT NULL REFERENCES fanout_budgets(budget_id),
    seq            INTEGER NOT NULL,
    path           TEXT NOT NULL,
    claimed_at     REAL NOT NULL,
    reservation_id TEXT REFERENCES fanout_reservations(reservation_id),
    PRIMARY KEY (budget_id, seq)
) WITHOUT ROWID;
CREATE INDEX fanout_claims_by_reservation ON fanout_claims(reservation_id)
    WHERE reservation_id IS NOT NULL
"""

#: Version 2: claim compaction (compaction.py). `claims_compacted_at` is set when a budget's
#: claim rows were deleted (NULL: every claim it holds is kept); the partial index lists the
#: budgets still to look at, oldest first, and is never touched by a claim (a claim writes only
#: `used` and `next_seq`). Reservations get an index by budget so that a budget's pending ones
#: are found, and its settled ones deleted, without a scan.
SCHEMA_V2 = """
ALTER TABLE fanout_budgets ADD COLUMN claims_compacted_at REAL;
CREATE INDEX fanout_budgets_uncompacted ON fanout_budgets(created_at, budget_id)
    WHERE claims_compacted_at IS NULL;
CREATE INDEX fanout_reservations_by_budget ON fanout_reservations(budget_id)
"""
MIGRATIONS = (SCHEMA_V1, SCHEMA_V2)

INSERT_CLAIM = (
    "INSERT INTO fanout_claims(budget_id, seq, path, claimed_at, reservation_id) "
    "VALUES (?, ?, ?, ?, ?)"
)

#: A claim made with its caller's id (fanout.claim `claim_id`): a reservation committed at
#: once, under that id. Parameters: claim_id, budget_id, claims, now.
INSERT_CLAIMED = (
    "INSERT INTO fanout_reservations"
    "(reservation_id, budget_id, claims, state, created_at, expires_at, settled_at) "
    "VALUES (?1, ?2, ?3, 'committed', ?4, ?4, ?4)"
)
#: The paths a reservation (or a claim made with an id) holds, in the order it claimed them.
CLAIM_PATHS = "SELECT path FROM fanout_claims WHERE reservation_id = ? ORDER BY seq"

BUDGETS = "fanout_budgets"
RESERVATIONS = "fanout_reservations"
BUDGET_CHECKS = (
    quarantine.text("root_run_id"),
    quarantine.integer("claim_limit", 1, MAX_LIMIT),
    ("typeof(used) != 'integer' OR used < 0 OR used > claim_limit", "used is not in 0..limit"),
    quarantine.integer("next_seq", 0),
)
BUDGET_PROBLEM = quarantine.problem(BUDGET_CHECKS)
#: A budget's manifest, its count and what makes it unreadable (NULL: nothing).
MANIFEST = (
    f"SELECT root_run_id, claim_limit, used, {BUDGET_PROBLEM} FROM fanout_budgets "
    "WHERE budget_id = ?"
)
#: A batch of n claims, admitted only when the descriptor matches its readable manifest and
#: all n fit (R-FAN-3/13); it answers the first sequence number and the budget afterwards, or
#: no row (nothing changed). Parameters: n, n, budget_id, root_run_id, limit, n, n.
ADMIT = (
    "UPDATE fanout_budgets SET used = used + ?, next_seq = next_seq + ? "
    "WHERE budget_id = ? AND root_run_id = ? AND claim_limit = ? AND used + ? <= claim_limit "
    f"AND {BUDGET_PROBLEM} IS NULL "
    "RETURNING next_seq - ?, claims_compacted_at, used, claim_limit"
)
RESERVATION_CHECKS = (
    quarantine.text("budget_id"),
    quarantine.integer("claims", 0, MAX_LIMIT),
    quarantine.one_of("state", ("pending", "committed", "aborted", "expired")),
    quarantine.number("expires_at"),
)
RESERVATION_PROBLEM = quarantine.problem(RESERVATION_CHECKS)
#: The earliest deadline of a pending reservation that can be read (a broken one never expires).
NEXT_DUE = (
    "SELECT MIN(expires_at) FROM fanout_reservations "
    f"WHERE state = 'pending' AND {RESERVATION_PROBLEM} IS NULL"
)
