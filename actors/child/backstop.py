"""DeadlineBackstop: what ends a child's tree when its shim did not (ChildKeeper's part).

A shim keeps its child's deadline and carries out a stop; a child can freeze its shim (SIGSTOP:
the shim is its parent, and any process of the node's user may send it), and then neither
happens. Owns the one "late" call asked for at a time (the earliest deadline of a running
child, past its grace and a margin) and the checks made when it, or a stop's grace, is over: a
tree its shim has not ended by then is recorded timed out (or stays stopped) and its shim is
SIGKILLed; what the shim leaves then goes the dead-shim way (orphans.py), which ends it at once.

It never ends a tree its shim's exit record says ended, never signals a process it has not
verified by pid and start time, and writes only the end a row records (rows.record_end).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from subagents_node.actors.child import rows
from subagents_node.actors.child.procfs import ProcessIdentity
from subagents_node.actors.child.readback import read_record
from subagents_node.actors.child.records import EXIT_RECORD
from subagents_node.actors.child.shims import signal_shim
from subagents_node.messages.runs import timeout_error

log = logging.getLogger(__name__)

#: How long past a stop's grace (or a deadline's) a live shim may take to end its tree before
#: it is killed.
SHIM_OVERDUE_MARGIN_S = 3.0

Connection = Any  # sqlite3.Connection (kept loose: rows.py owns the SQL)


class DeadlineBackstop:
    def __init__(self, on_due: Callable[[str, float, str], object] | None) -> None:
        """`on_due("", at, "late")` asks for the `late` call at `at` (the keeper's caller's
        clock)."""
        self._on_due = on_due
        #: The "late" call asked for (one at a time: the earliest deadline), or None.
        self._late_at: float | None = None

    def arm(self, at: float | None) -> None:
        """Ask for the "late" call at `at` unless an earlier one is asked for already."""
        if at is None or self._on_due is None:
            return
        if self._late_at is None or at < self._late_at:  # a later call asked stands: harmless
            self._late_at = at
            self._on_due("", at, "late")

    def late(self, db: Connection, now: float) -> list[Callable[[], None]]:
        """The "late" call: running children whose deadline and grace are over by a margin and
        whose shim recorded no end were not ended by their shim (a child froze it, SIGSTOP):
        each is recorded timed out, and the calls returned (made once that has committed)
        SIGKILL their shims, whose death hands what is left to the dead-shim path, which kills
        it at once. The call is asked again for the next such deadline."""
        self._late_at = None
        kills: list[Callable[[], None]] = []
        upcoming: list[float] = []
        for child_id, over_at in rows.deadlines(db):
            if over_at + SHIM_OVERDUE_MARGIN_S > now:
                upcoming.append(over_at + SHIM_OVERDUE_MARGIN_S)
                continue
            row = rows.read_row(db, child_id)
            if row is None or row["shim_pid"] is None:
                continue  # its first report (or its shim's death) is still to come
            exit_record = read_record(os.path.join(row["record_dir"] or "", EXIT_RECORD)) or {}
            if exit_record.get("tree_ended"):
                continue  # ended in time; its report is on its way
            message = timeout_error(float(row["timeout_s"] or 0))
            rows.record_end(db, child_id, "timed_out", message)
            log.warning("child %s outlived its deadline: its shim did not end it", child_id)
            shim = ProcessIdentity(row["shim_pid"], row["shim_start"])
            kills.append(functools.partial(_kill, shim))
        self.arm(min(upcoming, default=None))
        return kills

    def overdue_in(self, db: Connection, child_id: str) -> float | None:
        """After a stop that signalled a live shim: how long until it is overdue (its grace and
        a margin), when a tree still running means the shim did not end it; None: no shim."""
        row = rows.read_row(db, child_id)
        if row is None or row["state"] != "running" or row["shim_pid"] is None:
            return None
        return float(row["grace_s"]) + SHIM_OVERDUE_MARGIN_S

    def kill_overdue_shim(self, db: Connection, child_id: str) -> None:
        """A stopped child still runs after the grace: its shim did not end its tree (its child
        froze it with SIGSTOP, say). SIGKILL the shim: what it leaves is the escaped tree, which
        the recorded stop kills at once. Its exit record says if the tree had ended after all."""
        row = rows.read_row(db, child_id)
        if row is None or row["state"] != "running" or row["end_reason"] is None:
            return
        if row["shim_pid"] is None:
            return
        shim = ProcessIdentity(row["shim_pid"], row["shim_start"])
        if signal_shim(shim, signal.SIGKILL):
            log.warning(
                "the shim of child %s did not end its stopped tree in time: killed", child_id
            )


def _kill(shim: ProcessIdentity) -> None:
    signal_shim(shim, signal.SIGKILL)
