"""Helpers shared by the example agents (stdlib only): reading the task and the output path.

An agent receives its task in one of the ways the node delivers it (SPEC §0.2, delivery.py):
- argv: the task text is the first positional argument;
- file: the first argument is `@PATH` (R-TSK-1), or `$SUBAGENTS_TASK_FILE` names the file;
- stdin: `<System instructions>\\n...\\n\\n<Task>\\n{task}` (R-EXT-3).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

TASK_MARK = "\n<Task>\n"


def read_task(args: list[str]) -> str:
    """The task text, however it was delivered."""
    if args:
        first = args[0]
        if first.startswith("@") and Path(first[1:]).is_file():
            return Path(first[1:]).read_text(encoding="utf-8")
        return first
    task_file = os.environ.get("SUBAGENTS_TASK_FILE")
    if task_file:
        return Path(task_file).read_text(encoding="utf-8")
    text = sys.stdin.read()
    _, mark, task = text.partition(TASK_MARK)
    return task if mark else text


def parse_fields(task: str, keys: tuple[str, ...]) -> dict[str, str]:
    """`key=value` pairs from a task such as `dir=runtime pattern=TODO|class `.

    A value runs to the next ` key=` (so it may contain spaces) or is quoted ('...' or "...").
    Text before the first key is ignored, so a task may start with prose.
    """
    found = list(re.finditer(r"(?:^|\s)(" + "|".join(map(re.escape, keys)) + r")=", task))
    fields: dict[str, str] = {}
    for i, match in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(task)
        raw = task[match.end() : end]
        if raw[:1] in ("'", '"'):
            fields[match.group(1)] = shlex.split(raw.strip())[0]
        else:
            fields[match.group(1)] = raw.rstrip("\r\n") if i + 1 == len(found) else raw.rstrip()
    return fields


def output_path(args: list[str], default: str) -> Path:
    """`--out PATH`, else `$SUBAGENTS_OUTPUT`, else `default` (relative to the cwd)."""
    if "--out" in args:
        index = args.index("--out")
        if index + 1 < len(args):
            return Path(args[index + 1])
    return Path(os.environ.get("SUBAGENTS_OUTPUT") or default)


def positional(args: list[str]) -> list[str]:
    """The arguments with `--out PATH` removed."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        else:
            out.append(arg)
    return out


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
