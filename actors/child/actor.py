"""ChildActor: one child OS process, from spawn to its process-terminal proof (R-EXT-3, R-RUN-5).

Owns its row of the `children` table (the family is shared by every ChildActor; each writes only
the row of its own child id), its Popen, its timers and its exit watches. Life of a child:

    spawn (outside any transaction) in its own process group, stdout/stderr straight into the
      log files (no pipes: nothing to drain, no unbounded memory), stdin from a file or /dev/null
    -> row {pid, process_start_time, started_at, state running} committed -> ChildStarted
    deadline (`after`) or ChildStop -> SIGTERM to the group, SIGKILL `grace_s` later
    leader exits -> members of its group still alive: SIGTERM, SIGKILL after the grace, watched
    tree ended -> proof + terminal state in one transaction -> commit -> ChildExited -> stop

Exits are observed without polling: `process_tree.ExitWatch` blocks a thread in poll() on a
pidfd, which is readable once the process exits. pidfds (rather than a thread blocked in
wait()) because the same mechanism watches processes we are not the parent of: adopted children
after a node restart and the orphaned members of a group, for which wait() is impossible. The
thread that sees our own child exit reaps it with Popen.wait(), so the exit code is exact.

After a node restart `recover_children` starts one ChildActor per row still `running`; it decides
liveness from pid + process start time (a reused pid counts as gone), writes `observed` proof for
the dead ones and adopts the live ones (exit code then unknown: we are not their parent).

It never raises out of the actor for a spawn failure (that is a `not-started` proof), never logs
or stores argv, env or stdin (they may hold the task, R-MISC-1), never restarts a child, and
emits an event only after the state it reports is committed.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pykka

from subagents_node.actors.child import process as cp
from subagents_node.actors.child import rows
from subagents_node.actors.child.process_tree import (
    ExitWatch,
    ProcessIdentity,
    live_group_members,
    signal_group,
)
from subagents_node.actors.owner import ActorContext, Cancel, Job, OwnerActor, Tick
from subagents_node.messages.base import Ack, Message
from subagents_node.messages.errors import Internal
from subagents_node.messages.runs import (
    CHILDREN,
    REASON_ADOPTED_EXITED,
    REASON_GONE,
    REASON_NOT_STARTED,
    ChildEvent,
    ChildExited,
    ChildSpec,
    ChildStop,
    output_tail,
    timeout_error,
)

log = logging.getLogger(__name__)

EventSink = Callable[[ChildEvent], None]


# -- ticks: what happened to the child, delivered through the inbox --------------------------


@dataclass(frozen=True, slots=True)
class Adopt(Tick):
    """The actor started for a child recorded as running by an earlier node: adopt it."""


@dataclass(frozen=True, slots=True)
class Resync(Tick):
    """The actor restarted after a crash that rolled back state it still holds in memory."""


@dataclass(frozen=True, slots=True)
class Spawned(Tick):
    """The spawn returned: `error` says why no process exists, None when it runs."""

    error: str | None


@dataclass(frozen=True, slots=True)
class Deadline(Tick):
    """The child's deadline passed: end its group as `timed_out`."""


@dataclass(frozen=True, slots=True)
class Kill(Tick):
    """The grace after SIGTERM is over: SIGKILL the group."""


@dataclass(frozen=True, slots=True)
class Verify(Tick):
    """A wait after SIGKILL is over: settle, unverified if members are still alive (stuck)."""


@dataclass(frozen=True, slots=True)
class GroupGone(Tick):
    """The watched members of the leader's group have all exited (others may remain)."""


@dataclass(frozen=True, slots=True)
class LeaderExited(Tick):
    """The child's own process exited; `code` is exact when we are its parent, else None."""

    code: int | None


class ChildActor(OwnerActor):
    name = CHILDREN
    MIGRATIONS = (rows.SCHEMA,)

    def __init__(
        self,
        ctx: ActorContext,
        on_event: EventSink,
        spec: ChildSpec | None = None,
        resume_child_id: str | None = None,
    ) -> None:
        if (spec is None) == (resume_child_id is None):
            raise ValueError("give either a spec (spawn) or a resume_child_id (adopt)")
        self._on_event = on_event
        self._spec = spec
        self.child_id = spec.child_id if spec is not None else str(resume_child_id)
        self._record: rows.ChildRecord | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._leader_exited = False
        self._exit = cp.ExitFacts()
        self._group_ours = True
        self._term_sent = False
        self._killed = False
        self._settlement: ChildExited | None = None
        self._outbox: list[ChildEvent] = []
        self._cancels: list[Cancel] = []
        self._watches: list[ExitWatch] = []
        self._watched: frozenset[ProcessIdentity] = frozenset()
        self._end_reason: str | None = None
        self._end_message: str | None = None
        self._recorded = False  # the `Spawned` tick wrote the start (a crash may undo it)
        super().__init__(ctx)

    # -- pykka / OwnerActor hooks ---------------------------------------------------------------

    def handlers(self) -> Mapping[type[Any], Callable[[Any], Message]]:
        return {ChildStop: self._stop_request}

    def on_start(self) -> None:
        super().on_start()
        if self._spec is None:
            self.actor_ref.tell(Adopt())
        else:
            self._start_process(self._spec)

    def on_receive(self, message: Any) -> Any:
        super().on_receive(message)
        self._emit_committed()
        return None

    def on_stop(self) -> None:
        """Stopping (with the node) leaves a live child running: a restart adopts it. The watch
        of our own child keeps its thread until the child exits, to reap it (no zombie)."""
        for cancel in self._cancels:
            cancel()
        for watch in self._watches:
            watch.cancel()
        super().on_stop()
        self._emit_committed(closing=True)
        self._answer_leftovers()

    def recover(self) -> None:
        """Start: nothing to rebuild. Restart after a crash: keep only the events whose state
        reached the store, and re-apply whatever the rolled-back transaction lost."""
        if self._record is None:
            return
        row = rows.read_row(self.db, self.child_id)
        self._outbox = [e for e in self._outbox if rows.committed(e, row)]
        lost = row is None or row["end_reason"] != self._end_reason or self._leader_exited
        if self._settlement is not None:
            lost = not rows.committed(self._settlement, row)
        if lost:
            self.actor_ref.tell(Resync())

    def on_tick(self, tick: Tick) -> None:
        match tick:
            case Resync():
                self._resync()
            case _ if self._settlement is not None:
                pass  # settled: timers and watches still in flight have nothing left to do
            case Spawned(error=error):
                self._record_start(error)
            case Adopt():
                self._adopt()
            case Deadline():
                self._end("timed_out", self._timeout_message())
            case Kill():
                self._kill()
            case Verify():
                self._verify()
            case GroupGone():
                self._check_tree()
            case LeaderExited(code=code):
                self._on_leader_exit(code)

    # -- start ----------------------------------------------------------------------------------

    def _start_process(self, spec: ChildSpec) -> None:
        """Fork and exec outside any transaction (the store's write lock is never held across
        a spawn), then record the start through the usual tick path, before the exit watch
        exists and before any queued message runs: no exit or stop can overtake the record."""
        now = self.ctx.clock()
        record = self._record = rows.ChildRecord.from_spec(spec)
        record.started_at = now
        try:
            self._popen = cp.spawn(spec)
        except cp.SPAWN_ERRORS as exc:
            self.on_receive(Spawned(cp.describe_spawn_error(spec, exc)))
            return
        cp.stamp_identity(record, self._popen.pid, now)
        assert record.pid is not None
        if spec.deadline_s is not None:
            record.deadline_at = now + spec.deadline_s
        self.on_receive(Spawned(error=None))
        if spec.deadline_s is not None:
            self._cancels.append(self.after(spec.deadline_s, Deadline()))
        self._watch_leader()
        self._cap_logs()
        log.info("child %s of run %s started (pid %d)", record.child_id, record.run_id, record.pid)

    def _record_start(self, spawn_error: str | None) -> None:
        record = self._record
        assert record is not None
        if spawn_error is not None:
            self._settle_not_started(spawn_error, record.started_at or self.ctx.clock())
            return
        rows.insert_running(self.db, record, self._end_reason, self._end_message)
        self._outbox.append(cp.started_event(record))
        self._recorded = True

    def _adopt(self) -> None:
        row = rows.read_row(self.db, self.child_id)
        if row is None or row["state"] != "running":
            self.stop()
            return
        record = self._record = rows.ChildRecord.from_row(row)
        self._end_reason, self._end_message = row["end_reason"], row["end_message"]
        liveness = cp.liveness(record)
        if liveness != "alive":
            # A reused pid means our group was empty when the pid was handed out again.
            self._group_ours = liveness == "gone"
            self._exit = cp.ExitFacts(reason=REASON_GONE, at=self.ctx.clock())
            self._leader_exited = True
            self._check_tree()
            return
        self._exit = cp.ExitFacts(reason=REASON_ADOPTED_EXITED)
        self._watch_leader()
        self._cap_logs()
        self._outbox.append(cp.started_event(record, adopted=True))
        if self._end_reason is not None:
            self._terminate_group()
        elif record.deadline_at is not None:
            remaining = record.deadline_at - self.ctx.clock()
            if remaining <= 0:
                self._end("timed_out", self._timeout_message())
            else:
                self._cancels.append(self.after(remaining, Deadline()))
        log.info("child %s of run %s adopted (pid %s)", record.child_id, record.run_id, record.pid)

    def _cap_logs(self) -> None:
        """Issue 12: the child's log files stay under the node's cap while it runs (and get a
        last check when this actor stops); one watcher thread serves every child."""
        record, cap = self._record, self.ctx.cap_log
        if record is None or cap is None:
            return
        for path in dict.fromkeys((record.stdout_path, record.stderr_path)):
            self._cancels.append(cap(path))

    def _watch_leader(self) -> None:
        assert self._record is not None
        leader = cp.leader_identity(self._record)
        ref, popen = self.actor_ref, self._popen

        def exited() -> None:
            code = popen.returncode if popen is not None else None
            cp.tell(ref, LeaderExited(code))

        watch = ExitWatch([leader], exited, popen=popen, name=f"child-{leader.pid}")
        if popen is None:  # adopted: nobody has to reap it, so stopping may drop the watch
            self._watches.append(watch)

    # -- ending ---------------------------------------------------------------------------------

    def _stop_request(self, request: ChildStop) -> Message:
        record = self._record
        live = record is not None and record.pid is not None and self._settlement is None
        if live and not self._leader_exited:
            self._end("stopped", request.reason)
        return Ack()

    def _end(self, reason: str, message: str) -> None:
        """Deadline or stop: record why, then end the whole group. The first reason wins."""
        if self._end_reason is not None or self._leader_exited:
            return
        self._end_reason, self._end_message = reason, message
        rows.record_end(self.db, self.child_id, reason, message)
        self._terminate_group()

    def _terminate_group(self) -> None:
        if self._term_sent:
            return
        self._term_sent = True
        signal_group(self._pgid, signal.SIGTERM)
        self._cancels.append(self.after(self._grace_s, Kill()))

    def _kill(self) -> None:
        self._killed = True
        # Once the leader is gone, only members seen alive just now keep the group id ours.
        if not self._leader_exited or live_group_members(self._pgid):
            signal_group(self._pgid, signal.SIGKILL)
        # SIGKILL cannot be ignored; if members still show up after this, they are stuck.
        self._cancels.append(self.after(max(self._grace_s, 1.0), Verify()))

    def _verify(self) -> None:
        if self._leader_exited:
            self._settle(unverified=bool(live_group_members(self._pgid)))

    def _on_leader_exit(self, returncode: int | None) -> None:
        if self._leader_exited:
            return
        self._leader_exited = True
        self._exit = self._exit.observed(returncode, self.ctx.clock())
        self._check_tree()

    def _check_tree(self) -> None:
        """The leader is gone: settle when its group is empty, else end the group and watch."""
        members = live_group_members(self._pgid) if self._group_ours else []
        if not members:
            self._settle()
            return
        self._terminate_group()
        fresh = frozenset(members) - self._watched
        if not fresh and self._killed:
            self._cancels.append(self.after(self._grace_s, Verify()))
        elif fresh:
            # Members that survived their watch (no pidfd) are left to the kill/verify ticks.
            self._watched |= fresh
            ref = self.actor_ref
            self._watches.append(
                ExitWatch(list(fresh), lambda: cp.tell(ref, GroupGone()), name="group")
            )

    # -- settlement -----------------------------------------------------------------------------

    def _settle(self, unverified: bool = False) -> None:
        record = self._record
        assert record is not None
        event = cp.outcome(
            record,
            self._exit,
            self._end_reason,
            self._end_message,
            unverified,
            self.ctx.clock(),
        )
        self._write_settlement(event)

    def _settle_not_started(self, error: str, now: float) -> None:
        assert self._record is not None
        self._exit = cp.ExitFacts(reason=REASON_NOT_STARTED, at=now)
        event = cp.not_started(self._record, error, now)
        self._write_settlement(event)
        log.warning("child %s of run %s did not start: %s", self.child_id, event.run_id, error)

    def _write_settlement(self, event: ChildExited) -> None:
        assert self._record is not None
        rows.write_settlement(self.db, self._record, event)
        self._settlement = event
        self._outbox.append(event)
        for cancel in self._cancels:
            cancel()
        self._cancels.clear()

    def _resync(self) -> None:
        """Re-apply what a crash rolled back, from the facts this actor still holds."""
        record = self._record
        assert record is not None
        row = rows.read_row(self.db, self.child_id)
        if self._settlement is not None:
            if not rows.committed(self._settlement, row):
                self._write_settlement(self._settlement)
            return
        if row is None and self._recorded:
            rows.insert_running(self.db, record, self._end_reason, self._end_message)
            self._outbox.append(cp.started_event(record))
        elif self._end_reason is not None and self._end_message is not None:
            rows.record_end(self.db, self.child_id, self._end_reason, self._end_message)
        if self._leader_exited:
            self._check_tree()

    # -- events ---------------------------------------------------------------------------------

    def _emit_committed(self, closing: bool = False) -> None:
        if not closing and self.db.in_transaction:
            return  # the group commit is still open: these events are not durable yet
        events, self._outbox = self._outbox, []
        for event in events:
            try:
                self._on_event(event)
            except Exception:
                log.exception("child %s: the event sink failed", self.child_id)
        if not closing and any(isinstance(e, ChildExited) for e in events):
            self.stop()

    def _answer_leftovers(self) -> None:
        """Requests queued behind our stop: a stop of a settled child is done (Ack)."""
        outcome = (
            Ack()
            if self._settlement is not None
            else Internal(f"child actor {self.child_id} stopped", actor=self.name)
        )
        cp.answer_queued_jobs(self.actor_inbox, outcome)

    # -- small facts ----------------------------------------------------------------------------

    @property
    def _pgid(self) -> int:
        assert self._record is not None and self._record.pid is not None
        return self._record.pid

    @property
    def _grace_s(self) -> float:
        assert self._record is not None
        return self._record.grace_s

    def _timeout_message(self) -> str:
        assert self._record is not None
        return timeout_error(self._record.timeout_s or 0.0)


def start_child(
    ctx: ActorContext, spec: ChildSpec, on_event: EventSink
) -> pykka.ActorRef[ChildActor]:
    """Start the actor that spawns and watches `spec`'s process; events go to `on_event`."""
    return ChildActor.start(ctx, on_event, spec=spec)


def recover_children(
    ctx: ActorContext, on_event: EventSink, expected: Iterable[str] = ()
) -> dict[str, pykka.ActorRef[Any]]:
    """After a node restart: one ChildActor per child still recorded as running.

    Each one settles its child with `observed` proof if the process is gone, or adopts it and
    settles it when it exits. Returns the actors by child id (they stop themselves once settled).
    A child in `expected` (the supervisor still waits for it) that had already settled gets its
    stored exit replayed to `on_event`: the node died between the two commits.
    """
    conn = ctx.open_db()
    try:
        child_ids = rows.running_child_ids(conn)
        replays = []
        for child_id in expected:
            row = None if child_id in child_ids else rows.read_row(conn, child_id)
            if row is not None:
                exited = rows.settled_exit(conn, child_id, output_tail(str(row["stdout_path"])))
                if exited is not None:
                    replays.append(exited)
    finally:
        conn.close()
    for exited in replays:
        on_event(exited)
    return {
        child_id: ChildActor.start(ctx, on_event, resume_child_id=child_id)
        for child_id in child_ids
    }


def stop_child(
    ref: pykka.ActorRef[Any], reason: str = "Stopped by request."
) -> pykka.ThreadingFuture[Any]:
    """Ask the child's actor to stop it; the future holds Ack once the stop is recorded."""
    future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    try:
        ref.tell(Job(ChildStop(reason=reason), future.set))
    except pykka.ActorDeadError:
        future.set(Ack())  # the actor stops only after its child settled: nothing to stop
    return future
