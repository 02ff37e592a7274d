"""A storm of requests from one thread while a test kills an owner process under it.

`Storm` sends one request at a time, each with a fresh name (`attempt(name)`), and keeps the
names the owner acknowledged and those whose answer never came (the owner died with them in
flight: their outcome is unknown until the store is read). The owner-kill tests compare the
two lists with what the owner's database holds after its restart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from subagents_node.messages.errors import SubagentsError
from tests.support.runs import wait_until


class Storm:
    """`attempt(name)` for name = `prefix`0, 1, ... in a thread, until the block ends."""

    def __init__(self, attempt: Callable[[str], object], prefix: str) -> None:
        self.acked: list[str] = []
        self.unknown: list[str] = []
        self._attempt = attempt
        self._prefix = prefix
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Storm:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            name = f"{self._prefix}{n}"
            n += 1
            try:
                self._attempt(name)
            except SubagentsError:
                self.unknown.append(name)  # in flight while its owner died
                continue
            self.acked.append(name)

    def wait_acked(self, count: int) -> None:
        """Until `count` more requests were acknowledged (the storm goes on)."""
        target = len(self.acked) + count
        wait_until(lambda: len(self.acked) >= target, timeout=30, what=f"{count} more acks")
