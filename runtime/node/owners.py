"""The owner actors a node starts, in start order, and every table family it migrates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from subagents_node.actors.capacity.ledger import CapacityLedger
from subagents_node.actors.child import rows as child_rows
from subagents_node.actors.fanout import FanoutBudget
from subagents_node.actors.owner import OwnerActor
from subagents_node.actors.runs.supervisor import RunSupervisor
from subagents_node.actors.session import SessionActor
from subagents_node.messages.runs import CHILDREN

#: The supervisor starts last: its recovery sends to the ledgers.
OWNERS: tuple[type[OwnerActor], ...] = (CapacityLedger, FanoutBudget, SessionActor, RunSupervisor)

#: Table families written by an owner besides its own (the RunSupervisor writes `children`,
#: the rows of the child shims, through actors/child/keeper.py).
EXTRA_FAMILIES: Mapping[str, tuple[type[OwnerActor], Sequence[str]]] = {
    CHILDREN: (RunSupervisor, child_rows.MIGRATIONS),
}

#: Every table family the node migrates at start, by family name.
FAMILIES: Mapping[str, Sequence[str]] = {
    **{cls.name: cls.MIGRATIONS for cls in OWNERS},
    **{name: migrations for name, (_, migrations) in EXTRA_FAMILIES.items()},
}
