"""The `runs` handle a workflow script receives (SPEC §12: R-WF-3..8, R-WF-10, R-WF-11).

Owns the workflow's admission state inside the host process: the keys launched so far and their
parameters, the output paths earlier groups claimed, one step per launched key (with its async
classification and run id) and the call trace. Every `runs.run` and `runs.all` call is one
admission group (R-WF-5), admitted in this order (R-WF-6):

1. keys (R-WF-4), agents and output paths are checked, collisions refused (R-WF-8), and each
   new member's launch built and checked as the node's admission would (task size, an argv
   task exec(2) would refuse, the command);
2. `workflow[key]` is claimed for every new member and `resume` item as ONE batch at the
   budget's owner (all or nothing, R-FAN-13/16), qualified by the workflow descriptor's parent
   path;
3. only then are the output paths recorded, and each child launched as a workflow child
   (childrequests.py): its key, `fanout_admitted` (so it claims nothing itself, R-FAN-20), the
   workflow's token (R-FAN-24), the workflow as parent (never charged capacity, R-TOP-7) and
   the descriptor extended by `workflow[key]` (R-FAN-12).

A group refused at step 1 or 2 launches nothing and raises its typed error in the script. A
member whose own launch is refused after admission (its claim stays, R-FAN-15) comes back as
a failed result that never launched (async = false, A-6). Foreground members are awaited;
background ones (`async_=True`) are not, and may outlive the workflow. A claim, launch or await
whose node is lost (stopped, killed) waits for the next node and is sent again there: the claim
with its id, the launch by its key, so neither is made twice (R-WF-4).

It never claims for a reused key, never launches once the workflow has settled, never hands a
child its token or the aggregate output path, and changes node state only through requests.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from subagents_node.client.client import Client
from subagents_node.client.nodewait import across_lost_nodes
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.constants import ENV_WORKFLOW_TOKEN, NODE_BACK_S
from subagents_node.messages.errors import (
    FanoutLimitExceeded,
    SubagentsError,
    WorkflowCallInvalid,
    WorkflowError,
    WorkflowKeyConflict,
    WorkflowKeyInvalid,
    WorkflowOutputCollision,
    WorkflowSettled,
)
from subagents_node.messages.fanout import FanoutSnapshot
from subagents_node.messages.supervisor import (
    IntercomMode,
    Launch,
    LaunchResult,
    RunView,
)
from subagents_node.workflow.calls import (
    ChildCall,
    ChildResult,
    Step,
    WorkflowEnv,
    step_status,
    to_jsonable,
)
from subagents_node.workflow.childrequests import member_launch, resume_request
from subagents_node.workflow.limits import ConsoleLines, check_batch, check_emit, json_size
from subagents_node.workflow.outputs import check_collisions, resolve_output
from subagents_node.workflow.stop import WorkflowStopped

__all__ = [
    "ENV_WORKFLOW_TOKEN",
    "ChildCall",
    "ChildResult",
    "FanoutLimitExceeded",
    "Step",
    "WorkflowCallInvalid",
    "WorkflowEnv",
    "WorkflowError",
    "WorkflowKeyConflict",
    "WorkflowKeyInvalid",
    "WorkflowOutputCollision",
    "WorkflowRuns",
    "WorkflowSettled",
    "WorkflowStopped",
    "to_jsonable",
]

T = TypeVar("T")

ACTIVE = ("queued", "running", "paused")
#: A script's call (an await, an admission, a launch) waits NODE_BACK_S for the state dir's
#: next node when its node stopped or was killed (a foreground `workflow` following it starts
#: one at once), and outlives this many lost nodes. An admission is sent again with its claim
#: id and a launch with its key, so neither is made twice (R-WF-4).
MAX_NODE_LOSSES = 3
#: A resumed workflow's source steps that ended so are launched again (on their old claim).
_RELAUNCHED = ("failed", "stopped", "rejected")


@dataclass
class AdmissionGroup:
    """One `runs.all` batch (R-WF-5): the members it launches (and the keys among them whose
    claim a resumed workflow's source already made), its `resume` items, and the steps a
    resumed workflow reuses from its source."""

    members: list[tuple[Step, Launch]] = field(default_factory=list)
    claimed: set[str] = field(default_factory=set)
    resumes: list[Step] = field(default_factory=list)
    reused: list[Step] = field(default_factory=list)

    def steps(self) -> list[Step]:
        return [*(step for step, _ in self.members), *self.resumes, *self.reused]


class WorkflowRuns:
    """The `runs` object of a workflow script. Calls from several threads take turns."""

    def __init__(
        self,
        client: Client,
        launcher: LaunchContext,
        env: WorkflowEnv,
        on_change: Callable[[], None] = lambda: None,
        prior: Mapping[str, RunView] | None = None,
        prior_claimed: Iterable[str] = (),
    ) -> None:
        self._client = client
        self._launcher = launcher
        self.env = env
        self._on_change = on_change
        self._lock = threading.RLock()
        self.steps: dict[str, Step] = {}
        self.trace: list[dict[str, Any]] = []
        self.fanout: FanoutSnapshot | None = None
        self.emits: list[Any] = []
        self._emitted_bytes = 0
        self._console = ConsoleLines()
        self._claimed: dict[Path, str] = {}
        self._settled = False
        #: A resumed workflow's source children by key (R-WF-5: finished steps are not run
        #: again; every key the source admitted keeps its claim, R-FAN-23).
        self._prior: dict[str, RunView] = dict(prior or {})
        self._prior_claimed = frozenset(prior_claimed) | set(self._prior)

    # -- the script's API ---------------------------------------------------------------------

    def run(
        self,
        key: str,
        agent: str,
        task: str,
        *,
        output: str | bool | None = None,
        async_: bool = False,
        cwd: str | None = None,
        timeout_ms: int | None = None,
        intercom: IntercomMode | None = None,
    ) -> ChildResult:
        """Launch one child (a group of one); wait for it unless `async_`."""
        call = ChildCall(key, agent, task, output, async_, cwd, timeout_ms, intercom)
        return self.all([call])[0]

    def resume(
        self,
        key: str,
        source: str,
        message: str = "",
        *,
        async_: bool = False,
        intercom: IntercomMode | None = None,
    ) -> ChildResult:
        """Relaunch finished child `source` (a run id, or a key of this workflow) under `key`,
        with `message` as the follow-up. It claims `workflow[key]` as a new child does (the
        revived child's own claim is not made again, R-FAN-23) and takes no capacity
        (R-RES-3); awaited unless `async_`. Its intercom setting is
        `intercom`, else the workflow's (R-ICB-3)."""
        call = ChildCall(key, task=message, async_=async_, resume=source, intercom=intercom)
        return self.all([call])[0]

    def all(self, specs: Iterable[ChildCall | Mapping[str, Any]]) -> list[ChildResult]:
        """Launch a batch as ONE admission group; wait for its foreground members. Results come
        back in the order of `specs`; a refused group raises and launches nothing, its
        `resume` items included (R-WF-5, A-19)."""
        with self._lock:
            if self._settled:
                raise WorkflowSettled("The workflow has already settled; nothing more is admitted.")
            calls = [ChildCall.of(spec) for spec in specs]
            group = self._group(calls)
            try:
                self._admit(group)
            except SubagentsError as err:
                # Every call of the batch waits on the shared outcome (R-WF-5, A-19).
                for step in group.steps():
                    self._trace("failed", step, error=err.message)
                self._on_change()
                raise
            for step in group.reused:
                self._trace("reused", step)
            for step, launch in group.members:
                self._launch(step, self._resent(self._client.runs.launch, launch))
            for step in group.resumes:
                self._launch(step, self._resent(self._resume_view, step))
            fresh = {step.key for step in group.steps()}
            for call in calls:
                if call.key in fresh:
                    fresh.discard(call.key)  # its first occurrence is the launch itself
                else:
                    self._trace("reused", self.steps[call.key])
            self._on_change()
            for step in group.steps():
                if step.status == "running" and not step.async_:
                    self._await(step)
            return [self._result_of(call) for call in calls]

    def emit(self, value: Any) -> None:
        """Add a value to the workflow's result, as it is now (a JSON copy); past the record
        limit it is WorkflowResultTooLarge and nothing is added."""
        data = to_jsonable(value)
        size = json_size(data)
        with self._lock:
            check_emit(size, self._emitted_bytes)
            self.emits.append(data)
            self._emitted_bytes += size
        self._on_change()

    def console(self, *values: object, sep: str = " ") -> None:
        """A console line for the result (`print()` in a script lands here too)."""
        with self._lock:
            self._console.add(sep.join(str(v) for v in values))

    @property
    def console_lines(self) -> list[str]:
        """The kept console lines, and a marker line for any dropped past the limit."""
        with self._lock:
            return self._console.lines()

    def budget(self) -> FanoutSnapshot:
        """The workflow's fan-out budget as it stands (R-FAN-17), nested claims included."""
        return self._client.fanout.snapshot(self.env.descriptor)

    # -- admission ----------------------------------------------------------------------------

    def _group(self, calls: list[ChildCall]) -> AdmissionGroup:
        """R-WF-5: the group's new keys (repeats and earlier keys reuse); R-WF-7: their outputs.
        A resumed workflow's finished (or still live) keys are reused from its source."""
        group = AdmissionGroup()
        fresh: dict[str, ChildCall] = {}
        for call in calls:
            earlier = self.steps[call.key].call if call.key in self.steps else fresh.get(call.key)
            if earlier is not None:
                if earlier.params() != call.params():
                    raise WorkflowKeyConflict(
                        f"Workflow child key '{call.key}' was already used with different "
                        "parameters; use a new key.",
                        key=call.key,
                    )
                continue
            fresh[call.key] = call
            prior = self._prior.get(call.key)
            if call.resume is not None:
                step = self._resume_step(call)
                if prior is not None and prior.state not in _RELAUNCHED:
                    group.reused.append(self._reused_step(step, prior))
                    continue
                if call.key in self._prior_claimed:
                    group.claimed.add(call.key)
                group.resumes.append(step)
                continue
            agent = self._launcher.catalog.get(call.agent)
            child_cwd = self.env.cwd / (call.cwd or agent.cwd or "")
            path = resolve_output(
                call.output,
                key=call.key,
                agent_output=agent.output,
                child_cwd=child_cwd,
                aggregate=self.env.aggregate,
                run_dir=self.env.run_dir,
            )
            step = Step(call.key, agent.name, call, path)
            if prior is not None and prior.state not in _RELAUNCHED:
                group.reused.append(self._reused_step(step, prior))
                continue
            if call.key in self._prior_claimed:
                group.claimed.add(call.key)  # relaunched on the source's claim (R-FAN-23)
            # Built (and checked) now: a member the node would refuse refuses the group
            # before anything is claimed.
            group.members.append((step, member_launch(step, agent, self._launcher, self.env)))
        return group

    def _reused_step(self, step: Step, prior: RunView) -> Step:
        """A resumed workflow's step its source already ran (or still runs): not run again."""
        step.run_id, step.view, step.async_ = prior.run_id, prior, prior.background
        step.source_run_id = prior.parent_run_id
        step.status = "running" if prior.state in ACTIVE else step_status(prior.state)
        step.error = prior.error
        step.result = self._result(step, prior)
        return step

    def _resume_step(self, call: ChildCall) -> Step:
        """A `resume` item: its source is a key of this workflow or a run id."""
        assert call.resume is not None
        earlier = self.steps.get(call.resume)
        source = earlier.run_id if earlier is not None else call.resume
        if not source:
            raise WorkflowCallInvalid(
                f"runs.resume('{call.key}'): step '{call.resume}' never launched a run",
                key=call.key,
                field="resume",
            )
        agent = earlier.agent if earlier is not None else ""
        return Step(call.key, agent, call, None, source_run_id=source)

    def _admit(self, group: AdmissionGroup) -> None:
        """R-WF-6: collisions before the claim; the claim before the output paths are held.
        Keys a resumed workflow's source already claimed claim nothing again."""
        admitted = [*group.members, *((step, None) for step in group.reused)]
        check_collisions(
            [(step.key, step.output_path) for step, _ in admitted],
            self.env.aggregate,
            self._claimed,
        )
        # A resume item claims its key as a member does: the spec claims nothing for it
        # (R-FAN-23), which would let a script relaunch children without bound.
        launched = [*(step for step, _ in group.members), *group.resumes]
        paths = [f"workflow[{s.key}]" for s in launched if s.key not in group.claimed]
        check_batch(len(paths))
        if paths:
            # One id for the batch: sent again after a lost node, it is not charged twice.
            claim = self._client.fanout.claim
            self.fanout = self._resent(claim, self.env.descriptor, paths, uuid.uuid4().hex)()
        for step, _ in admitted:
            if step.output_path is not None:
                self._claimed[step.output_path] = step.key
        for step in group.steps():
            self.steps[step.key] = step

    def _resume_view(self, step: Step) -> RunView:
        """R-WF-5 `resume` item: the node relaunches the source as this workflow's child."""
        view = self._client.ask(resume_request(step, self._launcher, self.env), LaunchResult).run
        step.agent = step.agent or view.label
        return view

    def _launch(self, step: Step, start: Callable[[], RunView]) -> None:
        try:
            view = start()
        except SubagentsError as err:
            # Admitted but refused by the node (spawn budget, depth, a stopped workflow): it
            # never launched, so it needs no proof. Its claim stays (R-FAN-15).
            step.status, step.async_, step.error = "failed", False, err.message
            step.result = self._result(step, None)
            self._trace("failed", step, error=err.message)
            return
        step.view, step.run_id, step.async_ = view, view.run_id, step.call.async_
        step.status = "running"
        self._trace("started", step)
        if step.async_:
            step.result = self._result(step, view)

    def _resent(self, call: Callable[..., T], *args: Any) -> Callable[[], T]:
        """`call(*args)`, made again on the next node each time its node is lost under it."""
        once = functools.partial(call, *args)
        losses = MAX_NODE_LOSSES
        return functools.partial(across_lost_nodes, self._client, once, NODE_BACK_S, losses)

    def _await(self, step: Step) -> None:
        assert step.run_id is not None
        # The child's shim outlives its node: the next node adopts it.
        self._settle_step(step, self._resent(self._client.runs.wait, step.run_id)())
        self._on_change()

    def _settle_step(self, step: Step, view: RunView) -> None:
        step.view = view
        if step.stopped:
            return  # R-WF-10: a stopped step ignores later updates
        step.status = step_status(view.state)
        step.error = view.error
        step.stopped = view.state == "stopped"
        step.result = self._result(step, view)
        self._trace(step.status, step, error=view.error or None)

    def _result(self, step: Step, view: RunView | None, state: str | None = None) -> ChildResult:
        state = state or (view.state if view is not None else "failed")
        terminal = state not in ("queued", "running", "paused")
        return ChildResult(
            key=step.key,
            agent=step.agent,
            run_id=step.run_id,
            state=state,
            success=(state == "complete") if terminal else None,
            output=view.output if view is not None else "",
            output_path=str(step.output_path) if step.output_path is not None else None,
            error=step.error or (view.error if view is not None else ""),
            async_=bool(step.async_),
        )

    def _result_of(self, call: ChildCall) -> ChildResult:
        step = self.steps[call.key]
        assert step.result is not None
        return step.result

    def _trace(self, event: str, step: Step, **extra: Any) -> None:
        entry: dict[str, Any] = {"ts": time.time(), "event": event, "key": step.key}
        entry.update(agent=step.agent, runId=step.run_id)
        entry.update({k: v for k, v in extra.items() if v is not None})
        self.trace.append(entry)

    # -- the host's side ----------------------------------------------------------------------

    def settle(self) -> None:
        """The script ended: every later call is refused (R-WF-5)."""
        self._settled = True

    def abort(self, reason: str) -> None:
        """R-WF-10: every launched child without a result is stopped and marked `stopped`.
        Runs without the lock: the script's thread may hold it while the stop interrupts it."""
        self._settled = True
        for step in list(self.steps.values()):
            if step.status not in ("pending", "running") or step.result is not None:
                continue
            if step.status == "pending":
                step.async_ = False  # admitted, never launched
            step.status, step.stopped, step.error = "stopped", True, reason
            step.result = self._result(step, step.view, state="stopped")
            self._trace("stopped", step, error=reason)
            if step.run_id is not None:
                # A stopped workflow's children are stopped by the node too; a deadline's not.
                with contextlib.suppress(SubagentsError):
                    self._client.runs.stop(step.run_id)

    def refresh(self) -> None:
        """Re-read the background children (they may have ended) for the result file."""
        for step in self.steps.values():
            if not step.async_ or step.run_id is None or step.stopped:
                continue
            try:
                view = self._client.runs.show(step.run_id)
            except SubagentsError:
                continue
            step.view = view
            if view.state not in ("queued", "running", "paused"):
                step.status = step_status(view.state)
                step.error = view.error
            step.result = self._result(step, view)
