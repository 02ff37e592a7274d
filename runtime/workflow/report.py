"""What a workflow leaves for people and tools: status.json, result.json, the aggregate, the text.

Owns the shapes of the workflow host's files in the workflow's run dir (SPEC R-RUN-4 status,
R-RUN-7 result with per-child entries, R-WF-11 steps) and of its text (R-WF-9: the one-line
summary of a background workflow, the full display text of a foreground one). Every file is
written atomically (a temp file of a fresh name, never opened through what a child put
there, then rename), as UTF-8: a lone surrogate, which a script's
str may hold (`"\\ud83d"`, half of an emoji) and UTF-8 cannot, is written as U+FFFD, as a
decoder shows bytes that are not UTF-8 (`scalar_text`). It never decides an outcome and never
talks to a node; it formats what the host hands it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from subagents_node.workflow.api import Step, WorkflowRuns, to_jsonable

PREVIEW_CHARS = 1000
STATUS_FILE = "status.json"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def scalar_text(text: str) -> str:
    """`text` with each lone surrogate as U+FFFD: what UTF-8 can hold. A lone surrogate in the
    script's value, an emit, a console line or an error used to end the host with a
    UnicodeEncodeError as it wrote result.json: the run failed with the host's traceback, and
    no result.json, a status.json left `running`."""
    return _LONE_SURROGATE.sub("\ufffd", text)


@dataclass
class Outcome:
    """How the script ended: `complete` (it returned), `failed` (it raised, or was ended by
    its deadline) or `stopped` (the workflow was stopped)."""

    state: str = "running"
    value: Any = None
    error: str = ""
    started_at: float = 0.0
    ended_at: float | None = None
    #: The script's traceback when it raised (kept in result.json, not in the run's error).
    traceback: str = ""


def _preview(value: Any) -> str:
    text = json.dumps(to_jsonable(value), ensure_ascii=False)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _trace_line(entry: Mapping[str, Any]) -> str:
    line = f"{entry['event']} {entry['key']} ({entry.get('agent', '?')})"
    if entry.get("runId"):
        line += f" run {entry['runId']}"
    if entry.get("error"):
        line += f": {str(entry['error']).strip().splitlines()[0][:200]}"
    return line


def _headline(outcome: Outcome, runs: WorkflowRuns) -> str:
    if outcome.state == "complete":
        return f"Workflow completed with {len(runs.steps)} child run(s)."
    if outcome.state == "stopped":
        return f"Workflow stopped: {outcome.error}" if outcome.error else "Workflow stopped."
    return f"Workflow failed: {outcome.error}" if outcome.error else "Workflow failed."


def summary_line(outcome: Outcome, runs: WorkflowRuns) -> str:
    """R-WF-9 for a background workflow: the one-line summary, or the error text."""
    if outcome.state != "complete":
        return outcome.error or "Workflow failed."
    emitted = ""
    if runs.emits:
        emitted = f" Emitted: {_preview(runs.emits)}"
    return (
        f"{_headline(outcome, runs)} Return: {_preview(outcome.value)}{emitted} "
        f"Trace: {len(runs.trace)} event(s)."
    )


def display_text(outcome: Outcome, runs: WorkflowRuns) -> str:
    """R-WF-9 for a foreground workflow: value, emits, console and call trace, in full."""
    lines = [_headline(outcome, runs)]
    if outcome.state == "complete":
        lines.append(f"Return: {json.dumps(to_jsonable(outcome.value), ensure_ascii=False)}")
    if runs.emits:
        lines.append("Emitted:")
        lines += [f"  - {json.dumps(to_jsonable(e), ensure_ascii=False)}" for e in runs.emits]
    if runs.console_lines:
        lines.append("Console:")
        lines += [f"  {line}" for line in runs.console_lines]
    lines.append(f"Trace: {len(runs.trace)} event(s)")
    lines += [f"  - {_trace_line(entry)}" for entry in runs.trace]
    return "\n".join(lines)


def step_json(step: Step) -> dict[str, Any]:
    """R-WF-11: the step as debug tools and the capacity verdict read it."""
    data: dict[str, Any] = {
        "workflowKey": step.key,
        "agent": step.agent,
        "status": step.status,
        "async": step.async_,
        "runId": step.run_id,
        "outputPath": str(step.output_path) if step.output_path is not None else None,
    }
    if step.stopped:
        data["stopped"] = True
    if step.error:
        data["error"] = step.error
    if step.source_run_id:  # reused from a resumed workflow's source, or a resume item's
        data["sourceRunId"] = step.source_run_id
    if step.call.resume is not None:
        data["resume"] = True
    return data


def child_json(step: Step) -> dict[str, Any]:
    """R-RUN-7's per-child entry. `outputState` is `present` when the child left its output
    file (or, with no file, printed something), else `absent`."""
    result = step.result
    output = result.output if result is not None else ""
    path = step.output_path
    present = path.is_file() if path is not None else bool(output.strip())
    data: dict[str, Any] = {
        "workflowKey": step.key,
        "agent": step.agent,
        "runId": step.run_id,
        "output": output,
        "outputState": "present" if present else "absent",
        "structuredOutput": None,
        "success": result.success if result is not None else False,
        "state": result.state if result is not None else step.status,
    }
    if path is not None:
        data["artifactPaths"] = {"outputPath": str(path)}
    return data


def status_document(outcome: Outcome, runs: WorkflowRuns, now: float) -> dict[str, Any]:
    """R-RUN-4: the workflow's status as its host sees it (mode workflow, the host's pid)."""
    env = runs.env
    return {
        "runId": env.run_id,
        "sessionId": env.session_id,
        "mode": "workflow",
        "state": outcome.state,
        "pid": os.getpid(),
        "startedAt": outcome.started_at,
        "lastUpdate": now,
        "runFanoutBudget": runs.fanout.model_dump() if runs.fanout is not None else None,
        "steps": [step_json(s) for s in runs.steps.values()],
    }


def result_document(
    outcome: Outcome, runs: WorkflowRuns, summary: str, now: float
) -> dict[str, Any]:
    """R-RUN-7 for a workflow (agent and mode `workflow`), plus the script's own record."""
    env = runs.env
    ended = outcome.ended_at or now
    data: dict[str, Any] = {
        "id": env.run_id,
        "runId": env.run_id,
        "toolCallId": env.run_id,
        "agent": "workflow",
        "mode": "workflow",
        "success": outcome.state == "complete",
        "state": outcome.state,
        "summary": summary,
        "results": [child_json(s) for s in runs.steps.values()],
        "steps": [step_json(s) for s in runs.steps.values()],
        "value": to_jsonable(outcome.value),
        "emits": [to_jsonable(e) for e in runs.emits],
        "console": list(runs.console_lines),
        "trace": list(runs.trace),
        "runFanoutBudget": runs.fanout.model_dump() if runs.fanout is not None else None,
        "aggregateOutput": str(env.aggregate) if env.aggregate is not None else None,
        "asyncDir": str(env.run_dir),
        "cwd": str(env.cwd),
        "sessionId": env.session_id,
        "timestamp": round(now * 1000),
        "durationMs": round((ended - outcome.started_at) * 1000),
    }
    if outcome.state == "complete":
        data["output"] = summary
    else:
        data["error"] = outcome.error or "Workflow failed."
    if outcome.state == "stopped":
        data["stopped"] = True
    if outcome.traceback:
        data["traceback"] = outcome.traceback
    return data


@contextlib.contextmanager
def _replacing(path: Path, mode: int = 0o600) -> Iterator[TextIO]:
    """A text stream whose content replaces `path` once the block ends without an error. It
    writes a temp file of a fresh random name beside `path`, created with O_EXCL and
    O_NOFOLLOW (as messages/statefiles.replace_file does): the fixed `.NAME.tmp` it used was
    opened through whatever was there, and a FIFO a child put in its place (the workflow's run
    dir is the children's too) made the host wait for a reader for good, at its next status
    write; a symlink wrote through it. A failed write leaves no temp file. `mode` is the new
    file's, less the umask."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(6).hex()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        with open(fd, "w", encoding="utf-8") as fh:
            yield fh
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomic replace-write (R-RUN-4); raises OSError for the caller to report."""
    encoder = json.JSONEncoder(indent=2, ensure_ascii=False)
    with _replacing(path) as fh:  # streamed: no whole-document string in memory
        for chunk in encoder.iterencode(data):
            fh.write(scalar_text(chunk))
        fh.write("\n")


def write_aggregate(path: Path, text: str) -> str | None:
    """R-WF-9: the aggregate file; on failure the `Output file error` text, else None."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _replacing(path, 0o666) as fh:  # the user's file: as any file they make
            fh.write(scalar_text(text.rstrip("\n")) + "\n")
    except OSError as exc:
        return f"Output file error: {path}\n{exc.strerror or exc}"
    return None
