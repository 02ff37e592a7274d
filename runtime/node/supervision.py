"""Restart intensity: how many actor crashes a node tolerates before it stops (OTP-style).

Owns the crash history and nothing else. Exceeding `max_restarts` within `window_s` calls
`on_exceeded` once, with the reason; the node then stops with that error instead of limping on.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable


class RestartIntensity:
    def __init__(
        self,
        on_exceeded: Callable[[str], None],
        max_restarts: int = 3,
        window_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_exceeded = on_exceeded
        self._max = max_restarts
        self._window = window_s
        self._clock = clock
        self._crashes: deque[float] = deque()
        self._lock = threading.Lock()  # crashes are reported from several actor threads
        self._tripped = False

    def report(self, actor: str, exc: BaseException) -> None:
        now = self._clock()
        with self._lock:
            self._crashes.append(now)
            while self._crashes and now - self._crashes[0] > self._window:
                self._crashes.popleft()
            trip = len(self._crashes) > self._max and not self._tripped
            self._tripped = self._tripped or trip
        if trip:
            self._on_exceeded(
                f"actor {actor!r} crashed {len(self._crashes)} times within {self._window:g}s "
                f"(limit {self._max}); last error: {exc!r}"
            )
