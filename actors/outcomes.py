"""What an owner answers: the outcome types, the exactly-once guard on a reply, and the
translation of a full disk (SQLite's SQLITE_FULL, ENOSPC) into the typed `StoreFull`.

Owns no state and no thread; it must never touch a store or a socket itself. The dispatcher
wraps every reply function with `answer_once`; owners and pipelines ask `store_full` whether an
exception means a full disk (a refusal) rather than a bug (a crash).
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
from collections.abc import Callable

from subagents_node.messages.base import Message
from subagents_node.messages.errors import StoreFull, SubagentsError

log = logging.getLogger(__name__)

Outcome = Message | SubagentsError
ReplyFn = Callable[[Outcome], None]


def answer_once(reply: ReplyFn, request_type: str) -> ReplyFn:
    """`reply`, made to deliver at most one outcome: every request is answered exactly once
    (DESIGN §4). A second outcome is a bug on our side (a handler that failed after its
    pipeline had already answered); it is logged, never sent."""
    # Acquiring a lock without blocking is an atomic test-and-set: the first outcome wins even
    # when two threads answer at once.
    first = threading.Lock()

    def once(outcome: Outcome) -> None:
        if not first.acquire(blocking=False):
            log.error("a second answer to %s was dropped: %r", request_type, outcome)
            return
        reply(outcome)

    return once


#: How long a timer's work that met a full disk waits before it is tried again.
STORE_FULL_RETRY_S = 0.5
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def store_full(exc: BaseException, actor: str) -> StoreFull | None:
    """The StoreFull that `exc` means, or None: SQLite's SQLITE_FULL ("database or disk is
    full"), or an OSError ENOSPC/EDQUOT from a file an owner writes (a run's directory)."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        full = (code is not None and code & 0xFF == sqlite3.SQLITE_FULL) or (
            "disk is full" in str(exc)
        )
    else:
        full = isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS
    if not full:
        return None
    return StoreFull(
        f"the disk under the state dir is full; {actor} refused this write and changed "
        "nothing (reads still answer; retry once space is freed)",
        actor=actor,
        reason=str(exc)[:200],
    )
