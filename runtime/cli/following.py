"""How a foreground run is followed: its progress (a live table on a terminal, plain lines
otherwise), its end, and the signals and lost nodes on the way (`run`, `workflow`, `rerun`).

Owns the follow: the events shown as they come, the summary printed at the end, what Ctrl-C,
SIGTERM, SIGHUP and the reader of its output going away (runtime/cli/readerwatch.py) do at each
step (runtime/cli/ending.py holds them while the node starts and
the launch is in flight; the follow then sends the stop before it writes anything, and drops a
write that fails on a terminal that is gone), and the takeover of the state dir when the node
followed stops under its run. It never chooses the node (runtime/cli/nodestart.py does) and
never builds a launch.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from rich.table import Table

from subagents_node.cli.common import EXIT_INTERRUPTED, emit, plural
from subagents_node.cli.ending import Ended, EndingSignals, best_effort, silence
from subagents_node.cli.tables import pause_text
from subagents_node.cli.terminal import cell, one_line, say
from subagents_node.client.client import Client
from subagents_node.client.launchagain import with_launch_id
from subagents_node.client.nodewait import node_lost
from subagents_node.messages.errors import (
    ConfigError,
    NodeNotRunning,
    NodeTimeout,
    SubagentsError,
)
from subagents_node.messages.supervisor import ChildView, Launch, RunEvent, RunView


def describe(event: RunEvent, run: RunView) -> str | None:
    """One plain line per event (no task text, R-MISC-1)."""
    data = event.data
    stamp = time.strftime("%H:%M:%S", time.localtime(event.ts))
    if event.kind == "child.started":
        child = run.children[int(data["child"] or 0)]
        return f"{stamp} started {child.label} ({child.agent}) pid {data['pid']}"
    if event.kind == "child.exited":
        child = run.children[int(data["child"] or 0)]
        code = data.get("exit_code")
        how = child_end(child, code if isinstance(code, int) else None)
        return f"{stamp} {child.label} ({child.agent}) {data['state']} ({how})"
    if event.kind.startswith("run."):
        extra = f": {one_line(str(data['error']))}" if data.get("error") else ""
        return f"{stamp} run {run.run_id} {event.kind[4:]}{extra}"
    return None


def child_end(child: ChildView, exit_code: int | None = None) -> str:
    """How a child ended, for people: `exit 0`, `killed by SIGTERM`, or `exit unknown`."""
    if child.signal:
        try:
            return f"killed by {signal.Signals(child.signal).name}"
        except ValueError:
            return f"killed by signal {child.signal}"
    code = child.exit_code if exit_code is None else exit_code
    return "exit unknown" if code is None else f"exit {code}"


class Progress:
    """Live progress: a rich table on a terminal, plain lines otherwise."""

    def __init__(self, live: bool) -> None:
        self._live = None
        if live:
            from rich.live import Live

            self._live = Live(refresh_per_second=8, transient=True)
            # Its terminal may be closing as the follow begins (EIO before the hangup).
            best_effort(self._live.start, err=False, gone=(errno.EIO,))

    def update(self, event: RunEvent, run: RunView) -> None:
        if self._live is not None:
            self._live.update(run_table(run))
            return
        line = describe(event, run)
        if line:
            # A closed terminal fails the write (EIO) before its hangup reaches this process:
            # the hangup stops the run; the write must not end the follow before it.
            try:
                best_effort(lambda: say(line, err=True), err=True, gone=(errno.EIO,))
            except BrokenPipeError:
                # The reader went away (`run … 2>&1 | head -1`): the command ends as SIGPIPE
                # ends a Unix tool, 141, and its run with it, as a hangup's does. It used to
                # exit 141 and leave the run going on, unfollowed, on a node it did not embed.
                silence(err=True)
                raise Ended(signal.SIGPIPE) from None

    def close(self) -> None:
        """Take the live table down (once): its last redraw is dropped on a terminal that is
        gone (ending.py `best_effort`)."""
        if self._live is not None:
            best_effort(self._live.stop, err=False)  # rich's console: stdout


def run_table(run: RunView) -> Table:
    # Labels and agent names come from agent and chain files: cells, never markup.
    table = Table(title=cell(f"run {run.run_id} · {run.label} · {run.state}"), expand=False)
    for column in ("child", "agent", "state", "pid", "elapsed"):
        table.add_column(column)
    now = time.time()
    for child in run.children:
        elapsed = ""
        if child.started_at:
            elapsed = f"{(child.ended_at or now) - child.started_at:.1f}s"
        table.add_row(
            cell(child.label), cell(child.agent), child.state, str(child.pid or ""), elapsed
        )
    return table


@dataclass
class Shown:
    """How far one command has shown its run: the `seq` of the last event shown. A follow
    taken over on the state dir's next node goes on after it (events are numbered in the run's
    store, which that node reads too), so no line is shown twice and none is skipped."""

    seq: int = 0


def follow(
    client: Client,
    run: RunView,
    as_json: bool,
    signals: EndingSignals | None = None,
    shown: Shown | None = None,
) -> RunView:
    """Follow a foreground run to its end. Ctrl-C stops the run, prints its end and exits 130;
    SIGTERM and SIGHUP do the same (exit 128 + the signal): nobody follows the run after.
    `signals` are the command's own when it held them through its launch (a signal held then
    stops the run at once); without them the follow handles its own. `shown`: what an earlier
    follow of the run in this command showed; the events after it are shown."""
    shown = Shown() if shown is None else shown
    if signals is None:
        with EndingSignals(watch_reader=True) as own:
            return _follow(client, run, as_json, own, shown)
    return _follow(client, run, as_json, signals, shown)


def _follow(
    client: Client, run: RunView, as_json: bool, signals: EndingSignals, shown: Shown
) -> RunView:
    progress = Progress(live=sys.stderr.isatty() and not as_json)

    def show(event: RunEvent, view: RunView) -> None:
        progress.update(event, view)
        shown.seq = event.seq

    def gap(err: SubagentsError) -> None:  # the run goes on on its worker: so does the wait
        say(f"{one_line(err.message)}; still following run {run.run_id}", err=True)

    try:
        with signals.raising():
            return client.runs.wait(run.run_id, on_event=show, on_gap=gap, after_seq=shown.seq)
    except (KeyboardInterrupt, Ended) as exc:
        signals.landed()
        # Every later signal is held (ending.py) until the stop is sent: it goes first, before
        # anything is written to a terminal, where a write may block (a full pipe, a paused
        # terminal) or fail (a closed one). Once sent, the shims end the children whatever
        # follows.
        code = exit_code(exc)
        with signals.holding():
            client.runs.stop(run.run_id)
        try:
            with signals.raising(acted_on=1):  # from here a second signal ends the command
                progress.close()
                best_effort(lambda: say(f"stopping run {run.run_id}…", err=True), err=True)
                final = client.runs.wait(run.run_id, timeout=30)
        except (KeyboardInterrupt, Ended):
            signals.hold()
            said = f"interrupted again: run {run.run_id} stops without waiting"
            best_effort(lambda: say(said, err=True), err=True)
            raise SystemExit(code) from None
        signals.hold()
        best_effort(lambda: emit(final, as_json, summary(final)), err=False)
        raise SystemExit(code) from None
    finally:
        progress.close()


def exit_code(exc: BaseException) -> int:
    """128 + the signal that ended a foreground command (130 for Ctrl-C)."""
    return 128 + exc.signum if isinstance(exc, Ended) else EXIT_INTERRUPTED


def summary(run: RunView, capacity: bool = True, fanout_note: str = "") -> str:
    """The run's end, ledgers and output; `fanout_note` follows its fan-out figures."""
    children = plural(len(run.children), "child", "children")
    lines = [f"run {run.run_id} {run.state} ({run.mode}, {children})"]
    if pause_text(run):
        lines.append(pause_text(run))
    snaps = run.snapshots
    note = f" ({fanout_note})" if fanout_note else ""
    lines.append(f"Run fan-out: {snaps.fanout_used}/{snaps.fanout_limit} used{note}")
    if capacity and snaps.capacity_limit is not None:
        limit = snaps.capacity_limit or "unlimited"
        lines.append(f"Active async capacity: {snaps.capacity_used}/{limit} used")
    if run.error:
        lines.append(f"error: {one_line(run.error)}")
    if run.output:
        lines.append(run.output.rstrip())
    return "\n".join(lines)


#: How many times one foreground command follows its run on to another node after the one it
#: followed stopped under it (each time another command's node went away) before it gives up.
MAX_TAKEOVERS = 3

#: Gives a client of the state dir's node: one it starts if none serves (a foreground run,
#: `wait`), or the next one someone else starts, waited for (`logs -f`, runtime/cli/observe.py).
Clients = Callable[[], contextlib.AbstractContextManager[Client]]

T = TypeVar("T")


def across_nodes(
    client: Client,
    attempt: Callable[[Client], T],
    what: str,
    reconnect: Clients | None,
    taken: contextlib.ExitStack,
    holding: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> tuple[Client, T]:
    """`attempt` with `client`; when its node stops under it (NodeNotRunning), again with a
    client `reconnect` gives (entered on `taken`, so it lives as long as the caller needs it),
    up to MAX_TAKEOVERS times. `attempt` must go on where the last one stopped (a follow after
    the last event it showed). `holding` is held while the next node starts. Gives the client
    that answered and what `attempt` returned; without `reconnect`, NodeNotRunning is raised."""
    for left in range(MAX_TAKEOVERS, -1, -1):
        try:
            return client, attempt(client)
        except (NodeNotRunning, NodeTimeout) as err:
            # A node killed with a request in flight is lost too (`node_gone`): a launch sent
            # again under its launch id, a follow, each goes on on the next node.
            if reconnect is None or not left or not node_lost(err):
                raise
            say(
                f"the node stopped under {what}; following it on the state dir's next node",
                err=True,
            )
        with holding():
            client = taken.enter_context(reconnect())
    raise AssertionError("unreachable: the last takeover re-raises")


def _left_running(err: NodeNotRunning | NodeTimeout | ConfigError, run_id: str) -> SubagentsError:
    """`err`, saying that the run goes on, when the node it followed went and no node of
    this command may take its place (a named node, a home following its worker's run, a
    home's or a worker's state dir, which only a node in that role serves): its children
    outlive that node, and the run was not stopped, so it must not look ended."""
    if isinstance(err, ConfigError):
        if err.details.get("reason") != "fleet_role":
            return err
    elif not node_lost(err):
        return err
    return type(err)(
        f"{err.message}. Run {run_id} goes on (its children outlive the node; it was not "
        f"stopped): follow it again with `subagents-node wait {run_id}` once the node is back",
        **err.details,
    )


#: Starts a foreground command's run on the node's client: a launch, a rerun.
Start = Callable[[Client], RunView]


def launching(launch: Launch) -> Start:
    """What starts the run: `launch`, sent under one launch id, so that sent again on the
    next node (its node killed with it in flight) it is the one run. The state dir's next
    node is not waited for, as an API call does (launchagain.py): with `reconnect`, this
    command starts that node itself, at once."""
    # This command follows it: on a node it embeds (now, or later to take a lost node's
    # place), the run's children die with it, should it be killed with -9
    # (runs/binding.py, runs/rebinding.py).
    sent = with_launch_id(launch.model_copy(update={"foreground_pid": os.getpid()}))
    return lambda client: client.runs.launch(sent, next_node_s=0.0)


def launch_and_follow(
    clients: contextlib.AbstractContextManager[Client],
    launch: Launch | Start,
    as_json: bool,
    then: Callable[[Client, RunView], None] | None = None,
    reconnect: Clients | None = None,
) -> RunView:
    """Start the node if need be, launch, follow to the end, stop an embedded node.

    `launch` is the run's launch request, or what starts it on the client (`rerun` asks for a
    relaunch): either way the run is followed the same way, across lost nodes too.

    Ctrl-C, SIGTERM and SIGHUP are held from the start (runtime/cli/ending.py): one that comes
    while the node starts ends the command before anything is launched, one that comes while
    the launch is in flight stops the run as soon as its id is known. From the launch on, a
    signal is acted on only by the follow, which sends the stop before it writes anything, and
    every signal before that stop waits for it. Only a second signal before the launch cuts the
    node's start short (it is stopped all the same). `then` runs
    with the client once the run ended, before an embedded node stops. `reconnect` gives a
    client of the state dir's node, starting one if none serves: when the node followed stops
    under the run (another foreground command's embedded node, ending with its command, or a
    node stopped or killed), the run's shims outlive it and a node this command starts adopts
    them, so the follow goes on to the run's true end (`run`, `rerun` and `workflow` alike).
    """
    with EndingSignals(watch_reader=True) as signals:
        try:
            with clients as client, contextlib.ExitStack() as taken:
                if signals.pending is None:
                    # From the launch on a signal is acted on only where the run is followed:
                    # there it meets the follower, which stops the run (a second one that came
                    # between two steps used to end the command with the run going on).
                    signals.hold()
                    if isinstance(launch, Launch):
                        client, started = across_nodes(
                            client, launching(launch), "its launch", reconnect, taken
                        )
                    else:  # a rerun of a run the node it asked knows: that node or none
                        started = launch(client)
                    shown = Shown()  # a follow taken over goes on from there

                    def following(on: Client) -> RunView:
                        return follow(on, started, as_json, signals, shown)

                    try:
                        client, final = across_nodes(
                            client,
                            following,
                            f"run {started.run_id}",
                            reconnect,
                            taken,
                            signals.holding,  # the run goes on: so does the follow
                        )
                    except (NodeNotRunning, NodeTimeout, ConfigError) as err:
                        raise _left_running(err, started.run_id) from None
                    if then is not None:
                        then(client, final)
                    signals.hold()
                    return final
        except (KeyboardInterrupt, Ended) as exc:  # only before the launch (see above)
            signals.landed()
            signals.pending = signals.pending or getattr(exc, "signum", signal.SIGINT)
        assert signals.pending is not None
        best_effort(lambda: say("interrupted: no run was launched", err=True), err=True)
        raise SystemExit(128 + signals.pending)
