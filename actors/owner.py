"""OwnerActor: the single owner of one family of tables, and the rules every owner follows.

What it owns: its SQLite connection (opened in its own thread), the transaction that groups the
mutations waiting in its inbox, and the replies that wait for that transaction to commit.

The rules, enforced here so no subclass can forget them:
- One message at a time (pykka). Each request runs inside a SAVEPOINT: a typed error rolls the
  request back, so a refused request changes nothing.
- Group commit: while more messages wait in the inbox, the open transaction keeps growing (up to
  `GROUP_MAX` requests); when the inbox is empty, the transaction commits and only then are the
  grouped replies sent. No reply leaves before the state it reports is durable.
- Crash: an unexpected exception rolls its request back, answers it with `Internal`, commits the
  rest of the group, reports the crash (the runtime's restart-intensity limit may stop the node)
  and restarts the actor in place: a fresh connection and `recover()` from the store. Messages
  still queued survive the restart; in-memory caches do not.
- Full disk: SQLITE_FULL or ENOSPC is no crash. The whole open group is undone, every write in
  it is answered `StoreFull` (reads and refusals keep their answers), the owner reopens its
  store and carries on: the next write tries again, a timer's work is retried by itself
  (STORE_FULL_RETRY_S), `group_undone()` lets the owner take up what the group had begun in
  memory, and nothing counts against the restart intensity.
- Exactly once: `outcomes.answer_once` wraps every reply function the dispatcher hands out.
- Quarantine: a stored record that does not parse is no crash. The owner calls `quarantine()`
  (from `recover()` or the read that met it), counts the record as occupied / unavailable, and
  the runtime lists it in `status` and `doctor` (DESIGN §2).
It must never touch another owner's tables, and never block on another actor.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, ParamSpec

import pykka

from subagents_node.actors.context import ActorContext, Cancel
from subagents_node.actors.inbox import DEFERRED, Job, Mailbox, Tick

# Outcome and ReplyFn are re-exported: every owner module names them from here.
from subagents_node.actors.outcomes import STORE_FULL_RETRY_S, store_full
from subagents_node.actors.outcomes import Outcome as Outcome
from subagents_node.actors.outcomes import ReplyFn as ReplyFn
from subagents_node.messages.base import Ack, Message, Request
from subagents_node.messages.errors import BadRequest, Internal, StoreFull, SubagentsError
from subagents_node.messages.node import DebugRaise, DebugSleep, QuarantinedRecord

#: The arguments of a callback `to_self` makes.
P = ParamSpec("P")

log = logging.getLogger(__name__)


class OwnerActor(pykka.ThreadingActor):
    """Base class for the ledger owners. Subclasses set `name`, `MIGRATIONS` and `handlers()`."""

    name: ClassVar[str] = "owner"
    #: Ordered DDL scripts for this owner's table family; applied by the runtime's Store.
    MIGRATIONS: ClassVar[Sequence[str]] = ()
    GROUP_MAX: ClassVar[int] = 256

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.restarts = 0
        self._db: sqlite3.Connection | None = None
        #: Replies waiting for the group's commit; the flag marks outcomes that report a write
        #: (they turn into StoreFull if the commit fails; reads and refusals stand as they are).
        self._pending: list[tuple[ReplyFn, Outcome, bool]] = []
        self._effects: list[Callable[[], None]] = []
        self._crashing = False
        #: The reply function of the request being handled (for handlers that defer).
        self.current_reply: ReplyFn | None = None
        self._handlers: dict[type[Request], Callable[[Any], Message]] = dict(self.handlers())
        self._mailbox: Mailbox | None = None
        #: Stored records this owner could not read, by (table, key); reported as a whole.
        self._quarantined_records: dict[tuple[str, str], QuarantinedRecord] = {}
        #: Whether the message being handled runs in a savepoint (False: it opened the group's
        #: transaction, so undoing it is rolling the whole transaction back).
        self._in_savepoint = False
        #: A subclass without its own before_flush costs no savepoint per group.
        self._has_before_flush = type(self).before_flush is not OwnerActor.before_flush

    # -- subclass API -------------------------------------------------------------------------

    def handlers(self) -> Mapping[type[Request], Callable[[Any], Message]]:
        """Map each request class this owner serves to its handler."""
        return {}

    def recover(self) -> None:
        """Rebuild whatever the owner keeps besides the store (timers, caches) from the store."""

    def on_tick(self, tick: Tick) -> None:
        """Handle a tick of this owner's own `Tick` subclasses (`match tick:`); runs in a
        savepoint like a request."""

    def before_flush(self) -> None:
        """Called once per group, inside its transaction, just before it commits: the place
        for work worth doing once per group rather than once per message."""

    def group_undone(self, full: StoreFull) -> None:
        """The disk was full: the open group was rolled back, its after-commit effects were
        dropped and the store reopened. The place to take up again what the group's messages
        had begun in memory and now waits for an effect that will never come."""

    def quarantine(self, table: str, key: str, reason: str) -> QuarantinedRecord:
        """Fail closed for one stored record that does not parse: remember it and report this
        owner's whole list to the runtime (status, doctor). The caller keeps counting the record
        as occupied / unavailable and skips it; nothing else changes."""
        record = QuarantinedRecord(owner=self.name, table=table, key=key, reason=reason[:300])
        if self._quarantined_records.get((table, key)) != record:
            log.error("%s: quarantined %s[%s]: %s", self.name, table, key, reason)
            self._quarantined_records[(table, key)] = record
            self.ctx.report_quarantine(self.name, list(self._quarantined_records.values()))
        return record

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "store connection is opened in on_start"
        return self._db

    def reply_later(self, reply: ReplyFn, outcome: Outcome) -> None:
        """Answer a deferred request; delivered, like every reply, after the next commit."""
        self._pending.append((reply, outcome, not isinstance(outcome, SubagentsError)))

    def after(self, delay_s: float, tick: Tick) -> Cancel:
        """Deliver `tick` to this actor's inbox after `delay_s` (never blocks, never polls)."""
        if self.ctx.schedule is None:
            return lambda: None
        tell = self.tell_self
        return self.ctx.schedule(max(0.0, delay_s), lambda: tell(tick))

    # -- the mailbox: pykka's inbox in a unit test, the owner process's loop in a node ---------

    def host(self, mailbox: Mailbox) -> None:
        """Serve from `mailbox` (actors/loop.py's OwnerLoop) instead of a pykka thread."""
        self._mailbox = mailbox

    def tell_self(self, message: Job | Tick) -> None:
        """Queue `message` for this owner; safe from any thread, dropped once it has stopped."""
        if self._mailbox is not None:
            self._mailbox.post(message)
            return
        ref = self.actor_ref
        if ref.is_alive():
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(message)

    def to_self(self, make: Callable[P, Tick]) -> Callable[P, None]:
        """A callback (run on another thread) that delivers the tick `make` builds to us."""
        tell = self.tell_self

        def deliver(*args: P.args, **kwargs: P.kwargs) -> None:
            tell(make(*args, **kwargs))  # dropped once we have stopped: nobody to tell

        return deliver

    def _inbox_empty(self) -> bool:
        if self._mailbox is not None:
            return self._mailbox.empty()
        return bool(self.actor_inbox.empty())

    # -- pykka hooks --------------------------------------------------------------------------

    def on_start(self) -> None:
        self._db = self.ctx.open_db()
        self.recover()
        self._flush()

    def on_stop(self) -> None:
        self._flush()
        if self._db is not None:
            self._db.close()
            self._db = None

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Job):
            self._run(message.request, message.reply)
        elif isinstance(message, Tick):
            self._run_tick(message)
        if len(self._pending) >= self.GROUP_MAX or self._inbox_empty():
            self._before_flush()
            self._flush()
        return None

    # -- the rules ----------------------------------------------------------------------------

    def _begin(self) -> None:
        # The first message of a group opens the transaction and needs no savepoint of its own:
        # nothing else is in the transaction to keep, so undoing it is a plain ROLLBACK. Two
        # statements fewer per message when messages arrive one at a time.
        if self.db.in_transaction:
            self.db.execute("SAVEPOINT request")
            self._in_savepoint = True
        else:
            self.db.execute("BEGIN IMMEDIATE")
            self._in_savepoint = False

    def _release(self) -> None:
        if self._in_savepoint:
            self.db.execute("RELEASE request")

    def _rollback(self) -> None:
        """Undo the current message. A store too broken to roll back is left to the restart
        (`_crashed` reopens the connection; the uncommitted group dies with the old one)."""
        try:
            if not self.db.in_transaction:
                return
            if self._in_savepoint:
                self.db.execute("ROLLBACK TO request")
                self.db.execute("RELEASE request")
            else:
                self.db.execute("ROLLBACK")
        except sqlite3.Error:
            log.exception(
                "%s: rollback failed; the restart discards the open transaction", self.name
            )

    def _run(self, request: Request, reply: ReplyFn) -> None:
        self.current_reply = reply
        if request.read_only and not self.db.in_transaction:
            self._run_read_only(request, reply)
            return
        try:
            # Inside the try: an SQLite error on BEGIN (a lock wait that timed out) answers this
            # message and restarts the owner; it must never end the actor.
            self._begin()
            outcome: Outcome = self._handle(request)
            self._release()
        except SubagentsError as err:
            self._rollback()
            self._pending.append((reply, err, False))
            return
        except Exception as exc:
            full = store_full(exc, self.name)
            if full is not None:
                # SQLite may already have rolled the whole group back: fail all of it.
                self._pending.append((reply, full, False))
                self._group_failed(full)
                return
            self._rollback()
            self._pending.append(
                (
                    reply,
                    Internal(f"{self.name} failed on {request.type}: {exc!r}", actor=self.name),
                    False,
                )
            )
            self._crashed(exc)
            return
        if outcome is not DEFERRED:
            self._pending.append((reply, outcome, True))

    def _run_read_only(self, request: Request, reply: ReplyFn) -> None:
        """A query with no group open: answered without the store's write lock, so queries
        (status views, long-polls) never make other owners' writers wait."""
        try:
            outcome: Outcome = self._handle(request)
        except SubagentsError as err:
            self._pending.append((reply, err, False))
            return
        except Exception as exc:
            full = store_full(exc, self.name)
            if full is not None:
                self._pending.append((reply, full, False))
                return
            self._pending.append(
                (
                    reply,
                    Internal(f"{self.name} failed on {request.type}: {exc!r}", actor=self.name),
                    False,
                )
            )
            self._crashed(exc)
            return
        if outcome is not DEFERRED:
            self._pending.append((reply, outcome, False))

    def _run_tick(self, tick: Tick) -> None:
        try:
            self._begin()
            self.on_tick(tick)
            self._release()
        except Exception as exc:
            full = store_full(exc, self.name)
            if full is not None:
                # The tick's work is undone with its group; do it again once space may be back.
                log.warning(
                    "%s: %s; retrying %s in %gs",
                    self.name,
                    full.message,
                    type(tick).__name__,
                    STORE_FULL_RETRY_S,
                )
                self._group_failed(full)
                self.after(STORE_FULL_RETRY_S, tick)
                return
            self._rollback()
            self._crashed(exc)

    def _handle(self, request: Request) -> Message:
        handler = self._handlers.get(type(request))
        if handler is not None:
            return handler(request)
        if isinstance(request, DebugRaise | DebugSleep):
            return self._debug(request)
        raise BadRequest(f"{self.name} does not serve {request.type}", reason="wrong_target")

    def _debug(self, request: DebugRaise | DebugSleep) -> Message:
        if not self.ctx.faults:
            raise BadRequest("fault injection is disabled on this node", reason="faults_disabled")
        if isinstance(request, DebugRaise):
            raise RuntimeError(f"injected fault in {self.name}")
        time.sleep(request.ms / 1000)
        return Ack()

    def after_commit(self, effect: Callable[[], None]) -> None:
        """Run `effect` once the current group transaction has committed (dropped if the
        commit fails). For effects that must never get ahead of the state they depend on,
        like a message to another owner that assumes a record of ours is durable."""
        self._effects.append(effect)

    def _before_flush(self) -> None:
        if not self._has_before_flush:
            return
        if self._db is None or not self._db.in_transaction:
            self.before_flush()
            return
        self.db.execute("SAVEPOINT request")
        self._in_savepoint = True
        try:
            self.before_flush()
        except Exception as exc:
            full = store_full(exc, self.name)
            if full is not None:
                self._group_failed(full)
                return
            self._rollback()
            self._crashed(exc)
            return
        self._release()

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        effects, self._effects = self._effects, []
        if self._db is not None and self._db.in_transaction:
            try:
                self._db.commit()
                if self.ctx.on_commit is not None:
                    self.ctx.on_commit()
            except sqlite3.Error as exc:
                full = store_full(exc, self.name)
                with contextlib.suppress(sqlite3.Error):
                    self._db.rollback()
                if full is not None:
                    self._deliver([(r, full if w else o, False) for r, o, w in pending])
                    self._reopen()
                    self._undone(full)
                    return
                log.exception(
                    "%s: commit failed; %d replies turn into errors", self.name, len(pending)
                )
                failed = Internal(f"{self.name} could not commit: {exc}", actor=self.name)
                self._deliver([(r, failed if w else o, False) for r, o, w in pending])
                self._crashed(exc)
                return
        for effect in effects:
            try:
                effect()
            except Exception:
                log.exception("%s: an after-commit effect failed", self.name)
        self._deliver(pending)

    def _group_failed(self, full: StoreFull) -> None:
        """The disk is full: undo the whole open group, answer every write in it StoreFull
        (reads and refusals keep their answers), and start afresh from the store. Not a
        crash: nothing is counted against the restart intensity, and the next write simply
        tries again, so the owner serves writes as soon as space returns."""
        log.warning("%s: %s", self.name, full.message)
        pending, self._pending = self._pending, []
        self._effects = []
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.rollback()
        self._deliver([(r, full if w else o, False) for r, o, w in pending])
        self._reopen()
        self._undone(full)

    def _undone(self, full: StoreFull) -> None:
        try:
            self.group_undone(full)
        except Exception as exc:
            full_again = store_full(exc, self.name)
            if full_again is None:
                self._crashed(exc)
            else:
                log.warning("%s: %s (while taking the undone group up again)", self.name, full)

    def _deliver(self, pending: list[tuple[ReplyFn, Outcome, bool]]) -> None:
        for reply, outcome, _ in pending:
            try:
                reply(outcome)
            except Exception:
                log.exception("%s: delivering a reply failed", self.name)

    def _reopen(self) -> None:
        """A fresh connection and in-memory state rebuilt from what the store committed.

        The fresh connection is opened before the old one closes. Closing the last connection
        to a WAL database removes its `-wal` and `-shm` files, whose space then goes to
        whoever writes next: on a full disk the open that followed could not make them again
        (`disk I/O error`), and the owner was left holding a closed connection. An open that
        fails leaves the old connection (rolled back, still usable) in place."""
        fresh = self.ctx.open_db()
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        self._db = fresh
        self.recover()

    def _crashed(self, exc: BaseException) -> None:
        log.error("%s crashed: %r; restarting from the store", self.name, exc, exc_info=exc)
        if not self._crashing:  # a commit that fails while crashing must not recurse
            self._crashing = True
            try:
                self._flush()
            finally:
                self._crashing = False
        self.restarts += 1
        self.ctx.report_crash(self.name, exc)
        self._reopen()
