"""`workflow`: run a Python workflow script under the node (SPEC §12).

    subagents-node workflow SCRIPT.py [--async] [--output PATH] [--session S]
        [--timeout-ms N] [--agents-dir D] [--intercom on|off] [--cwd DIR] [--json]

Builds one `runs.launch` request (mode `workflow`) whose single item is the workflow host
(`python -m subagents_node.workflow.host SCRIPT`, see workflow/host.py); the node starts it as
the run's child and the host admits and launches the script's children. Foreground (the
default) follows the run like `run` does (across a lost node too: the host's shim outlives it
and a node this command starts adopts it) and prints the script's result; `--async` prints the
run id and returns (top-level background workflows hold one `workflow` capacity slot, R-TOP-4).

Defaults: the command is foreground unless `--async` is given, like `run` (SPEC R-CFG-6 makes
the tool call's workflows async by default; a person at a terminal expects to see the result).
The script's timeout (R-TMO-7) is `--timeout-ms`, else the configured `timeout_ms` or 30 min in
the foreground, and none in the background.
"""

from __future__ import annotations

from pathlib import Path

import click

from subagents_node.cli.background import launch_in_background
from subagents_node.cli.common import Ctx, emit, json_option, plural, user_errors
from subagents_node.cli.following import launch_and_follow, summary
from subagents_node.cli.nodestart import node_client
from subagents_node.cli.params import PATH_TEXT, SESSION, TIMEOUT_MS, GivenPath
from subagents_node.cli.terminal import say
from subagents_node.client.client import Client
from subagents_node.client.listing import every_run_plan
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.supervisor import IntercomMode, RunView
from subagents_node.node.inprocess import InProcessTransport
from subagents_node.workflow.launch import RESULT_FILE, workflow_launch, workflow_result


def drain_children(client: Client, run_id: str) -> None:
    """An embedded node ends with this command, and its children with it: background children
    the script left running are awaited first (a running node keeps them going instead)."""
    # Every page: a workflow may leave more children running than one listing holds.
    active = client.perform(every_run_plan(active_only=True, parent_run_id=run_id)).runs
    if active:
        say(
            f"waiting for {plural(len(active), 'background child run')} of workflow {run_id}: this "
            "command's embedded node stops when it returns (start a node to leave them running)",
            err=True,
        )
    for run in active:
        client.runs.wait(run.run_id)


@click.command()
@click.argument("script", type=GivenPath(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--async/--foreground",
    "background",
    default=False,
    help="Run in the background and print the run id (default: foreground).",
)
@click.option(
    "--output",
    type=PATH_TEXT,
    help="Aggregate output file; children default to NAME.KEY.EXT beside it.",
)
@click.option(
    "--session",
    type=SESSION,
    help="Session id (default: $SUBAGENTS_SESSION, else this terminal's Unix session).",
)
@click.option(
    "--timeout-ms",
    type=TIMEOUT_MS,  # out of range: a usage error (exit 2), as every other value
    help="The script's wall-clock limit in milliseconds (1..2147483647).",
)
@click.option(
    "--agents-dir", "agents_dirs", type=PATH_TEXT, multiple=True, help="Extra agents directory."
)
@click.option(
    "--intercom",
    type=click.Choice(["on", "off"]),
    default="on",
    show_default=True,
    help="Whether the workflow's children may message their runs (R-ICB-3).",
)
@click.option("--cwd", type=GivenPath(file_okay=False, path_type=Path), help="Working dir.")
@json_option
@click.pass_obj
@user_errors
def workflow(
    obj: Ctx,
    script: Path,
    background: bool,
    output: str | None,
    session: str | None,
    timeout_ms: int | None,
    agents_dirs: tuple[str, ...],
    intercom: IntercomMode,
    cwd: Path | None,
    as_json: bool,
) -> None:
    """Run the workflow SCRIPT: a Python file defining main(runs)."""
    ctx = LaunchContext.from_environment(cwd=cwd, agents_dirs=agents_dirs, session_id=session)
    launch = workflow_launch(
        ctx,
        script,
        background=background,
        output=output,
        timeout_ms=timeout_ms,
        agents_dirs=agents_dirs,
        intercom=intercom,
    )
    if background:
        with node_client(obj, ctx, background) as client:  # a signal: runtime/cli/background.py
            launch_in_background(lambda: client.runs.launch(launch), as_json, session=False)
        return

    def drained(client: Client, final: RunView) -> None:
        if isinstance(client.transport, InProcessTransport):
            drain_children(client, final.run_id)

    # A lost node loses neither the follow nor the host (its shim outlives the node): a node
    # this command starts adopts it, as for `run`. A named node is never replaced here.
    reconnect = None if obj.address else (lambda: node_client(obj, ctx, False))
    clients = node_client(obj, ctx, background)
    final = launch_and_follow(clients, launch, as_json, drained, reconnect)
    result = workflow_result(final)
    data = {"run": final.model_dump(mode="json"), "result": result}
    where = Path(final.run_dir) / RESULT_FILE
    shown = f"result: {where}" if result is not None else "result: none (the host wrote none)"
    emit(data, as_json, f"{summary(final)}\n{shown}")
    if final.state != "complete":
        raise SystemExit(1)


COMMANDS = (workflow,)
