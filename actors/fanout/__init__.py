"""The fan-out owner (SPEC §5): the budget actor (budget.py), its tables (schema.py) and how long
it keeps claim rows (compaction.py).

It must never import the node or the client side; the node injects what the owner needs.
"""

from subagents_node.actors.fanout.budget import FanoutBudget, ReservationsDue, budget_id_for

__all__ = ["FanoutBudget", "ReservationsDue", "budget_id_for"]
