"""Workflow output paths: where each child writes, decided before anything is claimed.

Owns SPEC R-WF-7 (the aggregate path, a child's default and resolved output) and R-WF-8 (the
collision check of one admission group against the aggregate, against itself and against the
paths earlier groups claimed). Pure path arithmetic: it never touches the file system and
never talks to a node. There is no configured output base dir in this project, so relative
paths resolve against the workflow cwd (aggregate) or the child's cwd (children).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from subagents_node.messages.errors import WorkflowOutputCollision

#: R-WF-7 / A-9: boolean-ish values name no aggregate file.
_NO_FILE = ("", "true", "false")


def _absolute(path: str | os.PathLike[str], base: Path) -> Path:
    """`path` made absolute against `base`, with `..` and `.` folded (no symlink lookups)."""
    candidate = Path(path).expanduser()
    return Path(os.path.normpath(candidate if candidate.is_absolute() else base / candidate))


def aggregate_path(output: str | None, cwd: Path) -> Path | None:
    """The workflow's own output: a relative path against the workflow cwd; none for
    `true`, `false` or empty (A-9)."""
    if output is None or output.strip().lower() in _NO_FILE:
        return None
    return _absolute(output.strip(), cwd)


def default_output(key: str, aggregate: Path | None, run_dir: Path) -> Path:
    """R-WF-7: `{dir}/{name}.{key}{ext or .md}` beside the aggregate, else
    `{run dir}/outputs/{key}.md` (the run dir is unique per workflow run)."""
    if aggregate is not None:
        return aggregate.parent / f"{aggregate.stem}.{key}{aggregate.suffix or '.md'}"
    return run_dir / "outputs" / f"{key}.md"


def resolve_output(
    output: str | bool | None,
    *,
    key: str,
    agent_output: str | None,
    child_cwd: Path,
    aggregate: Path | None,
    run_dir: Path,
) -> Path | None:
    """R-WF-7: a child's output file, or None for no file.

    Omitted -> the default path; `true` -> the agent's front-matter `output` (the default when
    it has none); `false` -> no file; a string -> that path, relative ones against the child's
    cwd. Every child that writes gets an explicit absolute path, so none inherits the
    workflow's aggregate file.
    """
    if output is None:
        return default_output(key, aggregate, run_dir)
    if output is True or output == "true":
        if not agent_output:
            return default_output(key, aggregate, run_dir)
        return _absolute(agent_output, child_cwd)
    if output is False or output in ("false", ""):
        return None
    assert isinstance(output, str)
    return _absolute(output, child_cwd)


def check_collisions(
    members: Sequence[tuple[str, Path | None]],
    aggregate: Path | None,
    claimed: Mapping[Path, str],
) -> None:
    """R-WF-8: refuse the group if any member writes the aggregate, or a path another member
    of the group or an earlier group writes. Members without a file are exempt."""
    seen = dict(claimed)
    for key, path in members:
        if path is None:
            continue
        if aggregate is not None and path == aggregate:
            raise WorkflowOutputCollision(
                f"Workflow child '{key}' output resolves to the workflow aggregate output path: "
                f"{path}. Use a distinct child output path.",
                key=key,
                path=str(path),
                first="",
            )
        first = seen.get(path)
        if first is not None:
            raise WorkflowOutputCollision(
                f"Workflow children '{first}' and '{key}' resolve output to the same path: "
                f"{path}. Use distinct child output paths.",
                key=key,
                path=str(path),
                first=first,
            )
        seen[path] = key
