"""AnnouncePipe: one shim template's announce pipe, as the shim watch's thread reads it.

The template writes `[child_id, pid, start]` there (its stdout) right after each fork, before
the shim runs (actors/child/shim.py `announce`); pid 0 is its word that it forked no shim for
that order. Owns, for one template, the partial line read so far and, per child id, the
orders sent less the shims announced (either may come first): when the pipe ends (the template
and every shim it forked have closed it), what was ordered and never announced forked nothing;
while it lives, orders it announces nothing for are how a stopped template is found.

It never opens, reads or closes the descriptor itself (ShimWatch does, in its thread), never
watches or signals a process (it only reads /proc: is the template stopped, is an announced
process its child), and ignores a line it cannot read.
"""

from __future__ import annotations

import json
import time

from subagents_node.actors.child.procfs import ProcessIdentity, is_alive, stat_of


class AnnouncePipe:
    """One template's announce pipe, as the watch thread reads it: a partial line, and per key
    the orders sent less the shims announced (either may come first; 0 is dropped)."""

    def __init__(self, fd: int, template: ProcessIdentity | None = None) -> None:
        self.fd = fd
        self.template = template  # the template's pid and start time (None: unknown)
        self.ended = False
        self._partial = b""
        self._owed: dict[str, int] = {}
        #: How many keys are owed an announcement, and since when nothing came (monotonic):
        #: orders that wait in a template that forks nothing (a child stopped it) are found.
        self.waiting = 0
        self.progress_at = 0.0

    def _count(self, key: str, step: int) -> None:
        before = self._owed.get(key, 0)
        owed = before + step
        if owed:
            self._owed[key] = owed
        else:
            self._owed.pop(key, None)
        self.waiting += (owed > 0) - (before > 0)

    def expect(self, key: str) -> bool:
        """An order was sent; True when the pipe had ended without announcing it (lost)."""
        if not self.waiting:
            self.progress_at = time.monotonic()
        self._count(key, 1)
        if self.ended and self._owed.get(key, 0) > 0:
            self._count(key, -1)
            return True
        return False

    def lines(self, data: bytes) -> list[tuple[str, ProcessIdentity | None]]:
        """The announcements in `data` (identity None: the template forked no shim for it)."""
        self.progress_at = time.monotonic()
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

    def stopped_template(self, after_s: float) -> ProcessIdentity | None:
        """The template, when orders have waited `after_s` on it with nothing announced and it
        is stopped (SIGSTOP: a child can send it, the template is its shim's parent); a slow
        one is looked at again after as long."""
        now = time.monotonic()
        if not self.waiting or self.template is None or now < self.progress_at + after_s:
            return None
        self.progress_at = now
        stat = stat_of(self.template.pid)
        return self.template if stat is not None and stat.state == "T" else None

    def end(self) -> list[str]:
        """The pipe ended: the keys ordered and never announced (no shim took them)."""
        self.ended = True
        self.fd = -1
        lost = [key for key, owed in self._owed.items() if owed > 0]
        for key in lost:  # a key announced before its order was sent stays: it is not lost
            self._owed.pop(key)
        self.waiting = 0
        return lost


def disowned(identity: ProcessIdentity, template: ProcessIdentity) -> bool:
    """Whether a live process announced on `template`'s pipe is not one of its shims: its
    parent is another process while the template lives (a line a child wrote there through
    the node's own /proc/PID/fd, to have some process of its choice watched as a shim)."""
    shim = stat_of(identity.pid)
    if shim is None or shim.ppid == template.pid:
        return False
    return is_alive(template)  # a template killed since: its shims are another's children


class Unreported:
    """The shims announced and not yet reported, oldest first (the watch thread's): one a child
    stopped before its first report (SIGSTOP to its parent: `kill -STOP $PPID`) is found, as
    its launch waits for that report; a slow one is looked at again after as long."""

    def __init__(self) -> None:
        self._since: dict[tuple[str, ProcessIdentity], float] = {}

    def add(self, key: str, identity: ProcessIdentity) -> None:
        self._since[(key, identity)] = time.monotonic()

    def drop(self, key: str, identity: ProcessIdentity) -> None:
        """Reported (it is watched as such now), or gone."""
        self._since.pop((key, identity), None)

    def due(self, after_s: float) -> float | None:
        """When the oldest is `after_s` old (monotonic), or None."""
        oldest = next(iter(self._since.values()), None)
        return None if oldest is None else oldest + after_s

    def stopped(self, after_s: float) -> list[ProcessIdentity]:
        """The shims `after_s` old or more that are stopped (and forgotten here: their pidfd
        says the rest); those only slow go to the end, looked at again after as long."""
        now = time.monotonic()
        found: list[ProcessIdentity] = []
        while self._since:
            entry, since = next(iter(self._since.items()))
            if now < since + after_s:
                break
            del self._since[entry]
            stat = stat_of(entry[1].pid)
            if stat is not None and stat.state == "T":
                found.append(entry[1])
            elif stat is not None:
                self._since[entry] = now
        return found
