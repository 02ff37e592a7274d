"""The owner actors a node starts, in start order. One entry per table family."""

from __future__ import annotations

from actors.base import OwnerActor
from actors.child import ChildActor
from actors.fanout import FanoutBudget
from actors.ledger import CapacityLedger
from actors.session import SessionActor
from actors.supervisor import RunSupervisor

#: The supervisor starts last: its recovery sends to the ledgers.
OWNERS: tuple[type[OwnerActor], ...] = (CapacityLedger, FanoutBudget, SessionActor, RunSupervisor)

#: Owner classes started per run or per child (not singletons); their table families are
#: migrated at node start like the singletons'.
PER_RUN: tuple[type[OwnerActor], ...] = (ChildActor,)
