"""ActorContext: everything an owner needs from the runtime, injected (actors never import runtime).

Owns the shape of that seam: how an owner opens its store, reports a crash or the records it
quarantined, schedules a timer (and `Cancel`, the call that takes one back), reads the clock,
the fault switch and its settings, sends a request to another owner, keeps its children's
log files under the node's cap, and hears of each commit. The runtime fills it in
(runtime/node/ownerproc.py), a unit test with its own doubles.

It holds no state and implements none of these calls; like everything in actors/, it never
imports runtime/.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from subagents_node.actors.outcomes import ReplyFn
from subagents_node.messages.base import Request
from subagents_node.messages.node import QuarantinedRecord

#: Takes back what `schedule` scheduled (a no-op once it has run).
Cancel = Callable[[], None]


@dataclass(frozen=True)
class ActorContext:
    """Everything an owner needs from the runtime, injected (actors never import runtime)."""

    open_db: Callable[[], sqlite3.Connection]
    report_crash: Callable[[str, BaseException], None] = lambda name, exc: None
    #: Tell the runtime which stored records this owner quarantined (replaces the previous
    #: list; called from `recover()` and whenever the list changes).
    report_quarantine: Callable[[str, Sequence[QuarantinedRecord]], None] = lambda name, records: (
        None
    )
    schedule: Callable[[float, Callable[[], None]], Cancel] | None = None
    clock: Callable[[], float] = time.time
    faults: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: Send a request to another owner; its outcome arrives through the reply function, on
    #: another thread (an owner turns it into a Tick of its own for itself). Raises
    #: Busy/UnknownTarget.
    dispatch: Callable[[Request, str, ReplyFn], None] | None = None
    #: Keep a child log file under the node's cap (actors/child/logcap.py); returns the call
    #: that stops watching it.
    cap_log: Callable[[str], Callable[[], None]] | None = None
    #: Hands the log watches taken since the last call to the cap's thread (once per group).
    cap_flush: Callable[[], None] | None = None
    #: Told after each commit of the owner's store (the runtime checkpoints the WAL off the
    #: owner's thread: runtime/node/checkpointer.py).
    on_commit: Callable[[], None] | None = None
