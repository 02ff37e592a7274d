"""The owner actors a node starts, in start order, and the table families each one keeps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from subagents_node.actors.capacity.ledger import CapacityLedger
from subagents_node.actors.child import rows as child_rows
from subagents_node.actors.fanout import FanoutBudget
from subagents_node.actors.owner import OwnerActor
from subagents_node.actors.runs.supervisor import RunSupervisor
from subagents_node.actors.session import SessionActor
from subagents_node.messages.runs import CHILDREN

#: The run supervisor: its process also hosts the shims' template and the child log cap.
RUNS: type[OwnerActor] = RunSupervisor

#: Start order (they start together; the node waits until every one is ready).
OWNERS: tuple[type[OwnerActor], ...] = (CapacityLedger, FanoutBudget, SessionActor, RunSupervisor)

#: Table families written by an owner besides its own (the RunSupervisor writes `children`,
#: the rows of the child shims, through actors/child/keeper.py).
EXTRA_FAMILIES: Mapping[str, tuple[type[OwnerActor], Sequence[str]]] = {
    CHILDREN: (RunSupervisor, child_rows.MIGRATIONS),
}


def families_of(cls: type[OwnerActor]) -> dict[str, Sequence[str]]:
    """The table families in `cls`'s own database: its own, and the extra ones it writes."""
    own: dict[str, Sequence[str]] = {cls.name: cls.MIGRATIONS}
    for name, (writer, migrations) in EXTRA_FAMILIES.items():
        if writer is cls:
            own[name] = migrations
    return own


#: Every table family, by family name.
FAMILIES: Mapping[str, Sequence[str]] = {
    **{cls.name: cls.MIGRATIONS for cls in OWNERS},
    **{name: migrations for name, (_, migrations) in EXTRA_FAMILIES.items()},
}
