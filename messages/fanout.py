"""Protocol of the fanout owner (placeholder: being written)."""

from __future__ import annotations

from messages.base import Request

REQUESTS: tuple[type[Request], ...] = ()
