"""RunLaunches: how the RunSupervisor launches a run (`runs.launch`, `runs.resume`, `runs.rerun`).

Owns the way into a run: the admission pipeline started for each launch (runs/admission.py has
its steps), its answer held until the run's first children really run (their shims reported
their pids) or failed to start, the run's record written and its first group started
(`record_and_start`, the AdmissionHost's last step), and where the run came from (its lineage:
a resume, a rerun, an attach; R-MISC-2's link to a live run it supersedes, which is stopped
once that link has committed). A workflow host's child launch or `resume` item sent again for a
key that launched already is answered with that key's run (workflowkeys.py, R-WF-4), and so is
a launch sent again under its client's launch id. The rules
of what may be resumed or rerun are relaunch.py's, rerun.py's and attach.py's. It never
blocks on another owner (the pipeline's calls come back as `Answer` ticks), and never answers a
launch before the transaction that started its run commits. Once that commit is made, a full
disk that fails a later group never turns the launch's answer into `store_full` ("changed
nothing"): the run is real, and its caller gets it (`_recorded`).
"""

from __future__ import annotations

import functools
import sqlite3
import uuid
from collections.abc import Callable, Generator
from typing import ParamSpec, Protocol

from subagents_node.actors.context import Cancel
from subagents_node.actors.inbox import DEFERRED, Tick
from subagents_node.actors.owner import Outcome, ReplyFn
from subagents_node.actors.pipelines import Durable, Pipelines
from subagents_node.actors.runs import (
    attach,
    checkpoints,
    management,
    pauses,
    relaunch,
    rerun,
    runplan,
    runstore,
)
from subagents_node.actors.runs.admission import (
    AdmissionHost,
    Pipeline,
    ResumePlan,
    admit,
    storage_failed,
)
from subagents_node.actors.runs.binding import NodeBinding
from subagents_node.actors.runs.liverun import LiveRun, new_live_run
from subagents_node.actors.runs.recovery import write_recovery
from subagents_node.actors.runs.ticks import CallKey, LaunchKey, RunDeadline, Superseded
from subagents_node.actors.runs.workflowkeys import ChildKey, KeyedLaunch, key_of, launched
from subagents_node.messages.base import Message, Request
from subagents_node.messages.capacity import SlotHandle
from subagents_node.messages.errors import (
    BadRequest,
    RunNotResumable,
    StoreFull,
    SubagentsError,
)
from subagents_node.messages.fanout import FanoutDescriptor, encode_descriptor
from subagents_node.messages.lineage import Rerun, Resume
from subagents_node.messages.supervisor import Launch, LaunchResult, RunView, Snapshots

P = ParamSpec("P")


class LaunchHost(pauses.PauseHost, AdmissionHost, Protocol):
    """What launching needs from the RunSupervisor, beyond the pause and admission hosts'."""

    @property
    def current_reply(self) -> ReplyFn | None:
        """The reply of the request being handled."""

    #: Which runs' children end with this (embedded) node's process (runs/binding.py).
    node_binding: NodeBinding

    def reply_later(self, reply: ReplyFn, outcome: Outcome) -> None: ...

    def after(self, delay_s: float, tick: Tick) -> Cancel: ...

    def after_commit(self, effect: Callable[[], None]) -> None: ...

    def to_self(self, make: Callable[P, Tick]) -> Callable[P, None]:
        """A callback (run on another thread) that delivers the tick `make` builds to us."""


class RunLaunches:
    """Launches the host's runs into `live` (the host's own map of its live runs)."""

    def __init__(
        self, host: LaunchHost, live: dict[str, LiveRun], pipelines: Pipelines[CallKey]
    ) -> None:
        self._host = host
        self._live = live
        self._pipelines = pipelines
        #: Where each run in admission came from (rerun.Lineage), recorded with the run.
        self._lineage: dict[str, rerun.Lineage] = {}
        #: Paused runs whose continuation is being admitted: source -> the continuing run.
        #: Its record, which names the source, is written only once admitted; until then a
        #: second resume or approval would pass the stored check and go on with it twice.
        self._continuing: dict[str, str] = {}
        #: Live runs whose superseding rerun is being admitted: source -> the rerun. The link
        #: (`superseded_by`) is written only with the rerun's record; until then a second rerun
        #: would pass the stored check and supersede the same run again (R-MISC-2).
        self._superseding: dict[str, str] = {}
        #: Launches under a key being admitted (a workflow child's, a launch id's): a request
        #: for the same key meanwhile waits on that admission's answer (R-WF-4); the digest
        #: goes on the run's record.
        self._keyed: dict[ChildKey, KeyedLaunch] = {}

    def launch_request(self, request: Launch) -> Message:
        if request.attached_run_id is not None:  # R-RES-6: only `runs.resume` attaches
            raise BadRequest(
                "A launch cannot attach to a run; use runs.resume with attach steps.",
                reason="attached_run_id",
            )
        keyed = KeyedLaunch.of(request)
        if keyed is not None:
            made = self._launched_by_key(keyed, request.workflow_token)
            if made is not None:
                return made
        return self.launch(request, keyed=keyed)

    def launched_by_key(self, keyed: KeyedLaunch) -> Message | None:
        """A client's launch id's run (`_launched_by_key`): an approve's continuation too."""
        return self._launched_by_key(keyed, None)

    def _launched_by_key(self, keyed: KeyedLaunch, token: str | None) -> Message | None:
        """R-WF-4: the answer to a launch whose key launched already (sent again after its node
        was lost, or its client's wait ended, before it was answered): that run, once it runs
        (whatever its state now), or the outcome of its admission under way. None when the key
        launched nothing: launch it."""
        if keyed.launch_id is None:
            management.check_workflow_host(self._host.db, keyed.key[0], token, keyed.key[1])
        reply = self._host.current_reply
        assert reply is not None
        going = self._keyed.get(keyed.key)
        if going is not None and self._pipelines.running(LaunchKey(going.run_id)):
            keyed.check_same(going.digest)
            going.joined.append(reply)
            return DEFERRED  # type: ignore[no-any-return]
        made = launched(self._host.db, keyed.key)
        if made is None:
            return None
        run_id, digest = made
        keyed.check_same(digest)
        live = self._live.get(run_id)
        if live is not None and live.unstarted:
            live.launch_replies.append(reply)
            return DEFERRED  # type: ignore[no-any-return]
        view = runstore.view(self._host.db, run_id)
        return None if view is None else LaunchResult(run=view)

    def launch(
        self,
        request: Launch,
        resume: ResumePlan | None = None,
        lineage: rerun.Lineage | None = None,
        on_started: Callable[[RunView], None] | None = None,
        continues: str | None = None,
        keyed: KeyedLaunch | None = None,
    ) -> Message:
        """Admit and start a run; `continues` names the paused run it goes on with, `keyed`
        the key it launches under (workflowkeys.py)."""
        fixed = keyed.fixed_run_id if keyed is not None else None
        run_id = fixed or uuid.uuid4().hex[:12]
        runner_id = f"{run_id}.{uuid.uuid4().hex[:8]}"
        assert self._host.current_reply is not None
        if continues is not None:
            self._continue_once(continues, run_id)
        if lineage is not None and lineage.supersedes:
            self._supersede_once(lineage.source_run_id, run_id)
        if lineage is not None:
            self._lineage[run_id] = lineage
        if keyed is not None:  # popped when the admission is answered (`_admitted_key`)
            keyed.run_id = run_id
            self._keyed[keyed.key] = keyed
        reservation = keyed.spawn_reservation if keyed is not None else None
        admission = admit(self._host, request, run_id, runner_id, resume, reservation)
        pipeline = _launch_result(admission, on_started)
        reply = self._answer_once_started(run_id, self._host.current_reply)
        self._pipelines.start(LaunchKey(run_id), pipeline, reply)
        return DEFERRED  # type: ignore[no-any-return]

    def admitting(self, run_id: str) -> bool:
        """Whether run `run_id`'s admission is under way (its directory may have no row yet)."""
        return self._pipelines.running(LaunchKey(run_id))

    def continuing(self, source_id: str) -> str | None:
        """The run whose admission is going on with paused run `source_id` now, if any."""
        going = self._continuing.get(source_id)
        return going if going is not None and self._pipelines.running(LaunchKey(going)) else None

    def _continue_once(self, source_id: str, run_id: str) -> None:
        """A paused run goes on once: refuse a continuation while another one is admitted."""
        going = self.continuing(source_id)
        if going is not None:
            raise checkpoints.refuse(
                source_id, f"is being continued as run {going} already.", "continued"
            )
        self._continuing[source_id] = run_id

    def _time_source(self, source_id: str) -> None:
        """A deadline due while a continuation of paused run `source_id` was admitted did
        nothing (it might have gone on): one that failed leaves it paused, so its deadline is
        timed again (due at once if it passed). Harmless otherwise: the tick checks again."""
        deadline = runstore.paused_deadline(self._host.db, source_id)
        if deadline is not None:
            self._host.after(max(0.0, deadline - self._host.clock()), RunDeadline(source_id))

    def _supersede_once(self, source_id: str, run_id: str) -> None:
        """A live run is superseded once: refuse a rerun of it while another one is admitted."""
        going = self._superseding.get(source_id)
        if going is not None and self._pipelines.running(LaunchKey(going)):
            raise RunNotResumable(
                f"Run '{source_id}' is being superseded by rerun {going} already.",
                run_id=source_id,
                reason="superseded",
            )
        self._superseding[source_id] = run_id

    def _answer_once_started(self, run_id: str, reply: ReplyFn) -> ReplyFn:
        """A launch is answered only once its first children really run (their shims reported
        their pids) or have failed to start; an admission error is answered at once."""

        def answer(outcome: Outcome) -> None:
            self._lineage.pop(run_id, None)
            # Admitted (the record names its source now) or refused: the mark has done its job.
            for source_id in [s for s, going in self._continuing.items() if going == run_id]:
                self._time_source(source_id)
            for marks in (self._continuing, self._superseding):
                for source_id in [s for s, going in marks.items() if going == run_id]:
                    del marks[source_id]
            joined = self._admitted_key(run_id)
            live = self._live.get(run_id)
            if isinstance(outcome, StoreFull) and (live is None or live.stop_state is None):
                # Not a launch its admission failed after recording it (R-ADM-5: stopped).
                outcome = self._recorded(run_id, outcome)
            if isinstance(outcome, LaunchResult) and live is not None and live.unstarted:
                live.launch_replies += [reply, *joined]
                return
            self._host.crash_point("answer_launch")
            if isinstance(outcome, LaunchResult):
                view = runstore.view(self._host.db, run_id)
                outcome = outcome if view is None else LaunchResult(run=view)
            reply(outcome)
            for waiting in joined:  # the same key asked again meanwhile: the same answer
                waiting(outcome)

        return answer

    def answer_launches(self, live: LiveRun) -> None:
        if live.unstarted or not live.launch_replies:
            return
        view = runstore.view(self._host.db, live.run_id)
        replies, live.launch_replies = live.launch_replies, []
        if live.launch is not None and live.launch.workflow_key is not None:
            self._host.crash_point("answer_workflow_launch")  # recorded, running, unanswered
        self._host.crash_point("answer_launch")
        for reply in replies:
            if view is not None:
                self._host.reply_later(self._kept(live.run_id, reply), LaunchResult(run=view))

    def _kept(self, run_id: str, reply: ReplyFn) -> ReplyFn:
        """`reply` for an answer given once run `run_id`'s admission has ended, its record
        committed: the group it is delivered with may still fail (`store_full`)."""

        def answer(outcome: Outcome) -> None:
            reply(self._recorded(run_id, outcome) if isinstance(outcome, StoreFull) else outcome)

        return answer

    def _recorded(self, run_id: str, full: StoreFull) -> Outcome:
        """The launch's answer when the group it was delivered with failed on a full disk:
        that group only, which undid nothing the run's record stands on when an earlier group
        committed it (its children were forked after that commit, or its slot marked started).
        Such a run is real and goes on: its caller is answered with it. `store_full` says
        "changed nothing", and a caller that retries on it (as the docs advise) launched the
        same work twice. Read from the store as it stands once the failed group was rolled
        back: a run whose record the failed group held is not there, and stays `store_full`."""
        db = self._host.db
        try:
            if db.in_transaction:  # the failed group could not be rolled back: nothing to trust
                return full
            view = runstore.view(db, run_id)
        except (sqlite3.Error, SubagentsError):  # a store that cannot be read: it stands
            return full
        return full if view is None else LaunchResult(run=view)

    def resume(self, request: Resume) -> Message:
        row = runstore.run_row(self._host.db, self._host.resolve(request.run_id))
        assert row is not None
        # A workflow's `resume` item, or a resume under a launch id, sent again (R-WF-4,
        # docs/api.md "Launching again"): the run it made, if it made one. (An attach as a
        # workflow's item is no key: attach_launch refuses it, as it always did.)
        as_item = request.attach and request.workflow_key is not None
        keyed = None if as_item else KeyedLaunch.of(request)
        if keyed is not None:
            made = self._launched_by_key(keyed, request.workflow_token)
            if made is not None:
                return made
        if request.attach:  # R-RES-6: the live source is the new chain's step 0
            chain = _under(attach.attach_launch(row, request), keyed)
            lineage = rerun.Lineage(str(row["run_id"]), "attach")
            return self.launch(chain, lineage=lineage, keyed=keyed)
        if row["state"] == "paused":
            return pauses.resume_paused(self._host, row, request, keyed)
        taken = checkpoints.successor(self._host.db, str(row["run_id"]))
        if row["state"] == "stopped" and taken is not None:  # "was stopped" would mislead
            raise RunNotResumable(
                f"Run '{row['run_id']}' was paused and resumed already: run {taken} went on "
                "with it; resume that run instead.",
                run_id=str(row["run_id"]),
                reason="continued",
            )
        route = relaunch.workflow_route(self._host.db, request)
        launch, plan = relaunch.resume_launch(row, request, route)
        # R-TMO-8: a resume inherits its source's absolute deadline (if it had one).
        checkpoints.check_deadline(plan.source_run_id, row["deadline_at"], self._host.clock())
        inherited = launch.model_copy(update={"deadline_at": row["deadline_at"]})
        lineage = rerun.Lineage(plan.source_run_id, "resume")
        return self.launch(_under(inherited, keyed), plan, lineage, keyed=keyed)

    def rerun(self, request: Rerun) -> Message:
        """R-MISC-2: a finished run's child again, or a live foreground child replaced."""
        row = runstore.run_row(self._host.db, self._host.resolve(request.run_id))
        assert row is not None
        keyed = KeyedLaunch.of(request)  # under a launch id, sent again: the run it made
        if keyed is not None:
            made = self._launched_by_key(keyed, None)
            if made is not None:
                return made
        again = _under(rerun.rerun_launch(row, request), keyed)
        return self.launch(again, lineage=rerun.rerun_lineage(row), keyed=keyed)

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
        now = self._host.clock()
        # A resume, rerun or attach built from the file is another launch: not its launch id.
        kept = launch.model_copy(update={"launch_id": None}) if launch.launch_id else launch
        try:  # R-FAN-6: the recovery descriptor exists before any child starts
            write_recovery(self._host.run_dir(run_id), kept, encode_descriptor(descriptor))
        except OSError as exc:
            raise storage_failed(exc, self._host.run_dir(run_id)) from None
        parent = self._live.get(launch.parent_run_id) if launch.parent_run_id else None
        binding = self._host.node_binding
        foreground = binding.foreground_of(launch, parent)
        live = new_live_run(
            self._host.db,
            launch,
            run_id,
            runner_id,
            descriptor,
            handle,
            snapshots,
            source_run_id,
            run_dir=self._host.run_dir(run_id),
            now=now,
            workflow_token=management.new_token(),
            foreground=foreground,
        )
        live.ends_with = binding.ends_with(foreground)
        deadline_at = runplan.deadline_at(launch, now)
        self._live[run_id] = live
        key = key_of(launch)
        keyed = self._keyed.get(key) if key is not None else None
        if keyed is not None and keyed.run_id == run_id:  # in the run's own transaction
            runstore.update_run(self._host.db, run_id, launch_digest=keyed.digest)
        self._host.record_event(
            run_id, "run.started", {"mode": launch.mode, "children": len(live.labels)}
        )
        self._record_lineage(run_id, source_run_id)
        if launch.attached_run_id:
            source = launch.attached_run_id
            attach.wait_for(live, self._live.get(source), runstore.run_row(self._host.db, source))
        if deadline_at is not None:  # R-TMO-8: a resume's is its source's, not now + timeout
            live.cancel_deadline = self._host.after(
                max(0.0, deadline_at - now), RunDeadline(run_id)
            )
        # Owed, not asked: the admission pipeline does not wait for the session's answer.
        self._host.track(launch.session_id, run_id, "running")
        stopped_by = self._stopped_parent(launch.parent_run_id)
        if stopped_by is not None:
            # Admitted while its parent was being stopped (a workflow host launching in its
            # stop's grace, a launch in flight): the parent's stop did not see it (R-WF-10).
            self._host.stop_live(live, "stopped", f"Its parent run {stopped_by} was stopped.")
        else:
            self._host.advance(live)
        view = runstore.view(self._host.db, run_id)
        assert view is not None
        return view

    def _admitted_key(self, run_id: str) -> list[ReplyFn]:
        """Run `run_id`'s admission ended: its key is the run's record's from now on; the
        requests for the same key that waited on it."""
        for key, keyed in list(self._keyed.items()):
            if keyed.run_id == run_id:
                del self._keyed[key]
                return keyed.joined
        return []

    def _stopped_parent(self, parent_run_id: str | None) -> str | None:
        """The parent, when this node stops it (or stopped it): its runs stop with it. A
        parent that ended by itself (complete, failed) lets a nested run it launched go on."""
        if parent_run_id is None:
            return None
        parent = self._live.get(parent_run_id)
        if parent is not None:
            return parent_run_id if parent.stop_state is not None else None
        row = runstore.run_row(self._host.db, parent_run_id)
        stopped = row is not None and row["state"] in ("stopped", "paused", "rejected")
        return parent_run_id if stopped else None

    def _record_lineage(self, run_id: str, source_run_id: str | None) -> None:
        """In the run's own transaction: how it came from its source, and (R-MISC-2) the link
        to the live source it supersedes; that source is stopped once the link has committed."""
        lineage = self._lineage.pop(run_id, None)
        if lineage is None:
            return
        source = source_run_id or lineage.source_run_id
        runstore.update_run(self._host.db, run_id, source_run_id=source, source_kind=lineage.kind)
        if not lineage.supersedes:
            return
        rerun.link_superseded(self._host.db, source, run_id)
        self._host.record_event(source, "run.superseded", {"by": run_id})
        # Stopped once the link is durable (a recovering node stops it from the link).
        self._host.after_commit(functools.partial(self._host.to_self(Superseded), source))

    def stop_superseded(self, run_id: str) -> None:
        live, row = self._live.get(run_id), runstore.run_row(self._host.db, run_id)
        by = row["superseded_by"] if row is not None else None
        if live is not None and live.stop_state is None and by:
            self._host.stop_live(live, "stopped", rerun.superseded_reason(by))


def _launch_result(
    pipeline: Pipeline, on_started: Callable[[RunView], None] | None = None
) -> Generator[Request | Durable, Message, Message]:
    view = yield from pipeline
    if on_started is not None:  # after mark_started: the relaunch owns its slot now
        on_started(view)
    return LaunchResult(run=view)


def _under(launch: Launch, keyed: KeyedLaunch | None) -> Launch:
    """The launch a resume, an attach or a rerun makes, under the client's launch id when it
    sent one: the run's record then carries the request's digest (`record_and_start`), and
    what the admission charges is found under the id when the request is sent again."""
    if keyed is None or keyed.launch_id is None:
        return launch
    return launch.model_copy(update={"launch_id": keyed.launch_id})
