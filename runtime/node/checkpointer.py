"""WalCheckpointer: moves an owner's committed pages from its WAL into its database file on a
thread of its own, so that the owner's loop never waits on a checkpoint's copying and fsyncs.

Without it SQLite checkpoints inside the commit that takes the WAL past its threshold (1,000
pages by default): every few hundred commits one of them paid ~5 ms, and so did every request
waiting behind it. At 8 clients those stalls were most of the claims' p99 (bench/claims.py:
4.4 ms with them, 2.3 ms without). The owner's connection keeps an automatic checkpoint only
as a backstop (`BACKSTOP_PAGES`), for a WAL this thread cannot keep short: a writer that never
pauses (a PASSIVE checkpoint running beside it never catches up with it, so the WAL never
starts over), or a disk that refuses the copy.

Owns one SQLite connection (opened, used and closed on its thread) and the thread. It never
begins a transaction and never writes a row: a PASSIVE checkpoint copies pages already
committed and never blocks the owner's writes, so the owner stays the only writer of its
database (DESIGN §2). SQLite releases the GIL while it checkpoints. It must never be asked
for anything on the owner's hot path but `committed()`: a counter, and an event now and then.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: The owner's own automatic checkpoint, kept as a backstop: 8,192 pages (32 MiB of WAL with
#: 4 KiB pages), far past what this thread lets a WAL grow to while its owner pauses at times.
BACKSTOP_PAGES = 8192
#: Commits between two checkpoints. A claim's commit writes ~3 pages: ~800 pages a time, about
#: SQLite's own 1,000, so the WAL stays as short as it was (a supervisor's commits are larger:
#: its WAL grows further between two, and the backstop bounds it). Every 128 or 512 commits
#: read the same in the bench.
EVERY_COMMITS = 256


class WalCheckpointer:
    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        name: str,
        every_commits: int = EVERY_COMMITS,
    ) -> None:
        if every_commits < 1:
            raise ValueError("every_commits must be at least 1")
        self._connect = connect
        self._name = name
        self._every = every_commits
        self._commits = 0  # the owner's thread only
        self._due = threading.Event()
        self._stopping = False
        #: Checkpoints run so far (tests and logs read it; written by the thread only).
        self.checkpoints = 0
        self._failing: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """The owner committed a transaction (called on its loop's thread, after the commit)."""
        self._commits += 1
        if self._commits >= self._every:
            self._commits = 0
            self._due.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Let a checkpoint under way finish, then end the thread and close its connection."""
        self._stopping = True
        self._due.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        db: sqlite3.Connection | None = None
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stopping:
                    return
                try:
                    if db is None:
                        db = self._connect()
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except (sqlite3.Error, OSError) as exc:
                    self._failed(exc)
                    if db is not None:
                        db.close()
                        db = None
                    continue
                self.checkpoints += 1
                if self._failing is not None:
                    log.info("%s: WAL checkpoints work again", self._name)
                    self._failing = None
        finally:
            if db is not None:
                db.close()

    def _failed(self, exc: BaseException) -> None:
        # Once per kind of failure, not once per checkpoint: a full disk would otherwise log
        # a line every EVERY_COMMITS commits. The owner's commits go on meanwhile (its WAL
        # grows until the backstop, or until the disk has room again).
        reason = f"{type(exc).__name__}: {exc}"
        if reason != self._failing:
            log.warning("%s: a WAL checkpoint failed (%s); the owner serves on", self._name, reason)
            self._failing = reason
