"""CapacityLedger (placeholder: being written)."""

from __future__ import annotations

from actors.base import OwnerActor


class CapacityLedger(OwnerActor):
    name = "capacity"
