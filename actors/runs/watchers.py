"""RunWatchers: the long-poll watchers of one run (`runs.watch`) or of every run (`watch_all`).

Owns the waiting replies and their timeout timers. A watcher is answered as soon as its run has
a new event, but answers are computed once per commit group (`answer_touched`, called by the
supervisor just before it commits), not once per event: a run with hundreds of children emits
hundreds of events, and rebuilding its view per event made watching quadratic. Answers are
queued with the owner's `reply_later`, so none leaves before the events it reports are durable.

Waiting watchers are bounded (`max_watchers`, issue 12): each holds a reply and a timer, so
past the bound a new watcher that would wait is refused at once with `Busy` (one that can be
answered at once is always answered); nothing waits outside the bound.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from subagents_node.actors.context import Cancel
from subagents_node.actors.inbox import Tick
from subagents_node.actors.owner import Outcome, ReplyFn
from subagents_node.actors.records import init_fields
from subagents_node.actors.runs import runstore
from subagents_node.messages.errors import (
    Busy,
    RecordQuarantined,
    RunNotFound,
    StoreFull,
    SubagentsError,
)
from subagents_node.messages.supervisor import (
    MAX_WATCH_EVENTS,
    FleetEvents,
    RunEvent,
    RunEvents,
    RunView,
    Watch,
    WatchAll,
)

#: The key of node-wide (fleet) watchers.
FLEET = "*"
ACTIVE = ("queued", "running", "paused")
#: Default bound on waiting watchers (config `max_watchers`).
DEFAULT_MAX_WATCHERS = 1024


class WatchTimeout(Tick):
    """A waiting watcher's `wait_s` passed with no new event: answer it with what there is.
    `key` is its run id (or FLEET); `watcher_id` tells it from the others waiting there."""

    __slots__ = ("key", "watcher_id")
    key: str
    watcher_id: int

    def __init__(self, key: str, watcher_id: int) -> None:
        init_fields(self, key=key, watcher_id=watcher_id)


@dataclass
class Watcher:
    reply: ReplyFn
    after_seq: int
    cancel: Cancel
    limit: int = 500


class RunWatchers:
    def __init__(
        self,
        after: Callable[[float, Tick], Cancel],
        reply_later: Callable[[ReplyFn, Outcome], None],
        limit: int = DEFAULT_MAX_WATCHERS,
    ) -> None:
        self._after = after
        self._reply_later = reply_later
        self.limit = limit
        self._waiting: dict[str, dict[int, Watcher]] = {}
        self._count = 0  # watchers in `_waiting`, kept so the bound costs O(1)
        self._touched: set[str] = set()

    def watch(
        self, db: sqlite3.Connection, run_id: str, request: Watch, reply: ReplyFn
    ) -> RunEvents | None:
        """The answer now, or None when the reply waits for the run's next event."""
        events = runstore.events_after(db, run_id, request.after_seq, MAX_WATCH_EVENTS + 1)
        view = runstore.view(db, run_id)
        assert view is not None
        if events or request.wait_s == 0 or view.state not in ACTIVE:
            return _page(view, events, request.after_seq)
        self._wait(run_id, Watcher(reply, request.after_seq, lambda: None), request.wait_s)
        return None

    def watch_all(self, db: sqlite3.Connection, request: WatchAll, reply: ReplyFn) -> None:
        watcher = Watcher(reply, request.after_seq, lambda: None, request.limit)
        if request.wait_s == 0 or runstore.last_event_seq(db) > request.after_seq:
            self._answer(db, FLEET, watcher)
        else:
            self._wait(FLEET, watcher, request.wait_s)

    def touched(self, run_id: str) -> None:
        """The run has a new event (answered at the next `answer_touched`)."""
        self._touched.add(run_id)

    def answer_touched(self, db: sqlite3.Connection) -> None:
        touched, self._touched = self._touched, set()
        if not touched:
            return
        for key in (*touched, FLEET):
            waiting = self._waiting.pop(key, {})
            self._count -= len(waiting)
            for watcher in waiting.values():
                watcher.cancel()
                self._answer(db, key, watcher)

    def expired(self, db: sqlite3.Connection, key: str, watcher_id: int) -> None:
        watcher = self._waiting.get(key, {}).pop(watcher_id, None)
        if watcher is not None:
            self._count -= 1
            if not self._waiting[key]:
                del self._waiting[key]
            self._answer(db, key, watcher)

    @property
    def waiting(self) -> int:
        return self._count

    def _wait(self, key: str, watcher: Watcher, wait_s: float) -> None:
        if self._count >= self.limit:
            raise Busy(
                f"too many watchers are waiting ({self._count}/{self.limit}); retry later "
                "or raise max_watchers",
                target="supervisor",
                watchers=self._count,
                limit=self.limit,
            )
        watcher_id = id(watcher.reply)
        watcher.cancel = self._after(wait_s, WatchTimeout(key, watcher_id))
        self._waiting.setdefault(key, {})[watcher_id] = watcher
        self._count += 1

    def _answer(self, db: sqlite3.Connection, key: str, watcher: Watcher) -> None:
        self._reply_later(self._kept(db, key, watcher), _outcome(db, key, watcher))

    def _kept(self, db: sqlite3.Connection, key: str, watcher: Watcher) -> ReplyFn:
        """The watcher's reply, for an answer delivered with the group that computed it. A
        full disk that fails that group undoes the events the answer reports, and turned the
        answer into `store_full` ("refused this write and changed nothing"): a watch is a
        read, and `run` and `wait`, which follow a run by watching it, gave up on a run that
        went on. The watcher is answered with what the store holds once the group is rolled
        back instead (no new event, at worst: its caller watches again)."""

        def answer(outcome: Outcome) -> None:
            if isinstance(outcome, StoreFull):
                # A store that cannot be read (or a group not rolled back): it stands.
                with contextlib.suppress(sqlite3.Error, SubagentsError):
                    if not db.in_transaction:
                        outcome = _outcome(db, key, watcher)
            watcher.reply(outcome)

        return answer


def _outcome(db: sqlite3.Connection, key: str, watcher: Watcher) -> Outcome:
    """A watcher's answer, from the store as `db` reads it: its run's (or the fleet's) events
    after its `after_seq`."""
    if key == FLEET:
        events = runstore.all_events_after(db, watcher.after_seq, watcher.limit)
        last = events[-1].seq if events else watcher.after_seq
        touched = dict.fromkeys(e.run_id for e in events)
        runs = runstore.readable_views(db, list(touched))
        return FleetEvents(events=events, runs=runs, last_seq=last)
    try:
        view = runstore.view(db, key)
    except RecordQuarantined as err:
        return err
    if view is None:
        return RunNotFound(f"Run not found: {key}", run_id=key)
    events = runstore.events_after(db, key, watcher.after_seq, MAX_WATCH_EVENTS + 1)
    return _page(view, events, watcher.after_seq)


def _page(view: RunView, events: list[RunEvent], after_seq: int) -> RunEvents:
    """A watch's answer: at most MAX_WATCH_EVENTS of `events` (read one past it, to know
    whether more wait), with `more` set when some do."""
    more = len(events) > MAX_WATCH_EVENTS
    events = events[:MAX_WATCH_EVENTS]
    last = events[-1].seq if events else after_seq
    return RunEvents(run=view, events=events, last_seq=last, more=more)
