"""The requests that read or stop runs: `runs.show`, `runs.list`, `runs.stop`, `runs.intercom`,
`runs.stop_released` (a forgotten worker's slot-holding runs).

Owns how a request names a run (`resolve`: a unique prefix of its id; ambiguous or unknown ids
are refused; `refusing_unreadable`: a run it cannot read is reported as it is refused), the
views these requests answer with (a run whose record cannot be read is left out of `runs.list`
and reported through the host's quarantine), a child's intercom message
(R-ICB: an event of its run, refused when the run has intercom off) and how a live run stops
(`stop_live`: by request, at its deadline, after a failed launch, or with the run that launched
it, R-WF-10). Functions over a RequestHost, as runs/pauses.py's are. It never kills a process
(the keeper tells each child's shim to end its tree), never settles a run (stopping only ends
its children; the host's `advance` settles it once none runs) and never blocks on another owner.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol

from subagents_node.actors.child.keeper import ChildKeeper
from subagents_node.actors.child.strays import DUE_STOPPED
from subagents_node.actors.context import Cancel
from subagents_node.actors.inbox import Tick
from subagents_node.actors.runs import checkpoints, pauses, runplan, runstore
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.ticks import KillEscaped, StopReleasedAgain
from subagents_node.messages.base import Message
from subagents_node.messages.errors import (
    IntercomOff,
    RecordQuarantined,
    RunIdAmbiguous,
    RunNotFound,
)
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import (
    Intercom,
    IntercomMessage,
    ListRuns,
    RunList,
    Show,
    Stop,
    StopReleased,
)


class RequestHost(pauses.PauseHost, Protocol):
    """What these requests need from the RunSupervisor, beyond the PauseHost's."""

    @property
    def keeper(self) -> ChildKeeper: ...

    def after(self, delay_s: float, tick: Tick) -> Cancel: ...

    def live_runs(self) -> list[LiveRun]:
        """The live runs of this node, as they are now."""

    def after_commit(self, effect: Callable[[], None]) -> None: ...

    @property
    def unrecorded_stops(self) -> UnrecordedStops: ...

    def quarantine_unreadable(self, err: RecordQuarantined) -> str:
        """Report a run or child row that cannot be read; the run id it belongs to."""


def refusing_unreadable(
    owner: str,
    report: Callable[[RecordQuarantined], object],
    handler: Callable[[Any], Message],
) -> Callable[[Any], Message]:
    """`handler`, with a run it cannot read reported (status, doctor) as it is refused."""

    @functools.wraps(handler)
    def guarded(request: Any) -> Message:
        try:
            return handler(request)
        except RecordQuarantined as err:
            if err.details.get("owner") == owner:
                report(err)
            raise

    return guarded


def resolve(db: sqlite3.Connection, run_id: str) -> str:
    """The id of the one run whose id starts with `run_id`."""
    try:
        found = runstore.resolve_run_id(db, run_id)
    except LookupError:
        raise RunIdAmbiguous(
            f"Run id prefix '{run_id}' is ambiguous; give more characters.", run_id=run_id
        ) from None
    if found is None:
        raise RunNotFound(f"Run not found: {run_id}", run_id=run_id)
    return found


def show(host: RequestHost, request: Show) -> Message:
    view = runstore.view(host.db, host.resolve(request.run_id))
    assert view is not None
    return view


def list_runs(host: RequestHost, request: ListRuns) -> Message:
    after = None if request.after_run_id is None else host.resolve(request.after_run_id)
    ids = runstore.list_runs(
        host.db,
        request.session_id,
        request.active_only,
        request.limit,
        request.root_run_id,
        parent_run_id=request.parent_run_id,
        after_run_id=after,
    )
    views = runstore.readable_views(host.db, ids, host.quarantine_unreadable)
    return RunList(runs=views, last_seq=runstore.last_event_seq(host.db))


#: The event a run records when a stop (a request, a deadline, a failed launch) begins.
STOPPING = "run.stopping"


def stop(host: RequestHost, request: Stop) -> Message:
    run_id = host.resolve(request.run_id)
    live = host.live_run(run_id)
    if live is not None and live.stop_state is None:
        stop_live(host, live, "stopped", "Stopped by request.")
    elif live is not None and live.stop_state == "paused" and not live.settling:
        # Stopped while it pauses (its children are ending already): it ends stopped and frees
        # its slot; it used to settle paused, holding the slot, as if the stop never came.
        host.unrecorded_stops.begun(live)
        live.stop_state = "stopped"
        host.record_event(run_id, STOPPING, {"reason": "Stopped by request.", "state": "stopped"})
    elif live is None and checkpoints.parked(host.db, run_id):
        going = host.continuing(run_id)
        if going is not None:  # stopped now, the source would be over and its successor run
            raise checkpoints.refuse(
                run_id, f"is being continued as run {going}; stop that run instead.", "continued"
            )
        pauses.end_parked(host, run_id, "stopped", "Stopped by request.")
    view = runstore.view(host.db, run_id)
    assert view is not None
    return view


def stop_released(host: RequestHost, request: StopReleased) -> Message:
    """Stop every live run that holds a capacity slot (and what it launched, R-WF-10): its home
    forgot this worker while it was cut off and released those slots, so their children would
    run past their sessions' limits (R-CAP-1). Each ends `stopped` with the reason as its error,
    so `runs show` says why; a run stopping already, or settling, is left to end as it does.
    A full disk that undoes it is no reason for the runs to go on: the supervisor does it again
    itself once there may be room (`UnrecordedStops.undo`, RunSupervisor.group_undone)."""
    stopped: list[str] = []
    for live in host.live_runs():
        if live.handle is None or live.stop_state is not None or live.settling:
            continue
        if not stopped:
            host.unrecorded_stops.released(request.reason)
        stop_live(host, live, "stopped", request.reason, keep_reason=True)
        stopped.append(live.run_id)
    views = runstore.readable_views(host.db, stopped, host.quarantine_unreadable)
    return RunList(runs=views, last_seq=runstore.last_event_seq(host.db))


def stop_live(
    host: RequestHost, live: LiveRun, state: str, reason: str, keep_reason: bool = False
) -> None:
    """Stop a live run's children and what it launched; it settles `state` once none runs,
    with `reason` as its error if it fails (or `keep_reason`: a stop that must say why).
    Its children are signalled only once the stop has committed: a full disk that undoes it
    undoes it in memory too (`UnrecordedStops`), so `store_full` means nothing changed."""
    host.unrecorded_stops.begun(live)
    live.stop_state = state
    kept = state == "failed" or keep_reason
    live.error = live.error or (reason if kept else "")
    live.queue.clear()
    # The state it is to end in goes with the reason (and whether it is the run's error): a
    # node restarted during the stop's grace finishes the stop it finds here (runs/restart.py),
    # instead of failing the run or ending it without saying why.
    data: dict[str, Any] = {"reason": reason, "state": state}
    if keep_reason:
        data["error"] = reason
    host.record_event(live.run_id, STOPPING, data)
    for child_id in list(live.running):
        send = host.keeper.stop(host.db, child_id, "stopped", reason)
        if send is not None:  # signalled once the stop is durable, never before
            host.after_commit(functools.partial(_signal, host, child_id, send))
    # Runs this run launched (workflow children, nested launches) stop with it (R-WF-10).
    for other in host.live_runs():
        if other.parent_run_id == live.run_id and other.stop_state is None:
            stop_live(host, other, "stopped", reason)
    host.advance(live)


def kill_escaped(host: RequestHost, child_id: str, why: str) -> None:
    """A KillEscaped tick (ticks.py): SIGKILL what a dead shim left after a stop's grace; at
    the deadline of a child whose dead shim kept it, stop what is left as timed out (signalled
    once that is durable, as a stop is); a shim overdue after a stop's grace is killed."""
    if why == "deadline":
        send = host.keeper.timed_out(host.db, child_id)
        if send is not None:
            host.after_commit(functools.partial(_signal, host, child_id, send))
    elif why == "overdue":
        host.keeper.backstop.kill_overdue_shim(host.db, child_id)
    elif why == "late":
        for kill in host.keeper.backstop.late(host.db, host.clock()):
            host.after_commit(kill)
    elif why == DUE_STOPPED:  # a stray shim's tree ended and it has not reported
        host.keeper.strays.look_again(host.db, child_id)
    else:
        host.keeper.kill_escaped(child_id)


def _signal(host: RequestHost, child_id: str, send: Callable[[], float | None]) -> None:
    grace = send()
    if grace is not None:  # its shim is dead: the keeper TERMed what it left
        host.after(grace, KillEscaped(child_id))
    elif (overdue := host.keeper.backstop.overdue_in(host.db, child_id)) is not None:
        host.after(overdue, KillEscaped(child_id, "overdue"))


class UnrecordedStops:
    """The stops begun in the open group, until it commits. Their signals wait for that commit
    (after-commit effects); a full disk that undoes the group drops those signals and, here,
    what the stops had changed in memory, so a stop asked again later is a stop again. A
    forgotten worker's stop (`runs.stop_released`) that it undid is done again by the
    supervisor itself (`undo` returns the tick for it): nobody else would ask it again."""

    def __init__(self, after_commit: Callable[[Callable[[], None]], None]) -> None:
        self._after_commit = after_commit
        self._begun: list[tuple[LiveRun, str | None, str, list[runplan.ChildPlan]]] = []
        #: The reason of the `runs.stop_released` begun in the open group ("": none), and the
        #: serial of the latest StopReleasedAgain (an older one does nothing).
        self._released = ""
        self._serial = 0

    def _first_of_group(self) -> None:
        if not self._begun and not self._released:
            self._after_commit(self._committed)

    def _committed(self) -> None:
        self._begun.clear()
        self._released = ""

    def begun(self, live: LiveRun) -> None:
        if any(known is live for known, *_ in self._begun):
            return  # the first snapshot of the group is the one to go back to
        self._first_of_group()
        self._begun.append((live, live.stop_state, live.error, list(live.queue)))

    def released(self, reason: str) -> None:
        """A forgotten worker's stop, with `reason`, is begun in the open group."""
        self._first_of_group()
        self._released = reason

    def undo(self) -> StopReleasedAgain | None:
        """The group was undone: the runs are as the store still says, not stopping. Returns
        the tick that does an undone `runs.stop_released` again (None: none was undone)."""
        begun, self._begun = self._begun, []
        released, self._released = self._released, ""
        for live, stop_state, error, queue in reversed(begun):
            live.stop_state, live.error = stop_state, error
            live.queue.clear()
            live.queue.extend(queue)
        if not released:
            return None
        self._serial += 1
        return StopReleasedAgain(released, self._serial)

    def latest(self, again: StopReleasedAgain) -> bool:
        """Whether `again` is the latest: an older one was superseded by a later undo."""
        return again.serial == self._serial


#: The most intercom messages one run keeps (each at most 4,000 characters): a flood of them
#: (any local client can name any run) grew its events and the store without bound.
MAX_INTERCOM_PER_RUN = 10_000


def intercom(host: RequestHost, request: Intercom) -> Message:
    """R-ICB: a child's message to its run; refused when the run has intercom off, has ended
    (no child is left to send one: a message then was kept for good, unread), or holds
    MAX_INTERCOM_PER_RUN already."""
    run_id = host.resolve(request.run_id)
    row = runstore.run_row(host.db, run_id)
    assert row is not None
    if row["intercom"] == "off":
        raise IntercomOff(f"Intercom is off for run {run_id}.", run_id=run_id)
    if row["state"] in TERMINAL_RUN_STATES:
        raise IntercomOff(
            f"Run {run_id} has ended ({row['state']}): intercom reaches a run only while it "
            "goes on.",
            run_id=run_id,
            reason="run_ended",
        )
    live = host.live_run(run_id)
    sent = live.intercom_sent if live is not None else None
    if sent is None:  # counted once per run (a paused run, which is not live: each time)
        sent = int(
            host.db.execute(
                "SELECT COUNT(*) FROM run_events WHERE run_id = ? AND kind = 'intercom'",
                (run_id,),
            ).fetchone()[0]
        )
    if sent >= MAX_INTERCOM_PER_RUN:
        raise IntercomOff(
            f"Run {run_id} holds {MAX_INTERCOM_PER_RUN:,} intercom messages, the most a run "
            "keeps; this one was not kept.",
            run_id=run_id,
            reason="intercom_full",
        )
    if live is not None:
        live.intercom_sent = sent + 1
    now = host.clock()
    host.record_event(run_id, "intercom", {"child": request.child_id or None, "text": request.text})
    return IntercomMessage(run_id=run_id, child_id=request.child_id, text=request.text, ts=now)
