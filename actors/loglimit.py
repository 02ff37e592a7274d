"""RepeatedWarnings: at most one log line a second for each kind of warning a peer can cause at
will (a refused frame, a reply it never reads, a frame from a revoked key), from each peer.

Owns, for one I/O loop, when each (kind, peer) last logged and how many it held back since. A local
client that pipelined 20,000 requests without reading had the gateway log one WARNING per
dropped reply (3,376 lines for one flood), and one that sent bad frames one per frame: enough
to rotate every useful line out of `node.log` and its three backups. The first of a kind from a
peer is logged as it comes; later ones from that peer within the window are counted, and the
count is logged as one line when the window ends (the loop's poll waits no longer than
`next_deadline`, so the line comes even when the flood stops: no timer, no polling). Another
peer's first is logged as it comes: one flooding peer hides no one else's.

Single-threaded: only the loop that owns it calls it. It never drops the count of what it held
back, and never changes the level or text of the first line of a kind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

#: How long each kind logs once.
WINDOW_S = 1.0


class _Held:
    __slots__ = ("count", "last", "until")

    def __init__(self, until: float) -> None:
        self.until = until
        self.count = 0
        self.last = ""


class RepeatedWarnings:
    def __init__(
        self,
        logger: logging.Logger,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._window = window_s
        self._clock = clock
        self._kinds: dict[tuple[str, bytes], _Held] = {}

    def warn(self, kind: str, peer: bytes, message: str) -> None:
        """Log `message` now, or count it when a line of `kind` from `peer` (its routing id)
        was logged within the window."""
        now = self._clock()
        key = (kind, peer)
        held = self._kinds.get(key)
        if held is not None and now < held.until:
            held.count += 1
            held.last = message
            return
        if held is not None:
            self._summarize(kind, held)
        self._log.warning("%s", message)
        self._kinds[key] = _Held(now + self._window)

    def next_deadline(self) -> float | None:
        """Seconds until the first window with something held back ends (None: none)."""
        ends = [h.until for h in self._kinds.values() if h.count]
        return max(0.0, min(ends) - self._clock()) if ends else None

    def flush_due(self) -> None:
        """Log the count of each kind whose window has ended; forget the kinds gone quiet."""
        now = self._clock()
        for key, held in list(self._kinds.items()):
            if now >= held.until:
                self._summarize(key[0], held)
                del self._kinds[key]

    def _summarize(self, kind: str, held: _Held) -> None:
        if held.count:
            self._log.warning(
                "%d more like it (%s, from the same peer) within %.0f s; the last: %s",
                held.count,
                kind,
                self._window,
                held.last,
            )
