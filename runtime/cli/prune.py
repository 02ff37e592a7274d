"""`subagents-node prune`: remove finished runs past their retention, now.

Owns the command's arguments and output only; the run supervisor decides what is prunable
(`runs.prune`, actors/runs/retention.py): finished runs whose end is older than the age, never
a run that is still going or has a sub-run still going. The node also applies
`run_retention_days` by itself, on a timer.

    subagents-node prune [--older-than AGE] [--dry-run] [--json]
        runs.prune {older_than_s, dry_run}
"""

from __future__ import annotations

import re

import click

from subagents_node.cli.common import Ctx, emit, json_option, plural, user_errors
from subagents_node.messages.retention import Prune, PruneResult

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_MAX_AGE_S = 100 * 365 * 86_400


class Age(click.ParamType):  # type: ignore[type-arg]  # generic only in click's stubs
    """An age: a number with a unit (`30s`, `15m`, `12h`, `7d`, `2w`), or `0`."""

    name = "AGE"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        # Case matters: `6M` (months, to a reader) must not prune everything past 6 minutes.
        text = str(value).strip()
        match = re.fullmatch(r"(\d{1,9}(?:\.\d{1,6})?)\s*([smhdw]?)", text)
        if match is None or (not match.group(2) and float(match.group(1)) != 0):
            self.fail(
                f"{value!r} is not an age like 30s, 15m, 12h, 7d, 2w or 0 (lower-case units)",
                param,
                ctx,
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
        if seconds > _MAX_AGE_S:
            self.fail(f"{value!r} is longer than 100 years", param, ctx)
        return seconds


@click.command()
@click.option(
    "--older-than",
    type=Age(),
    help="Prune runs that ended longer ago than AGE (default: run_retention_days).",
)
@click.option("--dry-run", is_flag=True, help="List what would be pruned; remove nothing.")
@json_option
@click.pass_obj
@user_errors
def prune(obj: Ctx, older_than: float | None, dry_run: bool, as_json: bool) -> None:
    """Remove finished runs (records and directories) past their retention, and run directories
    that have no record (a refused launch's), untouched for as long and at least 10 minutes.

    On a full disk the directories go first and the records stay (shown with no directory):
    run prune again once there is space to delete them."""
    with obj.client() as client:
        result = client.ask(Prune(older_than_s=older_than, dry_run=dry_run), PruneResult)
    verb = "would prune" if dry_run else "pruned"
    pruned = plural(len(result.pruned), "finished run")
    lines = [f"{verb} {pruned}"] + [f"  {r}" for r in result.pruned]
    if result.records_kept and not result.pruned:
        lines = []  # the one line below says what was done
    if result.orphans:
        lines.append(
            f"{'would remove' if dry_run else 'removed'} "
            f"{plural(len(result.orphans), 'run directory', 'run directories')} that had no record"
        )
        lines += [f"  {name}" for name in result.orphans]
    if result.records_kept:
        lines.append(
            "the disk is full: removed the directories of "
            f"{plural(len(result.records_kept), 'finished run')}; their records stay (shown with "
            "no directory) until prune runs again with space"
        )
        lines += [f"  {r}" for r in result.records_kept]
    if result.more:
        lines.append("more runs are past the cutoff: run prune again")
    emit(result, as_json, "\n".join(lines))


COMMANDS = (prune,)
