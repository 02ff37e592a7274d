"""The owner actors a node starts, in start order, and the table families each one keeps.

Owns the names of the owners and where each one's actor class lives (`actor_class` imports
it). The node imports them all before it forks its first owner (runtime/node/ownersup.py);
importing this module loads none of them, so a process that only names owners (doctor, the
node's option checks) does not pay for all of their code.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from subagents_node.messages.runs import CHILDREN

if TYPE_CHECKING:
    from subagents_node.actors.owner import OwnerActor

#: Each owner's name -> (module, class) of its actor (they start together; the node waits until
#: every one is ready, and stops them in the reverse of this order).
_ACTORS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "capacity": ("subagents_node.actors.capacity.ledger", "CapacityLedger"),
        "fanout": ("subagents_node.actors.fanout", "FanoutBudget"),
        "session": ("subagents_node.actors.session", "SessionActor"),
        "supervisor": ("subagents_node.actors.runs.supervisor", "RunSupervisor"),
    }
)

#: Every owner's name, in start order.
NAMES: tuple[str, ...] = tuple(_ACTORS)

#: The run supervisor: its process also hosts the shims' template and the child log cap.
RUNS = "supervisor"

#: Table families written by an owner besides its own (the RunSupervisor writes `children`,
#: the rows of the child shims, through actors/child/keeper.py): family -> (writer, (module,
#: attribute) of its migrations).
EXTRA_FAMILIES: Mapping[str, tuple[str, tuple[str, str]]] = MappingProxyType(
    {CHILDREN: (RUNS, ("subagents_node.actors.child.rows", "MIGRATIONS"))}
)


def actor_class(name: str) -> type[OwnerActor]:
    """The actor class of owner `name`, imported on first use."""
    module, attribute = _ACTORS[name]
    cls: type[OwnerActor] = getattr(importlib.import_module(module), attribute)
    return cls


def owner_classes() -> tuple[type[OwnerActor], ...]:
    """Every owner's actor class, in start order (imports them all: for doctor and the docs)."""
    return tuple(actor_class(name) for name in NAMES)


def families_of(name: str) -> dict[str, Sequence[str]]:
    """The table families in owner `name`'s own database: its own, and the extra ones it
    writes (imports its actor class)."""
    own: dict[str, Sequence[str]] = {name: actor_class(name).MIGRATIONS}
    for family, (writer, (module, attribute)) in EXTRA_FAMILIES.items():
        if writer == name:
            own[family] = getattr(importlib.import_module(module), attribute)
    return own


def all_families() -> dict[str, Sequence[str]]:
    """Every table family, by family name (imports every actor class)."""
    return {family: s for name in NAMES for family, s in families_of(name).items()}
