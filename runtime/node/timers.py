"""One timer thread per node: runs callbacks at deadlines (reservation and slot TTL expiry).

Owns the heap of pending callbacks. Waits on a condition until the earliest deadline or a new
timer, so it never polls. Callbacks must be quick (they only `tell` an actor).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="subagents-timers", daemon=True)
        self._thread.start()

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Callable[[], None]:
        seq = next(self._seq)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay_s, seq, fn))
            self._cond.notify()

        def cancel() -> None:
            with self._cond:
                self._cancelled.add(seq)

        return cancel

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                _, seq, fn = heapq.heappop(self._heap)
                if seq in self._cancelled:
                    self._cancelled.discard(seq)
                    continue
            try:
                fn()
            except Exception:
                log.exception("timer callback failed")
