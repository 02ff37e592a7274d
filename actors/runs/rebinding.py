"""Rebinding: what the children of the runs a node adopts end with, after a lost node.

Owns the step of recovery (actors/runs/restart.py) that binds adopted runs, by the rule that
binds a run when its children are spawned (actors/runs/binding.py): a node embedded in a
foreground command binds that command's own runs (and the runs they launched); one with a
temporary state dir binds them all. A foreground `run` (or `workflow`) whose node was lost and
that took the state dir over with a node of its own so has its run bound to its process again:
a later kill -9 of it ends the run's tree (`ended_by: node_gone`), as on a node it launched the
run on. `bind` decides it for one run as it is adopted; `tell_shims` then sends each live shim
of each bound run the rebind message (actors/child/rebind.py: `bind.json`, then SIGWINCH), and
records the run's `bound` event: {"pid": the process, "shims": how many were told, "older":
how many were too old to take it}.

Every other adopted run keeps its shims as they are: a run nobody follows (`run --async`),
another command's run, what a `wait` waits on (kill -9 of a `wait` must not stop what its
Ctrl-C would not). A shim forked before the message existed (its claim names no
`shim_version`) is not sent it: a warning says so, its run's event counts it, and its child
outlives the command, as before. It never unbinds a shim (one bound to a command still alive
stays bound to it), never writes a table, and never decides a run's outcome.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from typing import Any, Protocol

from subagents_node.actors.child import rebind
from subagents_node.actors.child import rows as child_rows
from subagents_node.actors.child.shims import signal_shim
from subagents_node.actors.runs.binding import NodeBinding
from subagents_node.actors.runs.liverun import LiveRun

log = logging.getLogger(__name__)

#: The run's event once its live shims were told what they end with.
BOUND = "bound"


class BindingHost(Protocol):
    """What rebinding needs from the RunSupervisor."""

    #: Which runs' children end with this (embedded) node's process (runs/binding.py).
    node_binding: NodeBinding

    @property
    def db(self) -> sqlite3.Connection: ...

    def record_event(self, run_id: str, kind: str, data: dict[str, Any]) -> None: ...


def bind(host: BindingHost, live: LiveRun) -> None:
    """An adopted run is bound to this node's process when a new run of its foreground
    command would be (its children are spawned bound from now on too: a nested run's, say)."""
    live.ends_with = host.node_binding.ends_with(live.foreground)


def tell_shims(host: BindingHost, runs: Iterable[LiveRun]) -> None:
    """Send the rebind message to every live shim of each bound run among `runs` (adopted,
    their children's reports and exit records applied: those in `running` are still going)."""
    for live in runs:
        to = live.ends_with
        if to is None or not live.running:
            continue
        told, older = 0, 0
        for child_id in live.running:
            row = child_rows.read_row(host.db, child_id)
            record_dir = "" if row is None else str(row["record_dir"] or "")
            found = rebind.shim_of(record_dir) if record_dir else None
            if found is None:
                continue  # no shim lives to tell: the node watches what a dead one left
            shim, version = found
            if version < rebind.SHIM_VERSION:
                older += 1
                continue
            try:
                rebind.write_binding(record_dir, to)
            except OSError as err:  # a full or read-only disk: this child stays as it was
                log.warning("run %s: cannot rebind child %s: %s", live.run_id, child_id, err)
                continue
            if signal_shim(shim, rebind.REBIND_SIGNAL):  # False: it has just exited
                told += 1
        if older:
            log.warning(
                "run %s: %d shim(s) predate rebinding (shim_version < %d): their children "
                "do not end with process %d and outlive it, for the next node to adopt",
                live.run_id,
                older,
                rebind.SHIM_VERSION,
                to.pid,
            )
        host.record_event(live.run_id, BOUND, {"pid": to.pid, "shims": told, "older": older})
