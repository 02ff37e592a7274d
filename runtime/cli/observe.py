"""Commands that watch runs from a script or a second terminal: `logs` and `wait`.

`logs RUN [--child PATH] [-f]` prints a run's child logs, each line labelled with the child
and the stream (`single stdout | …`); with `-f` it keeps printing lines as they are written
and returns when the run ends; when the node stops or is killed meanwhile (the children and
their logs go on), it waits up to `--node-wait` seconds for the state dir's next node, started
by someone else, and follows on after the last line it printed (exit 3 if none serves by then).
`wait RUN... [--timeout S]` blocks until the runs settle, prints each run's end, and exits 0
if all completed, 1 if any failed, was stopped or was rejected, 124 on timeout; a node lost on
the way is taken over as a foreground run's is, by a node it starts. Both go on through
runtime/cli/following.py's `across_nodes`, and both are fed by node events and inotify
(client/logs.py, `RunsAPI.settle`), never by re-reading files on a timer; the logic lives in
the client, so every client (the MCP server too) gets the same behaviour.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence

import click

from subagents_node.cli.common import (
    EXIT_READER_GONE,
    EXIT_TIMEOUT,
    Ctx,
    emit,
    json_option,
    user_errors,
)
from subagents_node.cli.following import across_nodes
from subagents_node.cli.nodestart import next_node, node_client
from subagents_node.cli.params import RUN_ID, SECONDS
from subagents_node.cli.readerwatch import ReaderGone, ending_when_the_reader_goes
from subagents_node.cli.terminal import one_line, say
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.constants import NODE_BACK_S
from subagents_node.messages.errors import NodeTimeout, SubagentsError
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import RunView


@click.command()
@click.argument("run_id", type=RUN_ID)
@click.option("--child", "child", help="Only this child: its path (`tasks[1]`) or index.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option(
    "--node-wait",
    "node_wait",
    type=SECONDS,
    default=NODE_BACK_S,
    show_default=True,
    help="With -f: how long to wait for the state dir's next node when the node stops or is "
    "killed (this command does not start one).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON Lines: one {child, stream, text} object per log line (none when the "
    "children printed nothing).",
)
@click.pass_obj
@user_errors
def logs(
    obj: Ctx, run_id: str, child: str | None, follow: bool, node_wait: float, as_json: bool
) -> None:
    """Print the stdout and stderr of RUN_ID's children, each line labelled (`-f`: follow).

    With -f, if the state dir's node stops or is killed meanwhile (the children go on), the
    command waits for the next node (`start --detach`) and follows on after the last line it
    printed; exit 3 if none serves within --node-wait seconds.
    """
    import json

    # Here, not at the top: inotify's ctypes would load for every command.
    from subagents_node.client.logs import LogLine, LogsRead

    def show(line: LogLine) -> None:
        if as_json:  # one object per line, so a script can read them as they come
            record = {"child": line.child, "stream": line.stream, "text": line.text}
            click.echo(json.dumps(record))
        else:  # the children's output as they wrote it, as `cat` would (cli/terminal.py;
            # click drops CSI colour codes when stdout is no terminal)
            click.echo(f"{line.child} {line.stream} | {line.text}")

    if not follow:
        waits = click.get_current_context().get_parameter_source("node_wait")
        if waits is click.core.ParameterSource.COMMANDLINE:  # it would have waited for nothing
            raise click.UsageError("--node-wait: only with -f (a follow waits for a next node)")
        with obj.client() as client:
            for line in client.runs.logs(run_id, child=child):
                show(line)
        return
    read = LogsRead()  # a follow taken over on the next node goes on from there

    def following(client: Client) -> None:
        for line in client.runs.logs(run_id, child=child, follow=True, read=read):
            show(line)

    def reconnect() -> contextlib.AbstractContextManager[Client]:
        gone = (
            f"no node served {obj.state_dir} again within {node_wait:g} s: stopped following "
            f"run {run_id}, which goes on (`logs -f {run_id}` again once a node serves)"
        )
        return next_node(obj, node_wait, gone)

    with contextlib.ExitStack() as taken, _quiet_when_the_reader_goes():
        client = taken.enter_context(obj.client())
        client.ping()  # with no node to ask, say so: only a follow that has begun waits
        across_nodes(client, following, f"run {run_id}", None if obj.address else reconnect, taken)


@contextlib.contextmanager
def _quiet_when_the_reader_goes() -> Iterator[None]:
    """A follow (`logs -f`, `wait`) whose reader went away (`| grep -m1 ready`) ends at once,
    exit 141, as its next write would have ended it (cli/readerwatch.py)."""
    try:
        with ending_when_the_reader_goes():
            yield
    except ReaderGone:
        # At once, with no clean-up: the follow was cut short at any point of a request, and
        # closing the client then could wait in zmq's term() for good (1 in 15 `wait | true`
        # hung so). A follow holds nothing a clean-up would save; its node goes on.
        os._exit(EXIT_READER_GONE)


def run_end(run: RunView) -> str:
    if run.state not in TERMINAL_RUN_STATES:
        return f"run {run.run_id} still {run.state}"
    error = f": {one_line(run.error)}" if run.error and run.state != "complete" else ""
    if run.resumed_by and run.state == "stopped" and not error:
        # A paused run that `resume` (or `approve` after a restart) continued: nobody stopped
        # it, its work goes on in that run.
        error = f": continued as run {run.resumed_by}"
    return f"run {run.run_id} {run.state}{error}"


@click.command()
@click.argument("run_ids", type=RUN_ID, nargs=-1, required=True, metavar="RUN_ID...")
@click.option("--timeout", "timeout", type=SECONDS, help="Give up after S seconds (exit 124).")
@json_option
@click.pass_obj
@user_errors
def wait(obj: Ctx, run_ids: tuple[str, ...], timeout: float | None, as_json: bool) -> None:
    """Block until every RUN_ID has ended; print each end (a run named twice, once).

    Exit 0 if all completed, 1 if any failed, was stopped or was rejected, 124 if the timeout
    came first. If the state dir's node stops or is killed meanwhile, the wait starts one,
    which adopts the runs, and goes on (each end is printed once). On a home node, a run may
    be on any of its hosts.
    """
    settled: list[RunView] = []  # the runs ended so far, in the order given (settle's order)
    deadline = None if timeout is None else time.monotonic() + timeout

    def ended(run: RunView) -> None:
        settled.append(run)
        if not as_json:
            say(run_end(run))

    def waiting(client: Client) -> list[RunView]:
        # Taken over on the next node: the runs not yet ended, with what is left of the timeout.
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, rest = settled[:], run_ids[len(settled) :]
        return done + _settled_where_they_run(client, rest, left, ended)

    def reconnect() -> contextlib.AbstractContextManager[Client]:
        return node_client(obj, LaunchContext.from_environment(), False)

    with contextlib.ExitStack() as taken, _quiet_when_the_reader_goes():
        client = taken.enter_context(obj.client())
        client.ping()  # with no node to ask, say so: only a wait that has begun follows on
        # One run named twice (the same id, or a prefix and the id) is waited on and printed
        # once, where it was first named.
        run_ids = tuple(dict.fromkeys(_full_ids(client, run_ids)))
        what = f"run {run_ids[0]}" if len(run_ids) == 1 else "the runs waited on"
        _, views = across_nodes(client, waiting, what, None if obj.address else reconnect, taken)
    pending = [v for v in views if v.state not in TERMINAL_RUN_STATES]
    if as_json:
        emit({"runs": [v.model_dump(mode="json") for v in views]}, True, "")
    else:
        for view in pending:
            say(run_end(view))
    if pending:
        raise SystemExit(EXIT_TIMEOUT)
    if any(v.state != "complete" for v in views):
        raise SystemExit(1)


def _full_ids(client: Client, run_ids: Sequence[str]) -> list[str]:
    """Each run's full id (an id or a unique prefix), found where it runs: on a home, over its
    hosts too (a worker's run is not the home's own to show)."""
    if client.hosts.listing() is None:
        return [client.runs.show(run_id).run_id for run_id in run_ids]
    return [client.hosts.find(run_id)[1].run_id for run_id in run_ids]


def _settled_where_they_run(
    client: Client, run_ids: Sequence[str], timeout: float | None, on_end: Callable[[RunView], None]
) -> list[RunView]:
    """`runs.settle` of `run_ids`, each where it runs: on a home, a worker's run through the
    home, which carries its watches (a partition is waited out, as `run --on` does), the
    home's own there; on any other node, that node's. A home's `wait` of a worker's run used
    to say "Run not found" while `runs` on it listed the run."""
    if not run_ids or client.hosts.listing() is None:
        return client.runs.settle(run_ids, timeout=timeout, on_end=on_end)
    deadline = None if timeout is None else time.monotonic() + timeout
    found = [client.hosts.find(run_id) for run_id in run_ids]  # an unknown id: before any wait
    views: list[RunView] = []
    for i, (on_host, view) in enumerate(found):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            if on_host is client:
                end = client.runs.settle([view.run_id], timeout=left)[0]
            else:
                end = on_host.runs.wait(view.run_id, timeout=left, on_gap=_gap(view))
        except NodeTimeout:
            if deadline is None or time.monotonic() < deadline:
                raise
            end = on_host.runs.show(view.run_id)
        views.append(end)
        if end.state not in TERMINAL_RUN_STATES:  # the deadline came first
            return views + [later for _, later in found[i + 1 :]]
        on_end(end)
    return views


def _gap(view: RunView) -> Callable[[SubagentsError], None]:
    def said(err: SubagentsError) -> None:
        say(
            f"{one_line(err.message)}; still waiting for run {view.run_id} on {view.host}", err=True
        )

    return said


COMMANDS = (logs, wait)
