"""Client API for the capacity owner (placeholder: being written)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.client import Client


class CapacityAPI:
    def __init__(self, client: Client) -> None:
        self._client = client
