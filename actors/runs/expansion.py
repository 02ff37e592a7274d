"""Dynamic expansion (R-FAN-21): an `expand` chain step becomes k children, claimed as one batch.

Owns the rules of one expansion: what the step's input is (the previous step's output, or the
file its item declared as `output`), how it splits into items (the elements of a JSON list,
else one item per non-empty line), the children's tasks (`{item}` replaced) and their paths
`chain[i].expand[0..k-1]` (R-FAN-12), and what a restarted node does with a run whose node died
while an expansion's claim was out. Pure apart from reading that output file and the rows it
writes in the supervisor's transaction; the claim itself goes out as the supervisor's call,
whose answer comes back as an `Answer` tick (`Expand` key), so no child starts before every
item is claimed, and none starts when the batch is rejected.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

from subagents_node.actors.runs import admission, runplan, runstore
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.supervisor import ITEM, MAX_EXPAND_ITEMS, ChainStep, TaskItem

#: R-FAN-21's text for a runner that has no descriptor to claim from.
MISSING_DESCRIPTOR = "Async runner is missing its run fan-out budget identity."
EXPANDING = "step.expanding"
EXPANDED = "step.expanded"
INTERRUPTED = "The node restarted before a dynamic step of this chain started; it never will."
#: The most bytes of a previous step's output file an expansion reads.
MAX_INPUT_BYTES = 1 << 20


class ExpansionFailed(Exception):
    """The step cannot materialize (too many items, unreadable input): the run fails."""


def split_items(text: str) -> list[str]:
    """A JSON list gives one item per element (strings as they are, others as JSON); any other
    text gives one item per non-empty line."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            parsed = json.loads(stripped)
        except (ValueError, RecursionError):  # a child's `[[[[…` is no list: its lines are
            parsed = None  # (the RecursionError crashed the run supervisor, and failed it)
        if isinstance(parsed, list):
            return [e if isinstance(e, str) else json.dumps(e) for e in parsed]
    return [line.strip() for line in stripped.splitlines() if line.strip()]


def step_input(live: LiveRun, group: int, cwd: str) -> str:
    """The previous step's output: the file a child declared as `output` when it wrote one,
    else its stdout (parallel steps: joined in order)."""
    parts: list[str] = []
    for earlier in range(group - 1, -1, -1):
        children = live.groups[earlier]
        if not children:
            continue
        for child in children:
            written = _read_output_file(child.item, cwd)
            parts.append(written if written is not None else live.outputs.get(child.index, ""))
        return "\n".join(parts)
    return "\n".join(live.previous_outputs(group))


def _read_output_file(item: TaskItem, cwd: str) -> str | None:
    """The file the child declared as its output, when it is a regular file (None otherwise:
    the step reads the child's stdout). The supervisor reads it on its own loop, so the open
    never blocks: a FIFO (or a device) named `output` would stop every run of the node."""
    if not item.output:
        return None
    base = Path(cwd, item.cwd) if item.cwd else Path(cwd)
    try:
        fd = os.open(base / item.output, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(MAX_INPUT_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def item_task(template: str, item: str) -> str:
    if ITEM in template:
        return template.replace(ITEM, item)
    return f"{template}\n\n{item}"


def plan_expansion(
    live: LiveRun, group: int, step: ChainStep, items: list[str]
) -> list[runplan.ChildPlan]:
    """The step's children, indexed after every child the run already has; ExpansionFailed,
    naming the item, when one could never start (admission's item checks: a NUL in an argv
    task, a task over the task limit once `{item}` is in it, a missing cwd or command)."""
    limit = min(step.max_items or MAX_EXPAND_ITEMS, MAX_EXPAND_ITEMS)
    if len(items) > limit:
        raise ExpansionFailed(
            f"Dynamic step chain[{live.absolute_step(group)}] produced {len(items)} items; "
            f"at most {limit} are allowed."
        )
    template = step.items[0]
    first = max(live.labels, default=-1) + 1
    absolute = live.absolute_step(group)
    plans = []
    for j, text in enumerate(items):
        label = f"chain[{absolute}].expand[{j}]"
        task = item_task(template.task, text)
        item = template.model_copy(update={"task": task})
        plans.append(runplan.ChildPlan(first + j, group, label, label, item))
    assert live.launch is not None  # a dynamic step belongs to a chain this node launched
    try:  # the checks run and append pass: an item that could never start is never claimed
        admission.check_items(live.launch, [(plan.label, plan.item) for plan in plans])
    except SubagentsError as err:
        problem = f"Dynamic step chain[{absolute}] cannot start: {err.message}"
        raise ExpansionFailed(problem) from None
    return plans


def record_expansion(
    db: sqlite3.Connection, live: LiveRun, group: int, plans: list[runplan.ChildPlan]
) -> None:
    """The claimed children become pending rows and the step's group (one transaction)."""
    for child in plans:
        runstore.insert_child(
            db,
            {
                "run_id": live.run_id,
                "idx": child.index,
                "child_id": f"{live.run_id}-{child.index}",
                "step": child.step,
                "label": child.label,
                "agent": child.item.agent.name,
                "state": "pending",
            },
        )
        live.labels[child.index] = child.label
    live.groups[group] = plans


def interrupted(db: sqlite3.Connection, run_id: str) -> bool:
    """After a restart: the node died between an expansion's claim and its children's rows."""
    rows = db.execute(
        "SELECT kind FROM run_events WHERE run_id=? AND kind IN (?, ?) ORDER BY seq DESC LIMIT 1",
        (run_id, EXPANDING, EXPANDED),
    ).fetchall()
    return bool(rows) and rows[0][0] == EXPANDING
