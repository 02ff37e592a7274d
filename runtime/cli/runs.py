"""Run commands: `run`, `runs`, `show`, `agents`, and the run half of `stop`.

`run` launches a single agent, or a parallel / chain file. A foreground run is followed to its
end by runtime/cli/following.py (progress, summary, Ctrl-C / SIGTERM / SIGHUP, a node lost on
the way) and exits 0 only when it completed. With no node running, a foreground `run` starts an
embedded node for its own duration (its children reach it through $SUBAGENTS_NODE) and a
background `run --async` starts a detached node first.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click

from subagents_node.cli.background import launch_in_background
from subagents_node.cli.common import (
    Ctx,
    emit,
    json_option,
    lineage,
    user_errors,
)
from subagents_node.cli.following import child_end, launch_and_follow, summary
from subagents_node.cli.nodestart import node_client
from subagents_node.cli.params import (
    AGENT,
    PATH_TEXT,
    RUN_ID,
    SESSION,
    TIMEOUT_MS,
    GivenPath,
    WholeRange,
    given_or_default,
)
from subagents_node.cli.terminal import one_line, say
from subagents_node.client.capacity_views import with_capacity
from subagents_node.client.client import Client
from subagents_node.client.fanout_views import RECORDED, live_fanout_plan
from subagents_node.launch.agents import PROJECT_AGENTS_DIR
from subagents_node.launch.config import load_config
from subagents_node.launch.launcher import LaunchContext, agent_catalog
from subagents_node.messages.capacity import CapacitySnapshot
from subagents_node.messages.delivery import check_working_directory
from subagents_node.messages.errors import (
    AgentCommandNotFound,
    AgentNotFound,
    MembershipRefused,
    OwnerUnavailable,
    RunCwdMissing,
)
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.session import SpawnSnapshot
from subagents_node.messages.supervisor import (
    IntercomMode,
    Launch,
    RunView,
)


@contextlib.contextmanager
def hosted_client(obj: Ctx, host: str) -> Iterator[Client]:
    """A client for worker `host` of the home node this CLI talks to (no node is started).
    A launch the worker refuses for a directory or a command missing there says it was the
    worker's: the same path may well exist on this host."""
    with obj.client() as home:
        client = home.on(host)
    try:
        yield client
    except (RunCwdMissing, AgentCommandNotFound) as err:
        said, end = (err.message[:-1], ".") if err.message.endswith(".") else (err.message, "")
        raise type(err)(f"{said} (on worker {host}){end}", **err.details) from None
    finally:
        client.close()


@click.command()
@click.argument("agent", type=AGENT, required=False)
@click.argument("task", required=False)
@click.option(
    "--parallel",
    "parallel_file",
    type=GivenPath(dir_okay=False, path_type=Path),
    help="Run the [[tasks]] of a TOML file in parallel.",
)
@click.option(
    "--chain",
    "chain_file",
    type=GivenPath(dir_okay=False, path_type=Path),
    help="Run the [[steps]] of a TOML file in order ({previous} = last output).",
)
@click.option(
    "--async/--foreground",
    "background",
    default=None,
    help="Run in the background: print the run id on stdout and the session on stderr "
    "(default: the agent's `async`, else foreground).",
)
@click.option(
    "--session",
    type=SESSION,
    help="Session id (default: $SUBAGENTS_SESSION, else this terminal's Unix session).",
)
@click.option(
    "--timeout-ms",
    type=TIMEOUT_MS,  # out of range: a usage error (exit 2), as every other value
    help="Deadline in milliseconds (1..2147483647).",
)
@click.option(
    "--agents-dir", "agents_dirs", type=PATH_TEXT, multiple=True, help="Extra agents directory."
)
@click.option("--cwd", type=GivenPath(file_okay=False, path_type=Path), help="Working dir.")
@click.option(
    "--intercom",
    type=click.Choice(["on", "off"]),
    default="on",
    show_default=True,
    help="Whether this run's children may message it (R-ICB); for this run only.",
)
@click.option(
    "--on",
    "on_host",
    metavar="NAME",
    callback=given_or_default,  # `--on "$W"` with W unset ran it here, on the home itself
    help="Multi-host: run it on worker NAME of the home node this CLI talks to (its children "
    "get that worker's environment; --cwd, default this directory, must exist there; the "
    "agent is looked up here, not on NAME).",
)
@json_option
@click.pass_obj
@user_errors
def run(
    obj: Ctx,
    agent: str | None,
    task: str | None,
    parallel_file: Path | None,
    chain_file: Path | None,
    background: bool | None,
    session: str | None,
    timeout_ms: int | None,
    agents_dirs: tuple[str, ...],
    cwd: Path | None,
    intercom: IntercomMode,
    on_host: str | None,
    as_json: bool,
) -> None:
    """Launch AGENT with TASK, or a --parallel / --chain file, under the three ledgers.

    A TASK that starts with '-' goes after '--' (`run AGENT -- -TASK`); without it, the TASK is
    read as options.
    """
    files = [f for f in (parallel_file, chain_file) if f is not None]
    if len(files) > 1 or (files and (agent or task)) or (not files and not (agent and task)):
        raise click.UsageError("give AGENT and TASK, or exactly one of --parallel / --chain")
    if cwd is not None and not on_host:
        # Said first: the project's agents are looked up under it, and an agent found only
        # there was "Unknown agent 'X'. Available agents: none." (on a worker, --on, it must
        # exist there, not here).
        check_working_directory(cwd.absolute())
    ctx = LaunchContext.from_environment(cwd=cwd, agents_dirs=agents_dirs, session_id=session)
    launch: Launch
    try:
        if parallel_file is not None:
            launch = ctx.from_file(
                "parallel", parallel_file, bool(background), timeout_ms, intercom
            )
        elif chain_file is not None:
            launch = ctx.from_file("chain", chain_file, bool(background), timeout_ms, intercom)
        else:
            assert agent is not None and task is not None
            launch = ctx.single(agent, task, background, timeout_ms, intercom)
    except AgentNotFound as err:
        if on_host:
            raise _not_found_here(err, on_host, cwd) from None
        raise
    if on_host:
        # This host's environment means nothing on the worker: its node's own is the base.
        launch = launch.model_copy(update={"env": None})
    clients = hosted_client(obj, on_host) if on_host else node_client(obj, ctx, launch.background)
    if launch.background:
        with clients as client:
            # Once sent, the launch is seen through: a signal meanwhile is acted on once the
            # run id is printed (runtime/cli/background.py).
            launch_in_background(lambda: client.runs.launch(launch), as_json, session=True)
        return
    local = not (on_host or obj.address)  # a named node is never replaced by one started here
    reconnect = (lambda: node_client(obj, ctx, False)) if local else None
    final = launch_and_follow(clients, launch, as_json, reconnect=reconnect)
    emit(final, as_json, summary(final))
    if final.state != "complete":
        raise SystemExit(1)


def _not_found_here(err: AgentNotFound, host: str, cwd: Path | None) -> AgentNotFound:
    """An agent unknown to a `run --on HOST`: the agents are looked up where this command runs
    (the run carries their definitions to the worker), which said nothing of it, and a --cwd
    that exists only on the worker was not searched here at all."""
    where = ""
    if cwd is not None and not cwd.absolute().is_dir():
        where = (
            f" --cwd {cwd} does not exist on this host, so its {PROJECT_AGENTS_DIR}/ was not"
            " searched."
        )
    return AgentNotFound(
        f"{err.message} Agents are looked up on this host, not on worker {host} (the run"
        f" carries their definitions there).{where} Name this host's copy of the agent's"
        f" directory with --agents-dir DIR, or run the command on {host} itself.",
        **err.details,
        host=host,
    )


@click.command("runs")
@click.option("--session", type=SESSION, help="Only this session's runs.")
@click.option("--active", is_flag=True, help="Only queued, running or paused runs.")
@click.option(
    "--limit",
    type=WholeRange(1, 1000),
    default=50,
    show_default=True,
    help="At most this many runs, the newest (on a home node: from each host).",
)
@click.option("--wide", is_flag=True, help="Full ids and labels on a terminal too.")
@json_option
@click.pass_obj
@user_errors
def runs_command(
    obj: Ctx, session: str | None, active: bool, limit: int, wide: bool, as_json: bool
) -> None:
    """List runs, newest first: id, state, mode, age, duration, children, session, label.

    On a home node, every host's runs, each with its HOST (a host that cannot be asked is
    named on stderr). Ids and labels are shortened only on a terminal without --wide; piped
    output is never cut. --json gives each run's fan-out figures read live from its budget,
    and its capacity figures read live from its session's pool.
    """
    with obj.client() as client:
        parts = client.hosts.runs(session, active, limit)
        if as_json:  # the table shows no fan-out figures; the JSON shows them live (R-FAN-26)
            from subagents_node.client.capacity_views import live_capacity_parts_plan
            from subagents_node.client.fanout_views import live_parts_plan
            from subagents_node.client.hosts import runs_json

            parts, recorded = client.perform(live_parts_plan(parts))
            parts, held = client.perform(live_capacity_parts_plan(parts))  # one per session
            emit(runs_json(parts, recorded, held), True, "")
            return
    found = [run for part in parts for run in part.runs]
    for part in parts:
        if part.error:
            say(f"host {part.host}: runs not listed ({one_line(part.error)})", err=True)
    if not found:
        say("no runs")
        return
    from subagents_node.cli.tables import runs_table

    say(runs_table(found, time.time(), short=sys.stdout.isatty() and not wide))


@click.command()
@click.argument("run_id", type=RUN_ID)
@json_option
@click.pass_obj
@user_errors
def show(obj: Ctx, run_id: str, as_json: bool) -> None:
    """Show one run (an id or a unique prefix): state, children, outputs, ledgers.

    On a home node, the run may be on any of its hosts; it says which."""
    with obj.client() as client:
        _, found = client.hosts.find(run_id)
        try:
            ledgers: tuple[SpawnSnapshot, CapacitySnapshot] | None = session_status(client, found)
            unknown = ""
        # A worker cut off from its home, or fenced by it (forgotten: its runs stopped, and
        # `show` is where the reason is read), still shows its own run.
        except (OwnerUnavailable, MembershipRefused) as err:
            ledgers, unknown = None, err.message
        live = client.perform(live_fanout_plan([found]))  # R-FAN-26
    found, recorded = live.runs[0], live.recorded.get(found.run_id, "")
    held = ""  # why the run's capacity figures are its record (its pool was not read)
    if found.snapshots.capacity_limit is not None:
        if ledgers is None:
            held = unknown
        else:  # the pool as read for the header, not the figure recorded at admission
            found = with_capacity(found, ledgers[1])
    lines = [
        f"Status target: run {found.run_id}",  # R-STS-1's header, from live snapshots
        *([f"host: {found.host}"] if found.host else []),
    ]
    if ledgers is None:
        lines.append(f"Spawn budget and active async capacity: unknown ({unknown})")
    else:
        lines += [
            ledgers[0].text(),
            f"Active async capacity: {ledgers[1].used}/{ledgers[1].limit or 'unlimited'} used",
        ]
    # R-FAN-26: the record stands in for a budget its owner could not read, and says so.
    note = f"{RECORDED}: {recorded}" if recorded else ""
    lines += [
        summary(found, capacity=False, fanout_note=note),
        f"dir: {found.run_dir}",
        *lineage(found),
    ]
    for child in found.children:
        how = "" if child.state in ("pending", "running") else f" ({child_end(child)})"
        lines.append(f"  {child.label:<24} {child.agent:<16} {child.state}{how}")
    data = {
        **found.model_dump(mode="json"),
        "spawn_budget": ledgers[0].model_dump(mode="json") if ledgers else None,
        "active_async_capacity": ledgers[1].model_dump(mode="json") if ledgers else None,
        **({"ledgers_unknown": unknown} if unknown else {}),
        **({"fanout_recorded": recorded} if recorded else {}),
        **({"capacity_recorded": held} if held else {}),
    }
    emit(data, as_json, "\n".join(lines))


def session_status(client: Client, run: RunView) -> tuple[SpawnSnapshot, CapacitySnapshot]:
    """R-STS-1: the run's session's spawn budget and its capacity pool (a snapshot reconciles
    it), against the limit the run was launched under, else the configured one."""
    limit = run.snapshots.capacity_limit
    if limit is None:
        limit = load_config().settings.max_active_async_runs_per_session
    spawns = client.session.spawn_snapshot(run.session_id)
    return spawns, client.capacity.snapshot(run.session_id, limit)


def stop_run(obj: Ctx, run_id: str, as_json: bool) -> None:
    with obj.client() as home:
        client, found = home.hosts.find(run_id)  # on a home: whichever host it is on
        client.runs.stop(found.run_id)
        final = client.runs.wait(found.run_id, timeout=30)
    emit(final, as_json, f"run {final.run_id} {final.state}")


@click.command()
@click.option(
    "--agents-dir", "agents_dirs", type=PATH_TEXT, multiple=True, help="Extra agents directory."
)
@json_option
@user_errors
def agents(agents_dirs: tuple[str, ...], as_json: bool) -> None:
    """List the agents this directory can launch (explicit > project > user)."""
    catalog = agent_catalog(Path.cwd(), agents_dirs)
    if as_json:
        emit(
            {
                "agents": [
                    {
                        "name": a.name,
                        "description": a.description,
                        "path": str(a.path),
                        "scope": a.scope,
                        "fanout": a.fanout,
                    }
                    for a in catalog.agents.values()
                ],
                "problems": [p.message for p in catalog.problems],
            },
            True,
            "",
        )
        return
    for name in catalog.names():
        agent = catalog.agents[name]
        fan = " [fanout]" if agent.fanout else ""
        # One line per agent, whatever its file's name and description hold.
        say(f"{one_line(name):<20} {agent.scope:<8} {one_line(agent.description)}{fan}")
    for problem in catalog.problems:
        say(f"warning: {one_line(problem.message)}", err=True)
    if not catalog.agents:
        say(
            "no agents found (looked in: "
            + ", ".join(str(d.path) for d in catalog.directories)
            + ")"
        )


COMMANDS = (run, runs_command, show, agents)
__all__ = ["COMMANDS", "TERMINAL_RUN_STATES", "child_end", "stop_run"]
