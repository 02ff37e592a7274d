"""Client API for runs: launch, watch, wait, settle, logs, show, list, stop, attach, rerun
(`client.runs`).

`wait()` and `settle()` follow runs through long-poll `watch` requests: each one is answered by
the node as soon as the run has new events, so nothing here polls. `wait()` on a worker's run
(a client `on` a host) rides out a partition: the home holds its watch while the worker is
unreachable and answers `host_unreachable` after the watch's wait, and the wait asks again.
`logs()` streams the child logs (client/logs.py: inotify for new bytes, the same long-poll for
the run's end). Requests are built with `validate_request`, so a bad argument is a typed
`BadRequest`, never pydantic's ValidationError.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from subagents_node.client import lineage
from subagents_node.client.arguments import listed, plain_callback
from subagents_node.client.client import checked_timeout
from subagents_node.client.plans import Plan, build, one
from subagents_node.messages.constants import NODE_BACK_S
from subagents_node.messages.domains import MAX_DURATION_S
from subagents_node.messages.errors import BadRequest, NodeTimeout, OwnerUnavailable, SubagentsError
from subagents_node.messages.lineage import AppendResult
from subagents_node.messages.pauses import Approve, Pause, Reject
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import (
    ChainStep,
    FleetEvents,
    Launch,
    LaunchResult,
    ListRuns,
    RunEvent,
    RunEvents,
    RunList,
    RunView,
    Show,
    Stop,
    Watch,
    WatchAll,
)

if TYPE_CHECKING:
    from subagents_node.client.client import Client
    from subagents_node.client.logs import LogLine, LogsRead

#: How long one watch request may wait at the node before answering with no events.
WATCH_WAIT_S = 10.0


# -- the requests, one plan each (shared with the asyncio client, subagents_node.client.aio) --

#: Called with each event of a followed run, in order, and the run as that batch left it.
OnEvent = Callable[[RunEvent, RunView], None]
#: Called each time a followed run's worker could not be reached (the wait goes on).
OnGap = Callable[[SubagentsError], None]
#: Watches of a worker's run lost in a row (no answer at all: the partition cut one in
#: flight, or the home itself is gone) before a wait gives up.
MAX_LOST_WATCHES = 3


def launch_plan(launch: Launch) -> Plan[RunView]:
    if not isinstance(launch, Launch):  # a dict or None would fail deep in the transport
        raise BadRequest(
            f"runs.launch takes a Launch request, not {type(launch).__name__}; build one with "
            "Launch.model_validate({...})",
            reason="argument",
            field="launch",
        )
    result: LaunchResult = yield from one(launch, LaunchResult)
    return result.run


def watch_plan(run_id: str, after_seq: int, wait_s: float, reply_timeout: float) -> Plan[RunEvents]:
    """A long poll: the node answers as soon as the run has events after `after_seq`; the reply
    may take `wait_s` plus the client's own timeout."""
    request = build(Watch, run_id=run_id, after_seq=after_seq, wait_s=wait_s)
    return one(request, RunEvents, timeout=long_poll_timeout(wait_s, reply_timeout))


def watch_all_plan(
    after_seq: int, wait_s: float, limit: int, reply_timeout: float
) -> Plan[FleetEvents]:
    request = build(WatchAll, after_seq=after_seq, wait_s=wait_s, limit=limit)
    return one(request, FleetEvents, timeout=long_poll_timeout(wait_s, reply_timeout))


def long_poll_timeout(wait_s: float, reply_timeout: float) -> float:
    """How long a long poll's reply may take: its wait at the node plus the client's timeout,
    at most MAX_DURATION_S. Both were checked already (the request's model, the client's
    constructor); the sum is no argument of the caller's: a client made with the largest
    timeout it accepts was refused every watch, wait and follow for a `timeout` it never
    passed."""
    return min(wait_s + reply_timeout, MAX_DURATION_S)


def wait_plan(
    address: str,
    reply_timeout: float,
    run_id: str,
    timeout: float | None = None,
    on_event: OnEvent | None = None,
    on_gap: OnGap | None = None,
    carried: bool = False,
    after_seq: int = 0,
) -> Plan[RunView]:
    """Follow a run through long polls until it is terminal (R-RUN-3). `carried`: the run is
    on a worker the home carries the watches to, so a worker out of reach is waited for.
    `after_seq`: the last event the caller already has (events are numbered in the run's store,
    so the numbers hold on the next node of the same state dir); `on_event` sees the later ones."""
    if timeout is not None:  # a NaN deadline would never pass: the wait would never end
        timeout = checked_timeout(timeout, forever=True)
    plain_callback(on_event, "on_event")  # an async one's events would be lost
    plain_callback(on_gap, "on_gap")
    deadline = None if timeout is None else time.monotonic() + timeout
    seq = after_seq
    lost = 0
    while True:
        wait_s = WATCH_WAIT_S
        if deadline is not None:
            wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
        try:
            batch: RunEvents = yield from watch_plan(run_id, seq, wait_s, reply_timeout)
        except (OwnerUnavailable, NodeTimeout) as err:
            lost = lost + 1 if isinstance(err, NodeTimeout) else 0
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if out_of_time or not _worker_away(err, carried, lost):
                raise
            if on_gap is not None:
                on_gap(err)
            continue
        lost = 0
        for event in batch.events:
            if on_event is not None:
                on_event(event, batch.run)
        seq = batch.last_seq
        if batch.more:  # a page of a long history: the rest at once, before the end is told
            continue
        if batch.run.state in TERMINAL_RUN_STATES:
            return batch.run
        if deadline is not None and time.monotonic() >= deadline:
            raise NodeTimeout(
                f"run {run_id} is still {batch.run.state} after {timeout:g}s",
                address=address,
                timeout_s=timeout,
            )


def _worker_away(err: SubagentsError, carried: bool, lost: int) -> bool:
    """Whether a watch's error means only that the run's worker is out of reach for now: the
    home said so (it held the watch as long as it asked to wait), or a carried watch went
    unanswered (cut in flight) fewer than MAX_LOST_WATCHES times in a row. A worker the home
    forgot (`lost`) or does not know is no gap: the wait ends with its error."""
    if isinstance(err, NodeTimeout):
        return carried and lost <= MAX_LOST_WATCHES
    details = err.details
    return details.get("reason") in ("host_unreachable", "host_timeout") and (
        details.get("state") == "unreachable"
    )


def show_plan(run_id: str) -> Plan[RunView]:
    return one(build(Show, run_id=run_id), RunView)


def list_plan(
    session_id: str | None = None,
    active_only: bool = False,
    limit: int = 50,
    root_run_id: str | None = None,
    parent_run_id: str | None = None,
    after_run_id: str | None = None,
) -> Plan[list[RunView]]:
    request = build(
        ListRuns,
        session_id=session_id,
        active_only=active_only,
        limit=limit,
        root_run_id=root_run_id,
        parent_run_id=parent_run_id,
        after_run_id=after_run_id,
    )
    found: RunList = yield from one(request, RunList)
    return found.runs


def stop_plan(run_id: str) -> Plan[RunView]:
    return one(build(Stop, run_id=run_id), RunView)


def pause_plan(run_id: str) -> Plan[RunView]:
    return one(build(Pause, run_id=run_id), RunView)


def approve_request(
    run_id: str,
    depth: int = 0,
    capacity_limit: int = 0,
    env: dict[str, str] | None = None,
    inherited_fanout: str | None = None,
) -> Approve:
    return build(
        Approve,
        run_id=run_id,
        depth=depth,
        capacity_limit=capacity_limit,
        env=env,
        inherited_fanout=inherited_fanout,
    )


def approve_plan(request: Approve) -> Plan[RunView]:
    """An approve's one send: the run that goes on past the checkpoint."""
    result: LaunchResult = yield from one(request, LaunchResult)
    return result.run


def reject_plan(run_id: str, reason: str = "") -> Plan[RunView]:
    return one(build(Reject, run_id=run_id, reason=reason), RunView)


class RunsAPI:
    """Every method builds its request with `validate_request`: a bad argument raises the
    documented `BadRequest` naming the field, never pydantic's ValidationError."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def launch(self, launch: Launch, next_node_s: float = NODE_BACK_S) -> RunView:
        """Admit and start a run; returns as soon as its first children started. Sent under a
        launch id (a fresh one unless `launch` has one), and sent again under it when its
        answer is lost (client/launchagain.py): one run, whatever happened to the first send.
        A node lost with it in flight is waited for up to `next_node_s` seconds (the state
        dir's next node; 0: not at all, for a caller that starts that node itself)."""
        from subagents_node.client.launchagain import launch as launch_once

        wait_s = checked_timeout(next_node_s, "next_node_s")
        return launch_once(self._client, launch, wait_s)

    def watch(self, run_id: str, after_seq: int = 0, wait_s: float = WATCH_WAIT_S) -> RunEvents:
        return self._client.perform(watch_plan(run_id, after_seq, wait_s, self._client.timeout))

    def watch_all(
        self, after_seq: int = 0, wait_s: float = WATCH_WAIT_S, limit: int = 500
    ) -> FleetEvents:
        """Events of every run after `after_seq`, answered as soon as there are any."""
        return self._client.perform(watch_all_plan(after_seq, wait_s, limit, self._client.timeout))

    def wait(
        self,
        run_id: str,
        timeout: float | None = None,
        on_event: OnEvent | None = None,
        on_gap: OnGap | None = None,
        after_seq: int = 0,
    ) -> RunView:
        """Block until the run is terminal (R-RUN-3); `on_event` sees each event in order,
        from the one after `after_seq` (the `seq` of the last event a previous wait showed, so
        a wait resumed on another node of the same state dir shows nothing twice).

        On a client `on` a worker, a partition does not end the wait: `on_gap` is told each
        time the worker could not be reached, and the wait goes on until the run ends (or
        `timeout`), unless the home forgets the worker."""
        client = self._client
        carried = bool(getattr(client.transport, "host", ""))
        plan = wait_plan(
            client.address, client.timeout, run_id, timeout, on_event, on_gap, carried, after_seq
        )
        return client.perform(plan)

    def settle(
        self,
        run_ids: Sequence[str],
        timeout: float | None = None,
        on_end: Callable[[RunView], None] | None = None,
    ) -> list[RunView]:
        """Block until every run is terminal, or until `timeout` seconds have passed.

        Returns the latest view of each run, in the order given: a view that is not terminal
        means the deadline came first (nothing is raised for that). `on_end` sees each run
        once it has ended, in the order given, and once only: a run named twice (the same id,
        or a prefix of it) is waited on once, and its view is given for both. Unknown or
        ambiguous ids raise before any wait.
        """
        if timeout is not None:
            timeout = checked_timeout(timeout, forever=True)
        plain_callback(on_end, "on_end")
        deadline = None if timeout is None else time.monotonic() + timeout
        views = [self.show(run_id) for run_id in listed(run_ids, "run_ids", "run ids")]
        first: dict[str, int] = {}
        for i, view in enumerate(views):
            named = first.setdefault(view.run_id, i)
            if named != i:  # named again (the same id, or a prefix of it): waited on once
                views[i] = views[named]
                continue
            seq = 0
            while view.state not in TERMINAL_RUN_STATES:
                wait_s = WATCH_WAIT_S
                if deadline is not None:
                    wait_s = min(wait_s, deadline - time.monotonic())
                    if wait_s <= 0:
                        return views
                batch = self.watch(view.run_id, seq, wait_s)
                seq, view = batch.last_seq, batch.run
                views[i] = view
            if on_end is not None:
                on_end(view)
        return views

    def logs(
        self,
        run_id: str,
        child: str | None = None,
        follow: bool = False,
        read: LogsRead | None = None,
    ) -> Iterator[LogLine]:
        """The lines of run `run_id`'s child logs (all children, or the one labelled `child`),
        stdout and stderr labelled; with `follow`, new lines as they are written until the run
        ends. The logs are read from the run's directory, so the node must be on this host.
        `read`: where an earlier follow stopped (its node was lost): the lines after it."""
        from subagents_node.client.logs import follow_logs

        return follow_logs(self._client, run_id, child, follow, read)

    def show(self, run_id: str) -> RunView:
        return self._client.perform(show_plan(run_id))

    def list(
        self,
        session_id: str | None = None,
        active_only: bool = False,
        limit: int = 50,
        root_run_id: str | None = None,
        parent_run_id: str | None = None,
        after_run_id: str | None = None,
    ) -> list[RunView]:
        """Newest first; `after_run_id` (the last run of the previous page) pages on."""
        plan = list_plan(session_id, active_only, limit, root_run_id, parent_run_id, after_run_id)
        return self._client.perform(plan)

    def stop(self, run_id: str) -> RunView:
        return self._client.perform(stop_plan(run_id))

    def resume(
        self,
        run_id: str,
        message: str = "",
        depth: int = 0,
        capacity_limit: int = 0,
        env: Mapping[str, str] | None = None,
        inherited_fanout: str | None = None,
        intercom: str | None = None,
    ) -> RunView:
        """Resume finished or interrupt-paused background run `run_id` (R-RES-1..7): the new
        background run, once its first children started. `message` is a follow-up to the task;
        `intercom` ("on"/"off") overrides the source's setting; from inside a run, `depth` and
        the caller's `inherited_fanout` make it nested (no slot, R-TOP-1). Sent under a launch
        id, and sent again under it when its answer is lost, as `launch`: one run."""
        from subagents_node.client.launchagain import relaunch

        request = lineage.resume_request(
            run_id, message, depth, capacity_limit, env, inherited_fanout, intercom
        )
        return relaunch(self._client, request)

    def append(self, run_id: str, steps: Sequence[ChainStep]) -> AppendResult:
        """Queue `steps` on running background chain `run_id` (R-APP-1..6): their claims and
        the append exist together or not at all. Sent under an append id, and sent again
        under it when its answer is lost, as `launch`: queued once."""
        from subagents_node.client.launchagain import append

        return append(self._client, lineage.append_request(run_id, steps))

    def attach(
        self,
        run_id: str,
        steps: Sequence[ChainStep],
        capacity_limit: int = 0,
        depth: int = 0,
        env: Mapping[str, str] | None = None,
        inherited_fanout: str | None = None,
    ) -> RunView:
        """Start a background chain whose step 0 is live background run `run_id` (R-RES-6):
        `steps` run once it ended, the first with its output as `{previous}`. The chain takes
        its own capacity slot (under `capacity_limit`; the source keeps its slot) and a new
        fan-out budget. From inside a run (`depth` and the caller's `inherited_fanout`, its
        $SUBAGENTS_RUN_FANOUT) it is nested and takes no slot (R-TOP-1). Returns the chain's
        run, waiting for its source. Sent under a launch id, and sent again under it when its
        answer is lost, as `launch`: one chain."""
        from subagents_node.client.launchagain import relaunch

        request = lineage.attach_request(
            run_id, steps, capacity_limit, depth, env, inherited_fanout
        )
        return relaunch(self._client, request)

    def rerun(
        self,
        run_id: str,
        task: str,
        child: int = 0,
        env: Mapping[str, str] | None = None,
        foreground_pid: int | None = None,
    ) -> RunView:
        """Run child `child` of run `run_id` again with a new task, in the foreground
        (R-MISC-2). A live foreground run with one child is superseded: stopped and linked
        (`superseded_by` on it, `source_run_id` on the rerun). Returns once the rerun runs.
        `foreground_pid`: the process that follows it (`Launch.foreground_pid`). Sent under a
        launch id, and sent again under it at once when its answer is lost to a slow node, as
        `launch`: one rerun (a node that went is not waited for: the rerun is foreground)."""
        from subagents_node.client.launchagain import relaunch

        request = lineage.rerun_request(run_id, task, child, env, foreground_pid)
        return relaunch(self._client, request, next_node_s=0.0)

    def pause(self, run_id: str) -> RunView:
        """R-RUN-2 interrupt-as-pause: the run's child tree is stopped and the run settles
        `paused`, keeping its capacity slot; `resume` goes on from the interrupted step."""
        return self._client.perform(pause_plan(run_id))

    def approve(
        self,
        run_id: str,
        depth: int = 0,
        capacity_limit: int = 0,
        env: dict[str, str] | None = None,
        inherited_fanout: str | None = None,
    ) -> RunView:
        """A run waiting at a checkpoint goes on. Returns the run that continues: the same
        one, or (after a node restart ended the paused execution) a new run that takes its
        slot over, launched with `depth`, `capacity_limit`, `env` and the caller's
        `inherited_fanout` like a resume (from inside a run: nested, no slot, R-TOP-1). Sent
        under an approve id, and sent again under it when its answer is lost, as `launch`:
        answered with the run that went on, never refused as already approved."""
        from subagents_node.client.launchagain import approve

        request = approve_request(run_id, depth, capacity_limit, env, inherited_fanout)
        return approve(self._client, request)

    def reject(self, run_id: str, reason: str = "") -> RunView:
        """A run waiting at a checkpoint ends `rejected`, with `reason` in its error."""
        return self._client.perform(reject_plan(run_id, reason))
