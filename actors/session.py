"""SessionActor (placeholder: being written)."""

from __future__ import annotations

from actors.base import OwnerActor


class SessionActor(OwnerActor):
    name = "session"
