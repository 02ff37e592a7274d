"""AnnouncePipe: one shim template's announce pipe, as the shim watch's thread reads it.

Each shim writes `[child_id, pid, start]` there (its stdout, the template's) before it starts
its child (actors/child/shim.py `announce`); pid 0 is the template's word that it forked no shim
for that order. Owns, for one template, the partial line read so far and, per child id, the
orders sent less the shims announced (either may come first): when the pipe ends (the template
and every shim it forked have closed it), what was ordered and never announced forked nothing.

It never opens, reads or closes the descriptor itself (ShimWatch does, in its thread), never
watches a process, and ignores a line it cannot read.
"""

from __future__ import annotations

import json

from subagents_node.actors.child.procfs import ProcessIdentity


class AnnouncePipe:
    """One template's announce pipe, as the watch thread reads it: a partial line, and per key
    the orders sent less the shims announced (either may come first; 0 is dropped)."""

    def __init__(self, fd: int, template: int = 0) -> None:
        self.fd = fd
        self.template = template  # the template's pid (0: unknown)
        self.ended = False
        self._partial = b""
        self._owed: dict[str, int] = {}

    def _count(self, key: str, step: int) -> None:
        owed = self._owed.get(key, 0) + step
        if owed:
            self._owed[key] = owed
        else:
            self._owed.pop(key, None)

    def expect(self, key: str) -> bool:
        """An order was sent; True when the pipe had ended without announcing it (lost)."""
        self._count(key, 1)
        if self.ended and self._owed.get(key, 0) > 0:
            self._count(key, -1)
            return True
        return False

    def lines(self, data: bytes) -> list[tuple[str, ProcessIdentity | None]]:
        """The announcements in `data` (identity None: the template forked no shim for it)."""
        *whole, self._partial = (self._partial + data).split(b"\n")
        found: list[tuple[str, ProcessIdentity | None]] = []
        for line in whole:
            try:
                key, pid, start = json.loads(line)
                identity = ProcessIdentity(int(pid), float(start)) if pid else None
            except (ValueError, TypeError):
                continue  # not a shim's (nothing else writes there): ignored
            self._count(str(key), -1)
            found.append((str(key), identity))
        return found

    def end(self) -> list[str]:
        """The pipe ended: the keys ordered and never announced (no shim took them)."""
        self.ended = True
        self.fd = -1
        lost = [key for key, owed in self._owed.items() if owed > 0]
        for key in lost:
            self._owed.pop(key)
        return lost
