"""Plain-text tables for people: the `runs` listing, with headers, ages and durations.

Owns column layout only (no colour, no terminal control), so piped output is stable text a
script can cut by whitespace. It never shortens a value unless asked to (`short`, which the
caller sets only on a terminal without --wide). It never talks to a node.
"""

from __future__ import annotations

from collections.abc import Sequence

from subagents_node.cli.common import plural
from subagents_node.cli.terminal import one_line
from subagents_node.messages.supervisor import RunView

#: On a terminal without --wide: ids keep their first 12 characters, labels 30.
_SHORT_ID = 12
_SHORT_LABEL = 30


def span(seconds: float) -> str:
    """A duration for people: `45s`, `12m`, `3h`, `2d` (whole units, rounded down)."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"


def _cut(text: str, width: int, short: bool) -> str:
    text = one_line(text)  # a label from a chain file: one row, whatever it holds
    return text if not short or len(text) <= width else text[: width - 1] + "…"


def runs_table(runs: Sequence[RunView], now: float, short: bool) -> str:
    """One header line and one line per run; AGE counts from creation, DURATION from start."""
    hosts = any(run.host for run in runs)  # a home's view of several hosts: say which
    header: tuple[str, ...] = (
        "RUN",
        "STATE",
        "MODE",
        "AGE",
        "DURATION",
        "CHILDREN",
        "SESSION",
        "LABEL",
    )
    if hosts:
        header = ("HOST", *header)
    rows: list[tuple[str, ...]] = [header]
    for run in runs:
        duration = "-"
        if run.started_at is not None:
            duration = span((run.ended_at or now) - run.started_at)
        rows.append(
            (
                *((run.host or "-",) if hosts else ()),
                _cut(run.run_id, _SHORT_ID, short),
                run.state,
                run.mode,
                span(now - run.created_at),
                duration,
                plural(len(run.children), "child", "children"),
                run.session_id,
                _cut(run.label, _SHORT_LABEL, short),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    )


def pause_text(run: RunView) -> str:
    """R-RUN-2 for people: why a paused run waits and what goes on with it; '' otherwise."""
    if run.state == "paused" and run.paused == "checkpoint":
        note = f": {run.checkpoint_note}" if run.checkpoint_note else ""
        return (
            f"paused at checkpoint chain[{run.paused_step}]{note} "
            f"(approve {run.run_id} / reject {run.run_id} --reason TEXT)"
        )
    if run.state == "paused" and run.mode == "chain":
        return f"paused at chain[{run.paused_step}] (resume {run.run_id} goes on from there)"
    if run.state == "paused":  # one step: a resume runs it again from its start
        again = "its tasks" if run.mode == "parallel" else "its task"
        return f"paused (resume {run.run_id} runs {again} again)"
    if run.resumed_by:
        return f"continued as run {run.resumed_by}"
    return ""


def state_label(run: RunView) -> str:
    """The state column: `paused` says which kind of pause."""
    return f"paused ({run.paused})" if run.state == "paused" and run.paused else run.state
