"""The owner actors a node starts, in start order. One entry per table family."""

from __future__ import annotations

from actors.base import OwnerActor
from actors.fanout import FanoutBudget
from actors.ledger import CapacityLedger
from actors.session import SessionActor

OWNERS: tuple[type[OwnerActor], ...] = (CapacityLedger, FanoutBudget, SessionActor)
