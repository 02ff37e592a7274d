"""A fan-out owner on its own store, with a hand-moved clock and timer queue (tests only).

The owner runs as a real actor on a real SQLite store and is reached over its own socket, but
its ActorContext gets the clock and the timers: a test moves time forward and the owner's timers
fire at once, so deadlines and retention are tested exactly and nothing waits on wall time.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from subagents_node.actors.context import ActorContext
from subagents_node.actors.fanout import FanoutBudget
from subagents_node.client.fanout import FanoutAPI
from subagents_node.node.store import Store
from tests.support.nodes import new_state_dir
from tests.support.owners import LoopHost


@dataclass
class _Timer:
    due: float
    fn: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTime:
    """The owner's clock and timer queue (ActorContext.clock / .schedule), moved by the test."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._lock = threading.Lock()  # the owner schedules from its thread
        self._timers: list[_Timer] = []

    def clock(self) -> float:
        with self._lock:
            return self.now

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Callable[[], None]:
        timer = _Timer(self.clock() + delay_s, fn)
        if delay_s <= 0:
            fn()  # like the node's timer thread: a past deadline fires at once
            return timer.cancel
        with self._lock:
            self._timers.append(timer)
        return timer.cancel

    def armed(self) -> list[float]:
        with self._lock:
            return sorted(t.due for t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward and fire every timer that is now due, earliest first."""
        with self._lock:
            self.now += seconds
            due = sorted((t for t in self._timers if t.due <= self.now), key=lambda t: t.due)
            self._timers = [t for t in self._timers if t.due > self.now]
        for timer in due:
            if not timer.cancelled:
                timer.fn()


class OwnerHarness:
    """One FanoutBudget on its own store, reached through the in-process client."""

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.dir = new_state_dir()
        self.store = Store(self.dir / "state.db")
        self.store.migrate({FanoutBudget.name: FanoutBudget.MIGRATIONS})
        self.time = ManualTime()
        self.ctx = ActorContext(
            open_db=self.store.connect,
            schedule=self.time.schedule,
            clock=self.time.clock,
            settings=dict(settings or {}),
        )
        # The owner runs on the loop an owner process runs, reached over its own socket.
        self.host = LoopHost(FanoutBudget, self.ctx, self.dir)
        self.start()
        self._probe = self.fanout.create("probe", 1)

    @property
    def fanout(self) -> FanoutAPI:
        return self.host.client.fanout

    def start(self) -> None:
        self.host.ctx = self.ctx
        self.host.start()

    def stop(self) -> None:
        self.host.stop()

    def restart(self) -> None:
        """Stop the owner and start a new one on the same store (recover() runs)."""
        self.stop()
        self.start()

    def sync(self) -> None:
        """Return once the owner has handled everything sent before (timer ticks included).

        `validate` neither expires nor changes anything, so what the store shows afterwards is
        what the ticks did."""
        self.fanout.validate(self._probe)

    def rows(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with sqlite3.connect(f"file:{self.store.path}?mode=ro", uri=True) as conn:
            return [tuple(row) for row in conn.execute(sql, args)]

    def overdue_pending(self) -> int:
        (row,) = self.rows(
            "SELECT COUNT(*) FROM fanout_reservations WHERE state = 'pending' AND expires_at <= ?",
            self.time.now,
        )
        return int(str(row[0]))

    def close(self) -> None:
        self.host.close()
        shutil.rmtree(self.dir, ignore_errors=True)
