"""The launch request of a workflow (SPEC §12, R-WF-7, R-TMO-7): the entry point a program uses
to run a workflow script under a node, and the one the `workflow` command uses.

It only builds the request; it never talks to a node.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages import statefiles
from subagents_node.messages.base import schema_error
from subagents_node.messages.constants import WORKFLOW_RESULT_FILE
from subagents_node.messages.errors import BadRequest, InvalidTimeout
from subagents_node.messages.supervisor import AgentPlan, IntercomMode, Launch, RunView, TaskItem
from subagents_node.workflow.outputs import aggregate_path

#: what the workflow host leaves in the run directory (R-RUN-7)
RESULT_FILE = WORKFLOW_RESULT_FILE

HOST_MODULE = "subagents_node.workflow.host"


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
    script = script.expanduser().resolve()
    if not script.is_file():  # a FIFO would hang the host, a missing file fail it later
        what = "does not exist" if not script.exists() else "is not a regular file"
        raise BadRequest(f"workflow script {script} {what}", field="script", reason="script")
    command = [sys.executable, "-m", HOST_MODULE, "{task}", "--intercom", intercom]
    for directory in agents_dirs:
        command += ["--agents-dir", str(Path(directory).expanduser().resolve())]
    host = AgentPlan(name="workflow", command=command, task_delivery="argv")
    aggregate = aggregate_path(output, ctx.cwd)
    if aggregate is not None:
        _check_aggregate(aggregate)
    try:
        item = TaskItem(
            agent=host,
            task=str(script),
            output=str(aggregate) if aggregate is not None else None,
        )
    except ValidationError as exc:
        raise schema_error("workflow", exc) from None
    launch = ctx.launch("workflow", background, items=[item], timeout_ms=timeout_ms)
    return launch.model_copy(update={"intercom": intercom})


def _check_aggregate(path: Path) -> None:
    """An aggregate path that can never be written is refused before the launch: the script
    would run to its end and only then report an `Output file error` (R-WF-9)."""
    problem = ""
    if not path.name:
        problem = "names no file"
    elif path.is_dir():
        problem = "is a directory; name a file"
    else:
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            problem = f"cannot be created: {parent} is not a directory"
    if problem:
        raise BadRequest(f"--output {path} {problem}", field="output", reason="output")


def workflow_result(run: RunView) -> dict[str, Any] | None:
    """The host's result.json (R-RUN-7), or None when it left none (killed, never started)."""
    try:
        # A regular file only, never through a symlink (messages/statefiles.py): a host killed
        # before it wrote one leaves whatever a child put there, and a FIFO made the foreground
        # `workflow` command wait for a writer for good after its run ended.
        data = json.loads(statefiles.read_file(Path(run.run_dir) / RESULT_FILE).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
