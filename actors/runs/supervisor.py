"""RunSupervisor: the owner of every run record, and the driver of every run's children.

Owns the "supervisor" table family (runs, run_children, run_events; see runs/runstore.py), the
live runs of this node (their plans, their children, their deadlines) and the watchers
waiting on run events. It admits launches through `runs/admission.py` (ledger calls go out as
messages; their answers come back as `Answer` ticks, routed by the call's typed key, so this
thread never blocks on another owner), starts children group by group (parallel with a
concurrency cap; chain steps in order, with `{previous}`), and settles each run once its last
child has process-terminal proof: the run's state, its events, the session's view of it, and
the capacity report that frees its slot. What the other owners must hear of a run (that
report, the session's view) is owed through the outbox (`run_outbox`, runs/outbox.py): written
with the change that owes it, sent once that has committed, in order, until answered, so a
ledger owner that is restarting or unreachable when a run ends hears of it when it is back.

The moves are in modules that take this actor as their host, each saying what it owns:
admission.py, launches.py (the way in), children.py, steps.py and pauses.py, settle.py (the
end), appends.py, runrequests.py (reads and stops), eventlog.py and restart.py (recovery).
This module holds what they share (the live runs, the pipelines, the outbox, the keeper),
binds each request to its handler and routes each tick; it never takes back a move they own.

Children run under child shims (actors/child/: one small process per child, its parent and
subreaper, which outlives the node); this actor is the only writer of their rows (the
`children` family, through `ChildKeeper`) and learns their lives from the shims' reports
(`child.report`, acknowledged only once committed). It never reads another owner's tables,
never kills a process itself (a shim ends its tree when told), and never stores task text
(R-MISC-1). A run or child row that cannot be read is quarantined (DESIGN §2): reported by
status and doctor, left out of `runs.list`, refused by the requests that name it, and never
adopted after a restart, so its slot and claims stay held; every other run keeps working.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from subagents_node.actors.child.keeper import ChildKeeper
from subagents_node.actors.faults import FaultInjection
from subagents_node.actors.inbox import DEFERRED, Tick
from subagents_node.actors.outcomes import STORE_FULL_RETRY_S
from subagents_node.actors.owner import Outcome, OwnerActor
from subagents_node.actors.pipelines import Durable, Pipelines
from subagents_node.actors.runs import (
    children,
    management,
    pauses,
    runrequests,
    runschema,
    runstore,
    steps,
)
from subagents_node.actors.runs.admission import ResumePlan
from subagents_node.actors.runs.appends import RunAppends
from subagents_node.actors.runs.binding import NodeBinding
from subagents_node.actors.runs.eventlog import RunEventLog
from subagents_node.actors.runs.launches import RunLaunches
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.outbox import Outbox
from subagents_node.actors.runs.restart import RunRestart, adopted_slot_marked
from subagents_node.actors.runs.retention import RetentionDue, RunRetention
from subagents_node.actors.runs.settle import RunSettler
from subagents_node.actors.runs.ticks import (
    Advance,
    Answer,
    AppendKey,
    CallKey,
    Expand,
    KillEscaped,
    LaunchKey,
    Outbound,
    OutboxRetry,
    RunDeadline,
    Settle,
    ShimGone,
    ShimNotLaunched,
    StopReleasedAgain,
    Superseded,
    TakeUp,
)
from subagents_node.actors.runs.watchers import DEFAULT_MAX_WATCHERS, RunWatchers, WatchTimeout
from subagents_node.actors.runs.workflowkeys import KeyedLaunch
from subagents_node.messages.base import Message, Request
from subagents_node.messages.capacity import (
    MarkStarted,
    MarkWorkflowStarted,
    ReportTerminal,
    SlotHandle,
)
from subagents_node.messages.errors import RecordQuarantined, StoreFull, SubagentsError
from subagents_node.messages.fanout import CommitReservation, FanoutDescriptor, FanoutSnapshot
from subagents_node.messages.lineage import Append, Rerun, Resume
from subagents_node.messages.pauses import Approve, Pause, Reject
from subagents_node.messages.retention import Prune
from subagents_node.messages.runs import ChildReport
from subagents_node.messages.session import TrackRun
from subagents_node.messages.supervisor import (
    ChainStep,
    Intercom,
    Launch,
    ListRuns,
    RunView,
    Show,
    Snapshots,
    Stop,
    StopReleased,
    Watch,
    WatchAll,
)

log = logging.getLogger(__name__)


class RunSupervisor(OwnerActor):
    name = "supervisor"
    MIGRATIONS = runschema.MIGRATIONS

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        injection = FaultInjection(ctx)
        #: Fault injection (tests, actors/faults.py): inert on a node started without faults.
        self.faults, self.fault_points = injection.live, injection.points
        self.crash_point = injection.crash
        self._live: dict[str, LiveRun] = {}
        self._pipelines: Pipelines[CallKey] = Pipelines(
            ctx, self.to_self(Answer), self.reply_later, self.after_commit, self._failed
        )
        #: What this owner owes the ledgers (run ends, the session's view of runs): durable
        #: with the change that owes it, resent in order until answered (runs/outbox.py).
        self._outbox = Outbox(
            lambda: self.db,
            ctx.dispatch,
            self.to_self(Answer),
            self.after_commit,
            self.after,
            ctx.clock,
            self.crash_point,
            self.quarantine,
            self._delivered,
        )
        self._appends = RunAppends(self, self._live, self._pipelines)
        self._watchers = RunWatchers(
            self.after,
            self.reply_later,
            int(ctx.settings.get("max_watchers", DEFAULT_MAX_WATCHERS)),
        )
        #: Run events: stored at once, appended to `events.jsonl` once per group (before_flush).
        self._events = RunEventLog(lambda: self.db, ctx.clock, self.run_dir, self._watchers.touched)
        self._retention = RunRetention(
            lambda: self._runs_root,
            float(ctx.settings.get("run_retention_days", 0.0)) * 86_400,
            self.after,
            self.after_commit,
            ctx.clock,
            self._events.announce_pruned,
            admitting=self._admitting,
        )
        self._settler = RunSettler(self, self._live, self._retention)
        self.unrecorded_stops = runrequests.UnrecordedStops(self.after_commit)  # RequestHost
        self.node_binding = NodeBinding.from_settings(ctx.settings)  # LaunchHost
        self._launches = RunLaunches(self, self._live, self._pipelines)
        self.continuing = self._launches.continuing  # RequestHost: a continuation admitted now
        self._restart = RunRestart(self, self._live, self._outbox, self._launches, self._retention)
        open_files = ctx.settings.get("child_open_files")  # what the node lifted its own from
        self.keeper = ChildKeeper(
            # Shims report to this owner's own socket (its process's ROUTER), not the node's.
            str(ctx.settings.get("runs_address") or ctx.settings.get("node_address", "")),
            self.to_self(ShimGone),
            ctx.cap_log,
            ctx.cap_flush,
            # The node's containment: where each child's cgroup goes ('' = subreaper only).
            str(ctx.settings.get("cgroup_base") or ""),
            open_files if isinstance(open_files, int) else None,
            lambda child_id, at, why: self.after(at - ctx.clock(), KillEscaped(child_id, why)),
        )

    def on_stop(self) -> None:
        """Stopping with the node leaves children running under their shims (the next node
        adopts them); the template and the shim watch stop with us."""
        self.keeper.close()
        self._retention.close()
        self._events.write_lines()
        super().on_stop()

    def handlers(self) -> Mapping[type[Request], Callable[[Any], Message]]:
        # Called by OwnerActor.__init__ before this class's __init__ body runs: a handler is a
        # method of this actor or a partial over a module's function, never a method of an
        # object that __init__ creates.
        handlers: dict[type[Request], Callable[[Any], Message]] = {
            Launch: self._launch_request,
            Watch: self._watch,
            WatchAll: self._watch_all,
            Show: partial(runrequests.show, self),
            ListRuns: partial(runrequests.list_runs, self),
            Stop: partial(runrequests.stop, self),
            StopReleased: partial(runrequests.stop_released, self),
            Resume: self._resume,
            Rerun: self._rerun,
            Append: self._append,
            Intercom: partial(runrequests.intercom, self),
            Pause: partial(pauses.pause, self),
            Approve: partial(pauses.approve, self),
            Reject: partial(pauses.reject, self),
            Prune: self._prune,
            ChildReport: partial(children.child_report, self),
        }
        guard = partial(runrequests.refusing_unreadable, self.name, self.quarantine_unreadable)
        return {kind: guard(h) for kind, h in handlers.items()}

    # -- settings -----------------------------------------------------------------------------

    @functools.cached_property
    def _runs_root(self) -> Path:
        return Path(str(self.ctx.settings.get("runs_dir", "runs")))

    def run_dir(self, run_id: str) -> Path:
        return self._runs_root / run_id

    @property
    def node_address(self) -> str:
        return str(self.ctx.settings.get("node_address", ""))

    # -- start (runs/restart.py) and unreadable records ---------------------------------------

    def recover(self) -> None:
        """Adopt the runs the store says are going, once per node process (runs/restart.py),
        and know again which settled workflows wait for their background children (R-CAP-22)."""
        self._settler.recover_unproven(self.db)
        self._restart.recover()

    def quarantine_unreadable(self, err: RecordQuarantined) -> str:
        """Report a run or child row that cannot be read; the run id it belongs to."""
        table, key = str(err.details["table"]), str(err.details["key"])
        self.quarantine(table, key, str(err.details["reason"]))
        return key.rsplit("/", 1)[0] if table == runstore.CHILDREN else key

    # -- what the helper modules use of the supervisor, as their hosts ------------------------
    # StepHost (steps.py), PauseHost (pauses.py), ChildHost (children.py), SettleHost (settle.py),
    # LaunchHost (launches.py), AppendsHost (appends.py), RequestHost (runrequests.py), RestartHost.

    def resolve(self, run_id: str) -> str:
        return runrequests.resolve(self.db, run_id)

    def live_run(self, run_id: str) -> LiveRun | None:
        return self._live.get(run_id)

    def live_runs(self) -> list[LiveRun]:
        return list(self._live.values())

    def relaunch(
        self,
        launch: Launch,
        plan: ResumePlan,
        on_started: Callable[[RunView], None],
        keyed: KeyedLaunch | None = None,
    ) -> Message:
        """Go on with a paused run (runs/pauses.py): one continuation at a time."""
        return self._launches.launch(
            launch, plan, on_started=on_started, continues=plan.source_run_id, keyed=keyed
        )

    def launched_by_key(self, keyed: KeyedLaunch) -> Message | None:
        return self._launches.launched_by_key(keyed)

    # The handlers are bound in OwnerActor.__init__, before `_launches` exists: they delegate.
    def _launch_request(self, request: Launch) -> Message:
        return self._launches.launch_request(request)

    def _resume(self, request: Resume) -> Message:
        return self._launches.resume(request)

    def _rerun(self, request: Rerun) -> Message:
        return self._launches.rerun(request)

    def answer_launches(self, live: LiveRun) -> None:
        self._launches.answer_launches(live)

    def record_and_start(
        self,
        launch: Launch,
        run_id: str,
        runner_id: str,
        descriptor: FanoutDescriptor,
        handle: SlotHandle | None,
        snapshots: Snapshots,
        source_run_id: str | None = None,
    ) -> RunView:
        """AdmissionHost: write the run and its pending children, then start the first group."""
        return self._launches.record_and_start(
            launch, run_id, runner_id, descriptor, handle, snapshots, source_run_id
        )

    def track(self, session_id: str, run_id: str, state: Any) -> None:
        """Owe the session owner the run's new state (it refuses grants while runs are live)."""
        self._outbox.put(TrackRun(session_id=session_id, run_id=run_id, state=state), run_id)

    def report_terminal(self, report: ReportTerminal) -> None:
        """Owe the capacity owner this report (it frees the slot when the proof allows)."""
        self.owe(report, report.run_id)

    def owe(self, request: Request, run_id: str) -> None:
        """Durable with this transaction, sent until answered (runs/outbox.py)."""
        self._outbox.put(request, run_id)

    def record_event(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        self._events.record(run_id, kind, data)

    def call(self, key: CallKey, request: Request | Durable) -> None:
        """A request to another owner whose answer comes back as an `Answer` tick with `key`.
        Not for what another owner must hear even if this answer is lost: that is owed
        through the outbox (`track`, `report_terminal`)."""
        self._pipelines.call(key, request)

    def advance(self, live: LiveRun) -> None:
        children.advance(self, live)

    def finish(self, live: LiveRun) -> None:
        self._settler.finish(live)

    def group_undone(self, full: StoreFull) -> None:
        """A full disk undid the group: launches that waited to mark their slot started fail
        (their slot is rolled back, their caller told `store_full`), runs whose settlement was
        undone settle again, and children whose start was undone start again (a chain's next
        step). Stops it undid signalled nobody: the runs are not stopping. In a tick of its own:
        its writes need a group of their own; so is an undone `runs.stop_released`, done again."""
        again = self.unrecorded_stops.undo()
        if again is not None:  # its node asks again only at a restart: done here once there's room
            self.after(STORE_FULL_RETRY_S, again)
        self._retention.undone()  # prunes: their directories went, their records stay
        keys = tuple(self._pipelines.dropped())
        settling = tuple(r for r, live in self._live.items() if live.settling or live.unstarted)
        for run_id in settling:
            self._live[run_id].settling = False
        if keys or settling:  # not at once: while the disk stays full, retries are paced
            self.after(STORE_FULL_RETRY_S, TakeUp(keys, settling, full))

    def parked_ended(self, run_id: str, state: str, output: str) -> None:
        self._settler.source_ended(run_id, state, output)

    def stop_live(self, live: LiveRun, state: str, reason: str) -> None:
        runrequests.stop_live(self, live, state, reason)

    def _append(self, request: Append) -> Message:
        return self._appends.append(request)

    def clock(self) -> float:
        return self.ctx.clock()

    def extend_chain(self, run_id: str, steps: list[ChainStep]) -> str:
        return self._appends.extend_chain(run_id, steps)

    def check_workflow_child(self, launch: Launch) -> None:
        """AdmissionHost, R-FAN-24: only the live workflow's own host may pass its fields."""
        management.check_workflow_child(self.db, launch)

    def _failed(self, key: CallKey, reason: str) -> None:
        """A pipeline ended with an error: a failed append no longer holds its chain open
        (R-APP-1's pending count), and a launch that failed after its run started must not go
        on unaccounted (R-ADM-5): the run's children are stopped and the run fails."""
        match key:
            case AppendKey():
                self._appends.failed(key)
            case LaunchKey(run_id=run_id):
                live_run = self._live.get(run_id)
                if live_run is not None and live_run.stop_state is None:
                    self.stop_live(live_run, "failed", reason)

    def _delivered(self, request: Request, outcome: Outcome) -> None:
        """An outbox row was answered for good (inside the transaction that deletes it)."""
        match request:
            case CommitReservation(reservation_id=reservation):
                management.append_committed(
                    self.db, reservation, not isinstance(outcome, Exception)
                )
            case MarkStarted(handle=handle) | MarkWorkflowStarted(handle=handle):
                # A recovered continuation's (pauses.py) or an adopted run's (restart.py).
                if not pauses.continuation_marked(self, handle.run_id, outcome):
                    adopted_slot_marked(self, handle.run_id, outcome)

    def on_tick(self, tick: Tick) -> None:
        match tick:
            case Answer(key=Outbound() as key, outcome=outcome):
                self._outbox.answered(key, outcome)
            case OutboxRetry(target=target):
                self._outbox.retry_due(target)
            case Answer(key=Settle(run_id=run_id), outcome=outcome):
                live = self._live.get(run_id)
                if live is not None:
                    self._settler.settle(
                        live, outcome if isinstance(outcome, FanoutSnapshot) else None
                    )
            case Answer(key=Expand(run_id=run_id, group=group), outcome=outcome):
                live = self._live.get(run_id)
                if live is not None and live.expanding:
                    steps.expanded(self, live, group, outcome)
            case Answer(key=key, outcome=outcome):
                # Launch and append keys resume their pipeline; a key that names none belongs
                # to a pipeline that has already ended with an error.
                if not self._pipelines.resume(key, outcome) and isinstance(outcome, SubagentsError):
                    log.error("supervisor call failed: %s", outcome.message)
            case ShimGone(child_id=child_id):
                children.apply_events(
                    self, self.keeper.shim_gone(self.db, child_id, self.ctx.clock())
                )
            case KillEscaped(child_id=child_id, why=why):
                runrequests.kill_escaped(self, child_id, why)
            case ShimNotLaunched(child_id=child_id, error=error):
                children.apply_events(
                    self, self.keeper.not_launched(self.db, child_id, error, self.ctx.clock())
                )
            case Advance(run_id=run_id):
                live = self._live.get(run_id)
                if live is not None:
                    self.advance(live)
            case TakeUp(keys=keys, run_ids=run_ids, error=error):
                self._pipelines.fail(keys, error)
                for run_id in run_ids:
                    if (live := self._live.get(run_id)) is not None:
                        children.take_up(self, live)
            case Superseded(run_id=run_id):
                self._launches.stop_superseded(run_id)
            case StopReleasedAgain(reason=reason) if self.unrecorded_stops.latest(tick):
                runrequests.stop_released(self, StopReleased(reason=reason))
            case RunDeadline(run_id=run_id):
                live = self._live.get(run_id)
                if live is None:  # a paused run that holds no process (pauses.expire_parked)
                    pauses.expire_parked(self, run_id)
                elif live.stop_state is None and live.deadline_ms:
                    self.stop_live(live, "failed", f"Run timed out after {live.deadline_ms} ms.")
            case WatchTimeout(key=watch_key, watcher_id=watcher_id):
                self._watchers.expired(self.db, watch_key, watcher_id)
            case RetentionDue():
                self._retention.due(self.db, self._live.__contains__)

    # -- events and watchers ------------------------------------------------------------------

    def before_flush(self) -> None:
        """Answer the watchers of every run that had events, append each run's events to its
        `events.jsonl` (one open per run per group, not one per event), and hand the shims to
        watch to the watch thread, once per commit group."""
        self._watchers.answer_touched(self.db)
        self._events.write_lines()
        self.keeper.flush()

    def _watch_all(self, request: WatchAll) -> Message:
        assert self.current_reply is not None
        self._watchers.watch_all(self.db, request, self.current_reply)
        return DEFERRED  # type: ignore[no-any-return]

    def _watch(self, request: Watch) -> Message:
        assert self.current_reply is not None
        run_id = self.resolve(request.run_id)
        answer = self._watchers.watch(self.db, run_id, request, self.current_reply)
        return answer if answer is not None else DEFERRED

    # -- retention ----------------------------------------------------------------------------

    def _admitting(self, run_id: str) -> bool:
        return self._launches.admitting(run_id)

    def _prune(self, request: Prune) -> Message:
        """runs.prune: finished runs past the cutoff (actors/runs/retention.py)."""
        live = self._live.__contains__
        return self._retention.prune_request(self.db, request, live, self.current_reply)
