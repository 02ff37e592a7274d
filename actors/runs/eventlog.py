"""RunEventLog: the RunSupervisor's run events, in its store and in each run's `events.jsonl`.

Owns the writing of a run event: its `run_events` row (in the host's transaction), its JSON line
(`ts`, `runId`, `type`, data) held for the commit group and appended to `<run dir>/events.jsonl`
once per group (`write_lines`: one open per run per group, not one per event), and the mark
that tells the watchers the run has news. Also the fleet's one `runs.pruned` event (run id
''), which replaces the previous one so they never pile up. It never answers a watcher (the
host answers them once per commit group, before it commits: runs/watchers.py), and never lets
the file fail anything: `events.jsonl` is for people, the store has every event first.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from subagents_node.actors.runs import runstore
from subagents_node.messages import statefiles

log = logging.getLogger(__name__)

EVENTS = "events.jsonl"


class RunEventLog:
    """Writes run events to the host's store (`db`) and, once per group, to their run dirs."""

    def __init__(
        self,
        db: Callable[[], sqlite3.Connection],
        clock: Callable[[], float],
        run_dir: Callable[[str], Path],
        touched: Callable[[str], None],
    ) -> None:
        self._db = db
        self._clock = clock
        self._run_dir = run_dir
        self._touched = touched
        #: Each run's events of this commit group, as `events.jsonl` lines (write_lines).
        self._lines: dict[str, list[str]] = {}
        #: Runs whose `events.jsonl` could not be written (a FIFO, a symlink there): said once.
        self._unwritable: set[str] = set()

    def record(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        now = self._clock()
        runstore.append_event(self._db(), run_id, now, kind, data)
        line = json.dumps({"ts": now, "runId": run_id, "type": kind, **data})
        self._lines.setdefault(run_id, []).append(line)
        self._touched(run_id)

    def announce_pruned(self, run_ids: list[str]) -> None:
        """One fleet event per pass (run id ''): the previous one goes, so they never pile up."""
        db = self._db()
        db.execute("DELETE FROM run_events WHERE run_id = '' AND kind = 'runs.pruned'")
        data: dict[str, Any] = {"run_ids": " ".join(run_ids), "count": len(run_ids)}
        runstore.append_event(db, "", self._clock(), "runs.pruned", data)
        self._touched("")

    def write_lines(self) -> None:
        """Append each run's events of this group to its `events.jsonl`."""
        lines, self._lines = self._lines, {}
        for run_id, texts in lines.items():
            path = self._run_dir(run_id) / EVENTS
            try:
                # Never through a symlink, never blocking on a FIFO (messages/statefiles.py):
                # a child can replace its run's file, and an open() that waited for a reader
                # wedged the supervisor for good.
                fd = statefiles.open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                with open(fd, "a", encoding="utf-8") as fh:
                    fh.write("\n".join(texts) + "\n")
            except OSError as exc:
                # The events log is for people; the store has the events. Said once per run.
                if run_id not in self._unwritable and exc.errno != errno.ENOENT:
                    self._unwritable.add(run_id)
                    log.warning("run %s: %s not written: %s", run_id, path, exc.strerror)
