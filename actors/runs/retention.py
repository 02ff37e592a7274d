"""RunRetention: which finished runs are past their retention, and removing them (issue 12).

Owns the retention rule and its timer for the run supervisor. A run is prunable when it is
terminal, ended before the cutoff, is not live in the supervisor, and has no sub-run that is
still going. Pruning deletes its rows (`runs`, `run_children`, `run_events`, `run_appends`,
`run_approvals`, and its `children` rows, which the supervisor owns too), inside the
supervisor's transaction, and hands its directory under the runs root to be removed at once,
not after that commit: on a full disk the commit fails, and only the space the directories
free lets it succeed. A crash or a full disk in between leaves a terminal run's record without
its directory (shown with no directory; `logs` says it was pruned); the next prune deletes the
record. A `runs.prune` is answered once the group has committed, or once a full disk has undone
it: then with the directories removed and the records kept (`records_kept`), never
`store_full` ("changed nothing"), since something did change.

The directories are removed by one thread of their own (`DirectoryRemover`), in the order they
were pruned: removing a thousand run directories took seconds, and the supervisor would answer
nothing meanwhile. A stop waits (bounded) for what is queued; a crash leaves the rest as
directories with or without records, and the next prune or orphan sweep removes them.

The node applies `run_retention_days` by itself with one timer message (`RetentionDue`) armed
at the moment the oldest finished run passes its retention, re-armed after each pass and when
a run ends; there is no polling loop. A pass prunes at most `PASS_MAX` runs and, when more are
due, is re-armed at once: the requests that arrived meanwhile are served between passes. A pass
that finds the oldest run blocked (a sub-run still going) re-arms no sooner than `RECHECK_S`
later. `runs.prune` (`prune_request`) prunes on demand:
past the request's own age, or the configured one (refused when retention is off).

Both also remove run directories that have no record (`orphans`): what a launch refused after
making its directory leaves when its own cleanup fails too (out of descriptors), or a crash
between a prune's commit and its removal. One is removed only when no `runs` row names it, no
admission of that run id is under way (`admitting`: its row may not be written yet; the
supervisor is one thread, so that check and the row's write cannot interleave), and it is
untouched since before the cutoff and `ORPHAN_GRACE_S`. A sweep lists every run directory (one
per run kept: tens of thousands), so the timer's passes sweep at most once per
`ORPHAN_SWEEP_S` (an orphan is removed only long past its retention anyway); `runs.prune`
sweeps each time it is asked.

It never removes a path outside the runs root and never follows a symlink out of it.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import sqlite3
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from subagents_node.actors.context import Cancel
from subagents_node.actors.inbox import DEFERRED, Tick
from subagents_node.actors.outcomes import ReplyFn, store_full
from subagents_node.messages.base import Message
from subagents_node.messages.errors import BadRequest
from subagents_node.messages.retention import MAX_PRUNED_PER_REQUEST, Prune, PruneResult
from subagents_node.messages.runs import TERMINAL_RUN_STATES

log = logging.getLogger(__name__)

#: The earliest a retention pass re-runs after one that left a blocked run behind.
RECHECK_S = 60.0
#: Runs one automatic retention pass prunes at the most (one transaction on the supervisor).
PASS_MAX = 100
#: How long a stopping supervisor waits for the directories still queued for removal.
REMOVE_ON_STOP_S = 10.0
#: The least age of a run directory without a record that prune removes: a launch's directory
#: is recorded within its admission (seconds); this is a margin on top of `admitting`.
ORPHAN_GRACE_S = 600.0
#: The least time between two orphan sweeps of the timer's passes: a sweep reads every run
#: directory, and a busy node's passes come every `RECHECK_S` or sooner.
ORPHAN_SWEEP_S = 3600.0
#: A run directory's name: a run id (launches.py, `uuid4().hex[:12]`); nothing else is removed.
_RUN_ID = re.compile(r"[0-9a-f]{12}")
_TERMINAL = tuple(sorted(TERMINAL_RUN_STATES))
_IN_TERMINAL = ", ".join("?" * len(_TERMINAL))


class RetentionDue(Tick):
    """The oldest finished run has passed its retention: prune what is past it."""

    __slots__ = ()


class RunRetention:
    def __init__(
        self,
        runs_root: Callable[[], Path],
        retention_s: float,
        after: Callable[[float, Tick], Cancel],
        after_commit: Callable[[Callable[[], None]], None],
        clock: Callable[[], float],
        announce: Callable[[list[str]], None],
        admitting: Callable[[str], bool] = lambda run_id: False,
    ) -> None:
        self._runs_root = runs_root
        self._admitting = admitting  # whether run id's admission is under way
        self.retention_s = retention_s
        self._after = after
        self._after_commit = after_commit
        self._clock = clock
        self._announce = announce  # a fleet event naming the pruned runs (watch_all sees it)
        self._armed_at: float | None = None
        self._swept_at: float | None = None  # the timer's last orphan sweep (None: none yet)
        self._cancel: Cancel = lambda: None
        self._remover = DirectoryRemover()
        #: The prune requests of the open group: their reply, its answer once the group has
        #: committed, and once a full disk has undone it (the directories went; rows stay).
        self._answers: list[tuple[ReplyFn, PruneResult, PruneResult]] = []

    # -- the rule -----------------------------------------------------------------------------

    def prunable(
        self,
        db: sqlite3.Connection,
        cutoff: float,
        is_live: Callable[[str], bool],
        limit: int = MAX_PRUNED_PER_REQUEST,
    ) -> tuple[list[tuple[str, str]], bool]:
        """(run id, run dir) of the runs to prune, oldest first (at most `limit`); and whether
        more are due."""
        rows = db.execute(
            # `+state`: walk runs_by_end from the oldest end up to the limit, never the state
            # index (every finished run) and a sort of them all.
            f"SELECT run_id, run_dir FROM runs r WHERE +state IN ({_IN_TERMINAL}) "
            "AND ended_at IS NOT NULL AND ended_at < ? AND NOT EXISTS ("
            f"  SELECT 1 FROM runs c WHERE c.parent_run_id = r.run_id "
            f"  AND c.state NOT IN ({_IN_TERMINAL})) "
            "ORDER BY ended_at LIMIT ?",
            (*_TERMINAL, cutoff, *_TERMINAL, limit + 1),
        ).fetchall()
        found = [(str(r["run_id"]), str(r["run_dir"])) for r in rows if not is_live(r["run_id"])]
        return found[:limit], len(found) > limit

    def prune(
        self,
        db: sqlite3.Connection,
        cutoff: float,
        is_live: Callable[[str], bool],
        dry_run: bool = False,
        limit: int = MAX_PRUNED_PER_REQUEST,
    ) -> tuple[list[str], bool, bool]:
        """The runs pruned (or to prune), whether more are due, and whether their rows were
        deleted (False: a full disk kept them; their directories went all the same)."""
        victims, more = self.prunable(db, cutoff, is_live, limit)
        if dry_run or not victims:
            return [run_id for run_id, _ in victims], more, False
        ids = [run_id for run_id, _ in victims]
        deleted = self._delete_rows(db, ids)
        # The directories go now, not after the commit: on a full disk that commit fails, and
        # the space they free is what lets the next try delete the rows (their records show
        # with no directory meanwhile, terminal runs all of them).
        self._remover.remove(self._run_dirs([Path(run_dir) for _, run_dir in victims]))
        if not deleted:
            return ids, more, False
        self._announce(ids)
        log.info("pruned %d finished runs that ended before %.0f", len(ids), cutoff)
        return ids, more, True

    def _delete_rows(self, db: sqlite3.Connection, ids: list[str]) -> bool:
        """Delete the runs' rows; False when the disk is too full for even that (the rows
        stay). Raises when the full disk undid more than this (the whole open group)."""
        marks = ", ".join("?" * len(ids))
        db.execute("SAVEPOINT prune_rows")
        try:
            for table in ("run_events", "run_children", "run_appends", "run_approvals"):
                db.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", ids)
            if db.execute("SELECT 1 FROM sqlite_master WHERE name='children'").fetchone():
                db.execute(f"DELETE FROM children WHERE run_id IN ({marks})", ids)
            db.execute(f"DELETE FROM runs WHERE run_id IN ({marks})", ids)
        except sqlite3.Error as exc:
            if store_full(exc, "supervisor") is None or not db.in_transaction:
                raise  # nothing removed yet: the owner answers store_full, truthfully
            db.execute("ROLLBACK TO prune_rows")
            db.execute("RELEASE prune_rows")
            return False
        db.execute("RELEASE prune_rows")
        return True

    def prune_request(
        self,
        db: sqlite3.Connection,
        request: Prune,
        is_live: Callable[[str], bool],
        reply: ReplyFn | None = None,
    ) -> Message:
        """runs.prune: finished runs past the cutoff. Answered (`reply`) once the group has
        committed, or once a full disk undid it: its directories are gone either way, and the
        answer says whether their records went too (DEFERRED then)."""
        age = self.retention_s if request.older_than_s is None else request.older_than_s
        if request.older_than_s is None and age <= 0:
            raise BadRequest(
                "run retention is off (run_retention_days = 0): give an age to prune",
                reason="retention_off",
            )
        cutoff = self._clock() - age
        pruned, more, deleted = self.prune(db, cutoff, is_live, request.dry_run)
        orphans = self.sweep_orphans(db, cutoff, request.dry_run)
        result = PruneResult(
            pruned=pruned, orphans=orphans, cutoff=cutoff, dry_run=request.dry_run, more=more
        )
        if request.dry_run or not (pruned or orphans) or reply is None:
            return result
        # Directories went already: whatever the commit does, the answer must not be
        # `store_full` ("changed nothing").
        kept = result.model_copy(update={"pruned": [], "records_kept": pruned})
        if not self._answers:
            self._after_commit(self._answer_committed)
        self._answers.append((reply, result if deleted else kept, kept))
        return DEFERRED  # type: ignore[no-any-return]

    def _answer_committed(self) -> None:
        answers, self._answers = self._answers, []
        for reply, committed, _ in answers:
            reply(committed)

    def undone(self) -> None:
        """A full disk undid the group: the prunes in it removed their directories; their
        records stay for the next prune. Each is told so (not `store_full`: something changed)."""
        answers, self._answers = self._answers, []
        for reply, _, kept in answers:
            reply(kept)

    def sweep_orphans(
        self, db: sqlite3.Connection, cutoff: float, dry_run: bool = False
    ) -> list[str]:
        """Remove (unless `dry_run`) the run directories without a record; their names."""
        found = self.orphans(db, cutoff)
        if found and not dry_run:
            self._remover.remove(self._run_dirs(found))
            log.warning("removing %d run directories that have no record", len(found))
        return [directory.name for directory in found]

    def orphans(
        self, db: sqlite3.Connection, cutoff: float, limit: int = MAX_PRUNED_PER_REQUEST
    ) -> list[Path]:
        """Run directories under the runs root that no `runs` row names, of no admission
        under way, untouched since before `cutoff` and the grace (at most `limit`)."""
        newest = min(cutoff, self._clock() - ORPHAN_GRACE_S)
        found: list[Path] = []
        try:
            entries = os.scandir(self._runs_root())
        except OSError:  # no runs root yet (or unreadable): nothing to sweep
            return found
        with entries:
            for entry in entries:
                if len(found) >= limit:
                    break
                if not _RUN_ID.fullmatch(entry.name) or self._admitting(entry.name):
                    continue
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    if entry.stat(follow_symlinks=False).st_mtime >= newest:
                        continue
                except OSError:
                    continue
                if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (entry.name,)).fetchone():
                    continue
                found.append(Path(entry.path))
        return found

    def close(self) -> None:
        """The supervisor stops: let the queued removals finish (bounded)."""
        self._remover.close(REMOVE_ON_STOP_S)

    def _run_dirs(self, directories: list[Path]) -> list[Path]:
        """The directories that are run directories right under the runs root."""
        root = self._runs_root().resolve()
        kept = []
        for directory in directories:
            try:
                target = directory.resolve()
            except OSError:
                continue
            if target.parent != root or directory.is_symlink():
                log.warning("not removing %s: it is not a run directory under %s", directory, root)
                continue
            kept.append(target)
        return kept

    # -- the timer ----------------------------------------------------------------------------

    def arm(self, db: sqlite3.Connection, not_before: float = 0.0) -> None:
        """Arm the timer for the oldest finished run's retention (nothing when retention is off)."""
        if self.retention_s <= 0:
            return
        # The first finished run on runs_by_end (`+state` keeps SQLite off the state index,
        # which would read every finished run to find the minimum).
        row = db.execute(
            f"SELECT ended_at FROM runs WHERE +state IN ({_IN_TERMINAL}) "
            "AND ended_at IS NOT NULL ORDER BY ended_at LIMIT 1",
            _TERMINAL,
        ).fetchone()
        if row is None:
            return
        oldest = row[0]
        due = max(float(oldest) + self.retention_s, not_before)
        if self._armed_at is not None and self._armed_at <= due:
            return
        self._cancel()
        self._armed_at = due
        self._cancel = self._after(max(0.0, due - self._clock()), RetentionDue())

    def run_ended(self, db: sqlite3.Connection) -> None:
        if self._armed_at is None:
            self.arm(db)

    def due(self, db: sqlite3.Connection, is_live: Callable[[str], bool]) -> None:
        self._armed_at = None
        now = self._clock()
        _, more, _ = self.prune(db, now - self.retention_s, is_live, limit=PASS_MAX)
        if self._swept_at is None or now - self._swept_at >= ORPHAN_SWEEP_S:
            self._swept_at = now
            self.sweep_orphans(db, now - self.retention_s)
        self.arm(db, not_before=now if more else now + RECHECK_S)


class DirectoryRemover:
    """One thread that removes the directories handed to it, in order; started on first use."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[Path] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def remove(self, directories: list[Path]) -> None:
        if not directories:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="run-dir-remover", daemon=True)
            self._thread.start()
        self._queue.put(directories)

    def close(self, wait_s: float) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(wait_s)
            self._thread = None

    def _run(self) -> None:
        while (directories := self._queue.get()) is not None:
            for directory in directories:
                failed = _remove_tree(directory)
                if failed:  # its record is gone: the orphan sweep tries again, once it is old
                    log.warning(
                        "cannot remove run directory %s (%d failure(s), first %s); a later "
                        "prune removes it once it can",
                        directory,
                        len(failed),
                        failed[0],
                    )


def _remove_tree(directory: Path) -> list[str]:
    """Remove `directory` as far as it can be; what could not be removed, and why."""
    failed: list[str] = []

    def note(_function: object, path: str, error: object) -> None:
        exc = error[1] if isinstance(error, tuple) else error  # 3.11's exc_info, 3.12's exception
        failed.append(f"{path}: {exc}")

    if sys.version_info >= (3, 12):
        shutil.rmtree(directory, onexc=note)
    else:
        shutil.rmtree(directory, onerror=note)
    return failed
