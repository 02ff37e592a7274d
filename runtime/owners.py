"""The owner actors a node starts, in start order. One entry per table family."""

from __future__ import annotations

from actors.base import OwnerActor

OWNERS: tuple[type[OwnerActor], ...] = ()
