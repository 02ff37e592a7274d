"""Run-management commands: `resume`, `rerun`, `attach`, `append`, `intercom send` (SPEC §10-13),
and `pause`, `approve`, `reject` (R-RUN-2: interrupt-as-pause and checkpoints).

Each is one request to the RunSupervisor; the rules (what may be resumed, how an append is
claimed, when intercom is off) live in the node, so every client gets the same answers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from subagents_node.cli.background import launch_in_background
from subagents_node.cli.common import Ctx, emit, json_option, user_errors
from subagents_node.cli.following import launch_and_follow, summary
from subagents_node.cli.nodestart import node_client
from subagents_node.cli.params import COUNT, GIVEN_TEXT, PATH_TEXT, RUN_ID, GivenPath
from subagents_node.client.client import Client
from subagents_node.client.launchagain import append as append_once
from subagents_node.client.launchagain import approve as approve_once
from subagents_node.client.launchagain import relaunch, with_launch_id
from subagents_node.launch.config import current_depth, load_config
from subagents_node.launch.environ import carried_environment
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.base import validate_request
from subagents_node.messages.constants import ENV_CHILD_ID, ENV_FANOUT, ENV_RUN_ID
from subagents_node.messages.lineage import Append, Rerun, Resume
from subagents_node.messages.pauses import Approve, Pause, Reject
from subagents_node.messages.supervisor import Intercom, IntercomMessage, RunView


@click.command()
@click.argument("run_id", type=RUN_ID)
@click.option("--message", "-m", default="", help="Follow-up appended to the task.")
@click.option(
    "--intercom",
    type=click.Choice(["on", "off"]),
    default=None,
    help="Whether the relaunch's children may message it (default: as the source was).",
)
@json_option
@click.pass_obj
@user_errors
def resume(obj: Ctx, run_id: str, message: str, intercom: str | None, as_json: bool) -> None:
    """Relaunch finished or paused background run RUN_ID in the background, moving its slot.

    Only background runs can be resumed: a foreground, stopped or still-running run is
    refused (use `rerun` for a foreground one). The resumed run reuses the source's fan-out
    budget without claiming (R-RES-4) and keeps its absolute deadline (R-TMO-8). Run inside
    a run (by a `fanout: true` agent), the resume is nested: it takes no capacity slot (a
    paused source's slot is freed instead of moved, R-TOP-1, R-RES-3) and claims one path,
    `resume[RUN_ID]`, on the caller's own fan-out budget. A run paused
    by `pause` goes on from the interrupted step; one waiting at a checkpoint needs `approve`.
    A failed or complete workflow (background or not) is resumed as a new background workflow
    run of its script: the steps it finished are not run again and nothing it claimed is
    claimed again (R-WF-5, R-FAN-23). The relaunch keeps the source's intercom setting
    unless --intercom gives one (R-RES-7; a workflow keeps its own).
    """
    limit = load_config().settings.max_active_async_runs_per_session
    fields = {
        "run_id": run_id,
        "message": message,
        "depth": current_depth(),
        "capacity_limit": limit,
        "env": carried_environment(os.environ),
        "intercom": intercom,  # R-RES-7: None keeps the source's
        # Inside a run: a nested resume (R-TOP-1), allowed to a `fanout: true` agent (R-FAN-4).
        "inherited_fanout": os.environ.get(ENV_FANOUT, "").strip() or None,
    }
    # Under a launch id, and sent again under it when its answer is lost (a slow node, a node
    # restarted under it): one run, as `run --async` (client/launchagain.py).
    request = with_launch_id(validate_request(Resume, fields))
    with obj.client() as client:  # a signal while it is in flight: runtime/cli/background.py
        launch_in_background(lambda: relaunch(client, request), as_json, session=False)


@click.command()
@click.argument("run_id", type=RUN_ID)
@click.option("--task", "-t", type=GIVEN_TEXT, required=True, help="The new task.")
@click.option(
    "--child", type=COUNT, default=0, show_default=True, help="Which child's parameters to reuse."
)
@json_option
@click.pass_obj
@user_errors
def rerun(obj: Ctx, run_id: str, task: str, child: int, as_json: bool) -> None:
    """Run a run's child again with the same parameters and a new task (foreground).

    A finished run is left as it is. A live foreground run with one child is superseded: it is
    stopped, and `show` links the two (`superseded by rerun` / `rerun of`).
    """
    fields = {
        "run_id": run_id,
        "task": task,
        "child": child,
        "env": carried_environment(os.environ),
    }
    # This command follows the rerun: on a node it embeds (now, or later to take a lost
    # node's place), the rerun's children die with it, should it be killed with -9.
    fields["foreground_pid"] = os.getpid()
    # One launch id for every send, on this node or on the one this command starts in its
    # place (`reconnect`): the rerun it made, never a second one.
    request = with_launch_id(validate_request(Rerun, fields))

    def rerun_once(client: Client) -> RunView:
        return relaunch(client, request, next_node_s=0.0)

    def reconnect() -> contextlib.AbstractContextManager[Client]:
        # Like `run`'s follow: a node this command starts adopts the run from its shims.
        return node_client(obj, LaunchContext.from_environment(), False)

    taken_over = None if obj.address else reconnect  # a named node is never replaced here
    final = launch_and_follow(obj.client(), rerun_once, as_json, reconnect=taken_over)
    emit(final, as_json, summary(final))
    if final.state != "complete":
        raise SystemExit(1)


def steps_file_command(fn: Callable[..., None]) -> click.Command:
    """A command on RUN_ID with a chain TOML's [[steps]] (attach, append): one argument list."""
    decorators = (
        click.command(),
        click.argument("run_id", type=RUN_ID),
        click.argument("steps_file", type=GivenPath(dir_okay=False, path_type=Path)),
        click.option(
            "--agents-dir",
            "agents_dirs",
            type=PATH_TEXT,
            multiple=True,
            help="Extra agents directory.",
        ),
        json_option,
        click.pass_obj,
        user_errors,
    )
    wrapped: Any = fn
    for decorate in reversed(decorators):
        wrapped = decorate(wrapped)
    assert isinstance(wrapped, click.Command)
    return wrapped


@steps_file_command
def attach(
    obj: Ctx, run_id: str, steps_file: Path, agents_dirs: tuple[str, ...], as_json: bool
) -> None:
    """Start a background chain whose step 0 is live background run RUN_ID (R-RES-6).

    The [[steps]] of STEPS_FILE (chain TOML) run once RUN_ID has ended, the first with its
    output as {previous}; if it fails, the chain fails. The chain takes a capacity slot of its
    own (RUN_ID keeps its slot) and a new fan-out budget; a refused launch changes nothing.
    Run inside a run (by a `fanout: true` agent), the chain is nested: it takes no capacity
    slot, and still gets a new fan-out budget (R-TOP-1, R-FAN-10).
    """
    ctx = LaunchContext.from_environment(agents_dirs=agents_dirs)
    chain = ctx.from_file("chain", steps_file, True, None).chain
    fields = {
        "run_id": run_id,
        "attach": chain,
        "depth": current_depth(),
        "capacity_limit": ctx.config.settings.max_active_async_runs_per_session,
        "env": carried_environment(os.environ),
        # Inside a run: a nested attach (R-TOP-1), allowed to a `fanout: true` agent (R-FAN-4).
        "inherited_fanout": os.environ.get(ENV_FANOUT, "").strip() or None,
    }
    # Under a launch id, and sent again under it when its answer is lost (a slow node, a node
    # restarted under it): one run, as `run --async` (client/launchagain.py).
    request = with_launch_id(validate_request(Resume, fields))
    with obj.client() as client:  # a signal while it is in flight: runtime/cli/background.py
        launch_in_background(lambda: relaunch(client, request), as_json, session=False)


@steps_file_command
def append(
    obj: Ctx, run_id: str, steps_file: Path, agents_dirs: tuple[str, ...], as_json: bool
) -> None:
    """Queue the [[steps]] of STEPS_FILE (chain TOML) on running background chain RUN_ID.

    The steps' fan-out claims and the queued append exist together or not at all (R-APP-4).
    """
    ctx = LaunchContext.from_environment(agents_dirs=agents_dirs)
    steps = ctx.from_file("chain", steps_file, True, None).chain
    # Under an append id, sent again under it when its answer is lost: queued once.
    request = validate_request(Append, {"run_id": run_id, "steps": steps})
    with obj.client() as client:
        result = append_once(client, request)
    emit(result, as_json, result.text)


@click.group()
def intercom() -> None:
    """Messages from a child to the run that launched it (R-ICB).

    The run keeps them: `show RUN --json` lists its latest 100 (`intercom`), and its
    events.jsonl has every one (`intercom` events)."""


@intercom.command("send")
@click.argument("text", type=GIVEN_TEXT)
@click.option(
    "--run",
    "run_id",
    type=RUN_ID,
    help="Target run (default: $SUBAGENTS_RUN_ID, this child's run).",
)
@json_option
@click.pass_obj
@user_errors
def intercom_send(obj: Ctx, text: str, run_id: str | None, as_json: bool) -> None:
    """Send TEXT to the parent run; refused when that run has intercom off."""
    target = run_id or os.environ.get(ENV_RUN_ID, "").strip()
    if not target:
        raise click.UsageError("not inside a child: give --run RUN_ID")
    child = os.environ.get(ENV_CHILD_ID, "")
    with obj.client() as client:
        request = validate_request(Intercom, {"run_id": target, "child_id": child, "text": text})
        sent = client.ask(request, IntercomMessage)
    emit(sent, as_json, f"sent to run {sent.run_id}")


@click.command()
@click.argument("run_id", type=RUN_ID)
@json_option
@click.pass_obj
@user_errors
def pause(obj: Ctx, run_id: str, as_json: bool) -> None:
    """Pause running background run RUN_ID: stop its child tree; the run becomes `paused`.

    A paused run holds no process and keeps its capacity slot; `resume RUN_ID` goes on from
    the interrupted step in a new run that takes the slot over (R-RUN-2, R-CAP-18) and keeps
    the source's absolute deadline (R-TMO-8). That deadline keeps counting while the run is
    paused: once it passes, the run fails (timed out) and frees its slot. Prints the run as
    the pause left it (it may still be `running` while its children stop).
    """
    with obj.client() as client:
        run = client.ask(validate_request(Pause, {"run_id": run_id}), RunView)
    emit(run, as_json, f"{run.run_id} {run.state}")


@click.command()
@click.argument("run_id", type=RUN_ID)
@json_option
@click.pass_obj
@user_errors
def approve(obj: Ctx, run_id: str, as_json: bool) -> None:
    """Approve the checkpoint run RUN_ID waits at: the run goes on past it (R-RUN-2).

    Prints the id of the run that goes on: RUN_ID itself, or, when a node restart ended the
    paused execution, a new run that continues after the checkpoint with its slot. Run inside
    a run (by a `fanout: true` agent), that new run is a nested resume: it takes no slot, and
    RUN_ID's slot is freed instead of moved (R-TOP-1, R-RES-3). Should the node be lost
    before it answers, the approve is sent again to the next node, and the run that went on
    is printed (never "not waiting at a checkpoint").
    """
    fields = {
        "run_id": run_id,
        "depth": current_depth(),
        "capacity_limit": load_config().settings.max_active_async_runs_per_session,
        "env": carried_environment(os.environ),
        # A relaunch inside a run is a nested resume (R-TOP-1), allowed to `fanout: true` agents.
        "inherited_fanout": os.environ.get(ENV_FANOUT, "").strip() or None,
    }
    # Under an approve id, sent again under it when its answer is lost (a slow node, a node
    # restarted under it): the run that went on, never "not waiting at a checkpoint".
    request = with_launch_id(validate_request(Approve, fields))
    with obj.client() as client:
        run = approve_once(client, request)
    emit(run, as_json, run.run_id)


@click.command()
@click.argument("run_id", type=RUN_ID)
@click.option("--reason", "-r", default="", help="Why; recorded as the run's error.")
@json_option
@click.pass_obj
@user_errors
def reject(obj: Ctx, run_id: str, reason: str, as_json: bool) -> None:
    """Reject the checkpoint run RUN_ID waits at: the run ends `rejected` (R-RUN-2)."""
    with obj.client() as client:
        request = validate_request(Reject, {"run_id": run_id, "reason": reason})
        run = client.ask(request, RunView)
        # The answer comes as the rejection is taken; the run ends once its tree has.
        run = client.runs.wait(run.run_id, timeout=30)
    emit(run, as_json, f"{run.run_id} {run.state}")


COMMANDS = (resume, rerun, attach, append, intercom, pause, approve, reject)
