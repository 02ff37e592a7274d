"""`fleet`: a live terminal view of sessions and runs, fed by node events.

Owns the view's state (the runs it has seen, by id) and its rendering. A background thread
long-polls `runs.watch_all`: the node answers as soon as any run has an event, so the view
updates from events, never by re-reading state files. A one-second tick only advances clocks
(elapsed, time to deadline) and re-reads the last line of running children's logs. `q` quits.
On a home node there is one such thread per host that is up, and each run says its host.

The fan-out gauges are not the figures runs recorded at admission: each frame reads the shown
runs' budgets live from the fan-out owner, in one request (R-FAN-26), so the claims of a fan-out
storm's nested launches show as they happen. A budget that cannot be read shows its recorded
figure marked `(recorded)`, with the reason under the table; the view itself goes on.
The capacity gauges are not the figures runs recorded at admission either: each frame reads the
pool of each session it shows from the capacity owner, one request per session (a reading
reconciles the pool, R-CAP-26), so a freed slot shows as free. A pool that cannot be read shows
its runs' recorded figures, marked the same way.
"""

from __future__ import annotations

import contextlib
import select
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator
from typing import NamedTuple

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from subagents_node.cli.common import lineage
from subagents_node.cli.tables import state_label
from subagents_node.cli.terminal import cell, one_line
from subagents_node.client.capacity_views import live_capacity_plan
from subagents_node.client.client import Client, connect
from subagents_node.client.fanout_views import RECORDED, live_fanout_plan
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.members import HOME_NAME
from subagents_node.messages.runs import output_tail
from subagents_node.messages.supervisor import ListRuns, RunList, RunView

ACTIVE = ("queued", "running", "paused")
#: Runs a frame shows (and whose budgets it reads).
SHOWN = 40
#: The runs going and the newest runs the live view lists when it starts (each, one request).
FOLLOWED = 100
#: How long a frame waits for the fan-out owner before it shows the recorded figures instead.
FANOUT_TIMEOUT_S = 2.0
#: How long a frame waits for each session's pool before it shows the recorded figures instead.
CAPACITY_TIMEOUT_S = 2.0


class FleetState:
    """The runs the view knows, updated from fleet events (of each host, on a home node)."""

    def __init__(self) -> None:
        self.runs: dict[str, RunView] = {}
        #: The last event seen, per host ("" on a node that is no home): each node counts its own.
        self.last_seq: dict[str, int] = {}
        self.errors: dict[str, str] = {}
        self._lock = threading.Lock()  # the poller threads write, the render thread reads
        self.changed = threading.Event()

    def apply(self, runs: list[RunView], last_seq: int, host: str = "") -> None:
        with self._lock:
            for run in runs:
                self.runs[run.run_id] = run.model_copy(update={"host": host}) if host else run
            self.last_seq[host] = max(self.last_seq.get(host, 0), last_seq)
            self.errors.pop(host, None)
        self.changed.set()

    def fail(self, host: str, message: str) -> None:
        with self._lock:
            self.errors[host] = message
        self.changed.set()

    @property
    def error(self) -> str:
        with self._lock:
            return "; ".join(f"{h}: {e}" if h else e for h, e in sorted(self.errors.items()))

    def snapshot(self) -> list[RunView]:
        with self._lock:
            runs = list(self.runs.values())
        # Active runs first, newest first within each group.
        return sorted(runs, key=lambda r: (r.state not in ACTIVE, -r.created_at))


def last_line(path: str, limit: int = 4096) -> str:
    """The last non-empty line of a log file (read from its end; never the whole file)."""
    text = output_tail(path, limit) if path else ""
    return text.splitlines()[-1][:80] if text else ""


def gauge(used: int | None, limit: int | None, width: int = 10) -> str:
    if used is None or limit is None:
        return "-"
    if limit == 0:
        return f"{used}/∞"
    filled = min(width, round(width * used / limit)) if limit else 0
    return f"{'█' * filled}{'░' * (width - filled)} {used}/{limit}"


class Frame(NamedTuple):
    """The runs a frame shows, with live ledger figures, and the runs whose figures are their
    records (run id -> why), per ledger."""

    runs: list[RunView]
    recorded: dict[str, str]
    capacity_recorded: dict[str, str]


def live_frame(client: Client, runs: list[RunView]) -> Frame:
    """The runs a frame shows, with their budgets' live figures (one request for them all) and
    their sessions' live capacity (one request per session)."""
    fanout = client.perform(live_fanout_plan(runs[:SHOWN], FANOUT_TIMEOUT_S))
    capacity = client.perform(live_capacity_plan(fanout.runs, CAPACITY_TIMEOUT_S))
    return Frame(capacity.runs, fanout.recorded, capacity.recorded)


def render(
    runs: list[RunView],
    now: float,
    error: str = "",
    recorded: dict[str, str] | None = None,
    capacity_recorded: dict[str, str] | None = None,
) -> Group:
    """One frame; a run in `recorded` (run id -> why) shows the fan-out figure it recorded,
    one in `capacity_recorded` the capacity figure it recorded."""
    recorded = recorded or {}
    capacity_recorded = capacity_recorded or {}
    table = Table(title="subagents fleet  (q quits)", expand=True)
    hosts = any(run.host for run in runs)  # a home's view of several hosts
    if hosts:
        table.add_column("host", no_wrap=True, overflow="ellipsis")
    table.add_column("session", no_wrap=True, overflow="ellipsis")
    table.add_column("run", no_wrap=True, min_width=12)  # an id is never cut
    for column in (
        "state",
        "agent",
        "elapsed",
        "deadline",
        "capacity",
        "fan-out",
        "link",
        "last output",
    ):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    for run in runs[:SHOWN]:
        start = run.started_at or run.created_at
        elapsed = (run.ended_at or now) - start
        deadline = "-"
        if run.deadline_at and run.state in ACTIVE:
            deadline = f"{max(0.0, run.deadline_at - now):.0f}s"
        snaps = run.snapshots
        running = [c for c in run.children if c.state == "running"]
        output = last_line(running[-1].stdout_path) if running else ""
        # Every cell is Text, never markup: a label from an agent or chain file, a child's
        # last line (`[/x]` in it raised rich's MarkupError and ended the view), an error.
        table.add_row(
            *((cell(run.host),) if hosts else ()),
            cell(run.session_id),
            cell(run.run_id),
            cell(state_label(run)),
            cell(run.label),
            f"{elapsed:.1f}s",
            deadline,
            cell(
                gauge(snaps.capacity_used, snaps.capacity_limit)
                + (f" ({RECORDED})" if run.run_id in capacity_recorded else "")
            ),
            cell(
                gauge(snaps.fanout_used, snaps.fanout_limit)
                + (f" ({RECORDED})" if run.run_id in recorded else "")
            ),
            cell("; ".join(lineage(run)) or "-"),
            cell(output),
        )
    parts: list[Table | Text] = [table]
    reasons = sorted(set(recorded.values()))
    if reasons:
        text = f"fan-out ({RECORDED}): not read live: {'; '.join(reasons)}"
        parts.append(Text(one_line(text), style="yellow"))
    reasons = sorted(set(capacity_recorded.values()))
    if reasons:
        text = f"capacity ({RECORDED}): not read live: {'; '.join(reasons)}"
        parts.append(Text(one_line(text), style="yellow"))
    if error:
        parts.append(Text(one_line(f"node: {error}"), style="red"))
    return Group(*parts)


def open_client(address: str, host: str) -> Client:
    """A client for `host` of the home at `address` (the node itself for "" and `home`)."""
    base = connect(address)
    if not host or host == HOME_NAME:
        return base
    try:
        return base.on(host)
    finally:
        base.close()


def poll(address: str, host: str, state: FleetState, stop: threading.Event) -> None:
    """Follow one host's events until `stop`; each answer comes as soon as any run changes.

    The thread owns its client (ZeroMQ sockets belong to one thread) and closes it itself, so
    the view can quit without waiting for a long-poll that is still out.
    """
    client = open_client(address, host)
    try:
        # The runs going (shown first) and the newest, then their events from the node's last
        # one then: replaying the event history from 0 read every run kept (tens of thousands
        # of views, hundreds of requests holding the supervisor) before the view caught up.
        going = client.ask(ListRuns(active_only=True, limit=FOLLOWED), RunList)
        newest = client.ask(ListRuns(limit=FOLLOWED), RunList)
        for listed in (going, newest):
            state.apply(listed.runs, 0, host)
        # From the first listing's last event (a run that changed in between is read again);
        # an older node says none: its whole history, as before.
        state.apply([], going.last_seq or 0, host)
        while not stop.is_set():
            batch = client.runs.watch_all(state.last_seq.get(host, 0), wait_s=2.0)
            state.apply(batch.runs, batch.last_seq, host)
    except SubagentsError as err:
        state.fail(host, err.message)
    finally:
        client.close()


@contextlib.contextmanager
def keys() -> Iterator[bool]:
    """cbreak mode on a terminal (so `q` arrives without Enter); yields whether it is one."""
    if not sys.stdin.isatty():
        yield False
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_fleet(client: Client, once: bool = False) -> None:
    state = FleetState()
    listing = client.hosts.listing()
    hosts = [""] if listing is None else [n.name for n in listing.nodes if n.state == "up"]
    if once:
        for part in client.hosts.runs(limit=100):
            state.apply(part.runs, 0, part.host)
            if part.error:
                state.fail(part.host, part.error)
        from rich.console import Console

        # Piped, rich would assume 80 columns and cut every cell; a file gets whole lines.
        console = Console() if sys.stdout.isatty() else Console(width=240)
        frame = live_frame(client, state.snapshot())
        console.print(
            render(frame.runs, time.time(), state.error, frame.recorded, frame.capacity_recorded)
        )
        return
    stop = threading.Event()
    for host in hosts:  # one long-poll per host (each node counts its own events)
        args = (client.address, host, state, stop)
        threading.Thread(target=poll, args=args, daemon=True).start()
    with keys() as interactive, Live(render([], time.time()), auto_refresh=False) as live:
        while not stop.is_set():
            state.changed.clear()
            # Each frame reads the budgets again: nested launches claim without a run event.
            frame = live_frame(client, state.snapshot())
            shown = render(
                frame.runs, time.time(), state.error, frame.recorded, frame.capacity_recorded
            )
            live.update(shown, refresh=True)
            if interactive:
                ready, _, _ = select.select([sys.stdin], [], [], 1.0)
                if ready and sys.stdin.read(1) in ("q", "Q"):
                    stop.set()
            else:
                state.changed.wait(1.0)
