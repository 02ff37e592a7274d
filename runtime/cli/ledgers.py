"""Ledger commands: `capacity`, `budget`, `grant`, and `config show`.

Each is a thin view over the client API; the numbers come from the owners, never from files.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from subagents_node.cli.common import Ctx, emit, json_option, plural, user_errors
from subagents_node.cli.params import COUNT, PATH_TEXT, POSITIVE_COUNT, RUN_ID, SESSION
from subagents_node.cli.terminal import one_line, say
from subagents_node.client.listing import MAX_LISTED, every_run_plan
from subagents_node.launch.config import current_depth, load_config
from subagents_node.messages.capacity import Inspection
from subagents_node.messages.errors import RunNotFound
from subagents_node.messages.supervisor import RunView

if TYPE_CHECKING:
    from subagents_node.client.client import Client


def active_runs(client: Client, session: str) -> tuple[list[RunView], bool]:
    """Every active run of `session`, newest first, and whether the listing's bound cut it."""
    return client.perform(every_run_plan(session, active_only=True))


def _limit_text(limit: int) -> str:
    return "unlimited" if limit == 0 else str(limit)  # R-CFG-2


@click.command()
@click.option(
    "--session",
    type=SESSION,
    help="Session id (default: $SUBAGENTS_SESSION, else this terminal's Unix session).",
)
@click.option("--limit", type=COUNT, help="Session limit to report against (default: config).")
@json_option
@click.pass_obj
@user_errors
def capacity(obj: Ctx, session: str | None, limit: int | None, as_json: bool) -> None:
    """Active async capacity of a session: used/limit and who holds each slot.

    Every holder is named: the session's active runs are read page by page (at most 20,000;
    beyond that the output says it stopped). On a home node, a run on a worker that holds a
    slot is named with its host ("on w1"), from the home's capacity ledger."""
    import os

    from subagents_node.launch.launcher import resolve_session

    session = resolve_session(session, os.environ)
    if limit is None:
        limit = load_config().settings.max_active_async_runs_per_session
    with obj.client() as client:
        snap = client.capacity.snapshot(session, limit=limit)
        going, cut = active_runs(client, session)  # all of them, not the first page only
        active = [r for r in going if r.background]
        holders = [(r, client.capacity.inspect(r.run_id, session)) for r in active]
        # R-CAP-22: a workflow that ended while its children run (async ones, or those its
        # host left when it died) keeps its slot until they end. It is no longer active, but
        # its children are: name it as a holder too.
        listed = {r.run_id for r in active}
        parents = dict.fromkeys(r.parent_run_id for r in going if r.parent_run_id)
        for parent_id in parents:
            if parent_id in listed:
                continue
            try:
                parent = client.runs.show(parent_id)
            except RunNotFound:  # pruned meanwhile: it holds nothing
                continue
            inspection = client.capacity.inspect(parent_id, session)
            if parent.session_id == session and inspection.owner is not None:
                holders.append((parent, inspection))
        # The pool's other slots are held by runs this node does not run (on a home, its
        # workers'): the ledger's records name each with its host, so no worker is asked.
        pool = client.capacity.holders(session)
    listed = {r.run_id for r, _ in holders}
    elsewhere = [(i.owner, i) for i in pool.holders if i.owner and i.owner.run_id not in listed]
    if as_json:
        named = [(r.run_id, i) for r, i in holders] + [(o.run_id, i) for o, i in elsewhere]
        emit(
            {
                "session_id": session,
                "used": snap.used,
                "limit": snap.limit,
                "holders": [
                    {
                        "run_id": run_id,
                        "host": i.owner.host if i.owner else "",
                        **i.model_dump(mode="json"),
                    }
                    for run_id, i in named
                ],
                **({"holders_cut_at": MAX_LISTED} if cut or pool.cut else {}),
                **({"holders_unreadable": pool.unreadable} if pool.unreadable else {}),
            },
            True,
            "",
        )
        return
    lines = [f"Active async capacity: {snap.used}/{_limit_text(snap.limit)} used"]
    for run, inspection in holders:
        lines.append(f"  {run.run_id} {run.state:<8} {_held(inspection)}")
    for owner, inspection in elsewhere:
        # a worker's slot names its host; "on home" would say a fleet where there may be none
        where = f" on {owner.host}" if owner.host else ""
        lines.append(f"  {owner.run_id}{where} {_held(inspection)}")
    if cut:
        lines.append(f"  (only the newest {MAX_LISTED} active runs were listed)")
    if pool.cut:
        lines.append(f"  (only the first {MAX_LISTED} slots of the pool were listed)")
    if pool.unreadable:
        lines.append(f"  ({plural(pool.unreadable, 'slot')} could not be read: quarantined)")
    say("\n".join(lines))


def _held(inspection: Inspection) -> str:
    """A holder's slot and its release verdict, as one line of `capacity` shows them."""
    owner = inspection.owner
    slot = f"slot {owner.slot}, generation {owner.generation}" if owner else "no slot"
    return f"{slot}: {inspection.verdict.verdict} — {inspection.verdict.reason}"


@click.command()
@click.argument("root", type=RUN_ID)
@json_option
@click.pass_obj
@user_errors
def budget(obj: Ctx, root: str, as_json: bool) -> None:
    """The fan-out budget of the run tree ROOT (its root run id, or any run in the tree).

    Every run of the tree is counted (and named, with --json): the listing is read page by
    page (at most 20,000; beyond that the output says it stopped)."""
    with obj.client() as client:
        tree, cut = client.perform(every_run_plan(root_run_id=root))  # every page, not one
        if not tree:
            try:
                tree = [client.runs.show(root)]
            except RunNotFound:
                raise RunNotFound(
                    f"No run tree with root '{root}' and no run with that id.", run_id=root
                ) from None
        first: RunView = tree[-1]
        snap = client.fanout.snapshot(first.fanout_descriptor)
        if first.root_run_id != root:
            tree, cut = client.perform(every_run_plan(root_run_id=first.root_run_id))
    payload = {
        "root_run_id": first.root_run_id,
        **snap.model_dump(mode="json"),
        "runs": [r.run_id for r in tree],
        **({"runs_cut_at": MAX_LISTED} if cut else {}),
    }
    text = (
        f"Run fan-out: {snap.used}/{snap.limit} used, {snap.remaining} remaining\n"
        f"root {first.root_run_id}, {plural(len(tree), 'run')} in the tree; "
        "claims are never released"
    )
    if cut:
        text += f"\n(only the newest {MAX_LISTED} runs of the tree were listed)"
    emit(payload, as_json, text)


@click.command()
@click.option("--session", type=SESSION, required=True, help="The session to grant spawns to.")
@click.argument("additional", type=POSITIVE_COUNT)
@click.option("--yes", is_flag=True, help="Apply without asking for confirmation.")
@json_option
@click.pass_obj
@user_errors
def grant(obj: Ctx, session: str, additional: int, yes: bool, as_json: bool) -> None:
    """Raise a session's spawn budget by ADDITIONAL (only from the root session, R-SPN-6)."""
    authority = load_config().settings.grant_authority

    def confirm(preview: object) -> bool:
        say(getattr(preview, "text", lambda: "")(), err=True)
        return click.confirm("Apply this grant?", err=True)

    with obj.client() as client:
        result = client.session.grant(
            session,
            additional,
            depth=current_depth(),
            authority=authority,
            yes=yes,
            confirm=None if as_json else confirm,
        )
    emit(result, as_json, result.text())
    if not result.applied:
        raise SystemExit(1)


@click.group("config")
def config_group() -> None:
    """Configuration: subagents.toml (project, then user), SUBAGENTS_* variables, flags."""


@config_group.command("show")
@json_option
@click.pass_obj
@user_errors
def config_show(obj: Ctx, as_json: bool) -> None:
    """Print every effective setting and where its value came from."""
    config = load_config(cwd=Path.cwd(), log_warnings=False)
    # The state dir is the one this command uses, not a config file's `state_dir`, which no
    # command reads: `config show` said `none` (or that file's path) where the runs were not.
    rows: list[tuple[str, Any, object]] = [
        (key, str(obj.state_dir), obj.state_origin) if key == "state_dir" else (key, value, origin)
        for key, value, origin in config.rows()
    ]
    unused = config.unused_state_dir()
    warnings = [*config.warnings, *([unused] if unused else [])]
    if as_json:
        settings = config.settings.model_dump(mode="json")
        settings["state_dir"] = str(obj.state_dir)
        emit(
            {
                "settings": settings,
                "sources": {key: str(origin) for key, _, origin in rows},
                "files": [str(f) for f in config.files],
                "warnings": warnings,
            },
            True,
            "",
        )
        return
    width = max(len(key) for key, _, _ in rows)
    for key, value, origin in rows:
        shown = ", ".join(map(str, value)) if isinstance(value, tuple) else value
        shown = "none" if shown is None else shown  # as docs/configuration.md writes it
        # One row per setting, whatever a (cloned repository's) subagents.toml holds.
        say(f"{key:<{width}}  {one_line(str(shown)):<24} {one_line(str(origin))}")
    for warning in warnings:
        say(f"warning: {one_line(warning)}", err=True)


@click.command("debug-run")
@click.argument("run_id", type=RUN_ID)
@click.option("--limit", type=COUNT, help="Session capacity limit (default: config).")
@json_option
@click.pass_obj
@user_errors
def debug_run(obj: Ctx, run_id: str, limit: int | None, as_json: bool) -> None:
    """Why a run does or does not hold capacity: lifecycle, proof, slot owner, verdict.

    Never prints task text, environment values or output (R-DBG-3).
    """
    from subagents_node.cli.debugrun import debug_run as report_for

    if limit is None:
        limit = load_config().settings.max_active_async_runs_per_session
    with obj.client() as client:
        report = report_for(client, run_id, limit)
    emit(report.details, as_json, "\n".join(report.lines))


@click.command()
@click.option(
    "--agents-dir", "agents_dirs", type=PATH_TEXT, multiple=True, help="Extra agents directory."
)
@json_option
@click.pass_obj
@user_errors
def doctor(obj: Ctx, agents_dirs: tuple[str, ...], as_json: bool) -> None:
    """Check the state dir, store, node, config and agent files; exit 1 on any failure."""
    from subagents_node.cli.doctor import render, run_checks
    from subagents_node.messages.constants import VERSION

    checks = run_checks(obj.state_dir, obj.address, Path.cwd(), agents_dirs, VERSION)
    payload = {"checks": [c.__dict__ for c in checks]}
    emit(payload, as_json, "\n".join(render(checks)))
    if any(c.level == "fail" for c in checks):
        raise SystemExit(1)


@click.command()
@click.option("--once", is_flag=True, help="Print one frame and exit (no live refresh).")
@click.option("--json", "as_json", is_flag=True, help="With --once: the runs as JSON.")
@click.pass_obj
@user_errors
def fleet(obj: Ctx, once: bool, as_json: bool) -> None:
    """Live view of sessions and runs (state, elapsed, deadline, gauges, last output); q quits.

    Run ids are never cut. The fan-out gauge is the run tree's budget read live (used/limit,
    nested launches included), the capacity gauge the session's pool read live (one reading
    per session); "(recorded)" marks a figure the run recorded because its budget or its pool
    could not be read. `--once --json` prints the frame's runs for scripts. On a home node:
    the runs of every host that is up, each with its host.
    """
    from subagents_node.cli.fleet import run_fleet

    if as_json and not once:
        raise click.UsageError("--json needs --once (the live view is for a terminal)")
    if not once and not sys.stdout.isatty():
        # A live view redrawn into a pipe or a file never ends and shows nothing useful.
        raise click.UsageError("the live view needs a terminal on stdout; use --once")
    with obj.client() as client:
        client.ping()
        if as_json:
            from subagents_node.client.capacity_views import live_capacity_parts_plan
            from subagents_node.client.fanout_views import live_parts_plan
            from subagents_node.client.hosts import runs_json

            # The budgets' and the pools' live figures, as the view shows them (R-FAN-26).
            parts, recorded = client.perform(live_parts_plan(client.hosts.runs(limit=100)))
            parts, held = client.perform(live_capacity_parts_plan(parts))
            emit(runs_json(parts, recorded, held), True, "")
            return
        run_fleet(client, once=once)


COMMANDS = (capacity, budget, grant, config_group, debug_run, doctor, fleet)
