"""The session owner's tables (actors/session.py): their migrations, names and the checks that
say which stored rows cannot be read (quarantine, DESIGN §2).

Owns the DDL and the row checks only; it never reads or writes a row. Migrations are applied
in order by the runtime's Store: never edit one that shipped, add the next.
"""

from __future__ import annotations

from typing import get_args

from subagents_node.actors import quarantine
from subagents_node.messages.constants import MAX_INT32
from subagents_node.messages.runs import RunState
from subagents_node.messages.session import ACTIVE_RUN_STATES, TERMINAL_RUN_STATES

SCHEMA_V1 = """
CREATE TABLE session_budgets (
    session_id TEXT PRIMARY KEY,
    configured_limit INTEGER,
    used INTEGER NOT NULL DEFAULT 0,
    granted INTEGER NOT NULL DEFAULT 0,
    opened_at REAL NOT NULL
);
CREATE TABLE session_grants (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    amount INTEGER NOT NULL,
    granted_at INTEGER NOT NULL,
    previous_limit INTEGER NOT NULL,
    new_limit INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE session_runs (
    session_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    state TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (session_id, run_id)
)
"""
SCHEMA_V2 = """
CREATE TABLE session_reservations (
    reservation_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    requested INTEGER NOT NULL,
    reserved_at REAL NOT NULL
)
"""

BUDGETS, GRANTS, RUNS = "session_budgets", "session_grants", "session_runs"
RESERVATIONS = "session_reservations"
BUDGET_CHECKS = (
    (
        "configured_limit IS NOT NULL AND (typeof(configured_limit) != 'integer' "
        f"OR configured_limit < 1 OR configured_limit > {MAX_INT32})",
        "configured_limit is neither NULL nor a positive integer",
    ),
    quarantine.integer("used", 0, MAX_INT32),
    quarantine.integer("granted", 0, MAX_INT32),
)
BUDGET_PROBLEM = quarantine.problem(BUDGET_CHECKS)
GRANT_CHECKS = (
    quarantine.integer("amount", 1, MAX_INT32),
    quarantine.integer("granted_at", 0),
    quarantine.integer("previous_limit", 0, MAX_INT32),
    quarantine.integer("new_limit", 0, MAX_INT32),
)
GRANT_PROBLEM = quarantine.problem(GRANT_CHECKS)
#: Every state a tracked run can be stored in (terminal ones are deleted, never stored).
STORED_RUN_STATES = frozenset(get_args(RunState)) - TERMINAL_RUN_STATES
RUN_CHECKS = (quarantine.one_of("state", STORED_RUN_STATES), quarantine.number("updated_at"))
RUN_PROBLEM = quarantine.problem(RUN_CHECKS)
ACTIVE_SQL = ", ".join(f"'{s}'" for s in sorted(ACTIVE_RUN_STATES))
RESERVATION_CHECKS = (
    quarantine.integer("requested", 1, MAX_INT32),
    quarantine.number("reserved_at"),
)
RESERVATION_PROBLEM = quarantine.problem(RESERVATION_CHECKS)

MIGRATIONS = (SCHEMA_V1, SCHEMA_V2)
