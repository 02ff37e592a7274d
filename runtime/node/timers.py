"""One timer thread per owner process: runs callbacks at deadlines (reservation and slot TTL
expiry).

Owns the heap of pending callbacks. Waits on a condition until the earliest deadline or a new
timer, so it never polls. Callbacks must be quick (they only `tell` an actor). What it keeps is
bounded by the timers pending: a cancel after the timer fired leaves nothing behind, and
cancelled entries are dropped from the heap once they are half of it.
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
        self._live: set[int] = set()  # scheduled, neither fired nor cancelled
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="subagents-timers", daemon=True)
        self._thread.start()

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Callable[[], None]:
        seq = next(self._seq)
        due = time.monotonic() + delay_s
        with self._cond:
            # Wake the thread only when this timer is now the earliest: it already waits for
            # the earliest one, and a wake-up costs the owner's thread the GIL (a slot's TTL
            # is armed on every acquire).
            earliest = not self._heap or due < self._heap[0][0]
            heapq.heappush(self._heap, (due, seq, fn))
            self._live.add(seq)
            if earliest:
                self._cond.notify()

        def cancel() -> None:
            with self._cond:
                self._live.discard(seq)
                if len(self._heap) > 64 and len(self._live) < len(self._heap) // 2:
                    self._heap = [entry for entry in self._heap if entry[1] in self._live]
                    heapq.heapify(self._heap)

        return cancel

    @property
    def held(self) -> int:
        """What it keeps: heap entries (pending, or cancelled and not yet dropped) plus the
        ids of the pending ones. Zero once every timer has fired or been cancelled."""
        with self._cond:
            return len(self._heap) + len(self._live)

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
                if seq not in self._live:
                    continue  # cancelled
                self._live.discard(seq)
            try:
                fn()
            except Exception:
                log.exception("timer callback failed")
