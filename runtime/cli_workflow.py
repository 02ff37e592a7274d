"""`workflow`: run a Python workflow script under the node (SPEC §12).

    subagents-node workflow SCRIPT.py [--async] [--output PATH] [--session S]
        [--timeout-ms N] [--agents-dir D] [--intercom on|off] [--cwd DIR] [--json]

Builds one `runs.launch` request (mode `workflow`) whose single item is the workflow host
(`python -m runtime.workflow_host SCRIPT`, see runtime/workflow_host.py); the node starts it as
the run's child and the host admits and launches the script's children. Foreground (the
default) follows the run like `run` does and prints the script's result; `--async` prints the
run id and returns (top-level background workflows hold one `workflow` capacity slot, R-TOP-4).

Defaults: the command is foreground unless `--async` is given, like `run` (SPEC R-CFG-6 makes
the tool call's workflows async by default; a person at a terminal expects to see the result).
The script's timeout (R-TMO-7) is `--timeout-ms`, else the configured `timeout_ms` or 30 min in
the foreground, and none in the background.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from messages.session import InvalidTimeout
from messages.supervisor import AgentPlan, IntercomMode, Launch, RunView, TaskItem
from runtime.cli_common import Ctx, emit, json_option, user_errors
from runtime.cli_runs import follow, node_client, summary
from runtime.client import Client
from runtime.launcher import LaunchContext
from runtime.transport import InProcessTransport
from runtime.workflow_outputs import aggregate_path
from runtime.workflow_report import RESULT_FILE

HOST_MODULE = "runtime.workflow_host"


def workflow_launch(
    ctx: LaunchContext,
    script: Path,
    *,
    background: bool,
    output: str | None = None,
    timeout_ms: int | None = None,
    agents_dirs: tuple[str, ...] = (),
    intercom: IntercomMode = "on",
) -> Launch:
    """The `runs.launch` request of a workflow: its host as the one item, with the aggregate
    output (R-WF-7) as the item's output."""
    if timeout_ms is not None and timeout_ms <= 0:
        raise InvalidTimeout(
            "workflow script timeout must be a positive integer.",
            name="timeout_ms",
            value=repr(timeout_ms),
        )
    command = [sys.executable, "-m", HOST_MODULE, "{task}", "--intercom", intercom]
    for directory in agents_dirs:
        command += ["--agents-dir", str(Path(directory).expanduser().resolve())]
    host = AgentPlan(name="workflow", command=command, task_delivery="argv")
    aggregate = aggregate_path(output, ctx.cwd)
    item = TaskItem(
        agent=host,
        task=str(script.expanduser().resolve()),
        output=str(aggregate) if aggregate is not None else None,
    )
    launch = ctx.launch("workflow", background, items=[item], timeout_ms=timeout_ms)
    return launch.model_copy(update={"intercom": intercom})


def read_result(run: RunView) -> dict[str, Any] | None:
    """The host's result.json (R-RUN-7), or None when it left none (killed, never started)."""
    try:
        data = json.loads((Path(run.run_dir) / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def drain_children(client: Client, run_id: str) -> None:
    """An embedded node ends with this command, and its children with it: background children
    the script left running are awaited first (a running node keeps them going instead)."""
    active = [
        r for r in client.runs.list(active_only=True, limit=1000) if r.parent_run_id == run_id
    ]
    if active:
        click.echo(
            f"waiting for {len(active)} background child run(s) of workflow {run_id}: this "
            "command's embedded node stops when it returns (start a node to leave them running)",
            err=True,
        )
    for run in active:
        client.runs.wait(run.run_id)


@click.command()
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--async/--foreground",
    "background",
    default=False,
    help="Run in the background and print the run id (default: foreground).",
)
@click.option("--output", help="Aggregate output file; children default to NAME.KEY.EXT beside it.")
@click.option("--session", help="Session id (default: $SUBAGENTS_SESSION, else a new one).")
@click.option("--timeout-ms", type=int, help="The script's wall-clock limit in milliseconds.")
@click.option("--agents-dir", "agents_dirs", multiple=True, help="Extra agents directory.")
@click.option(
    "--intercom",
    type=click.Choice(["on", "off"]),
    default="on",
    show_default=True,
    help="Whether the workflow's children may message their runs (R-ICB-3).",
)
@click.option("--cwd", type=click.Path(file_okay=False, path_type=Path), help="Working dir.")
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
    with node_client(obj, ctx, background) as client:
        started = client.runs.launch(launch)
        if background:
            emit(started, as_json, started.run_id)
            return
        final = follow(client, started, as_json)
        if isinstance(client.transport, InProcessTransport):
            drain_children(client, final.run_id)
    result = read_result(final)
    data = {"run": final.model_dump(mode="json"), "result": result}
    emit(data, as_json, f"{summary(final)}\nresult: {Path(final.run_dir) / RESULT_FILE}")
    if final.state != "complete":
        raise SystemExit(1)


COMMANDS = (workflow,)
