"""The owner actors a node starts, in start order. One entry per table family."""

from __future__ import annotations

from subagents_node.actors.capacity.ledger import CapacityLedger
from subagents_node.actors.child.actor import ChildActor
from subagents_node.actors.fanout import FanoutBudget
from subagents_node.actors.owner import OwnerActor
from subagents_node.actors.runs.supervisor import RunSupervisor
from subagents_node.actors.session import SessionActor

#: The supervisor starts last: its recovery sends to the ledgers.
OWNERS: tuple[type[OwnerActor], ...] = (CapacityLedger, FanoutBudget, SessionActor, RunSupervisor)

#: Owner classes started per run or per child (not singletons); their table families are
#: migrated at node start like the singletons'.
PER_RUN: tuple[type[OwnerActor], ...] = (ChildActor,)
