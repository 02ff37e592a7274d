"""Task delivery: how one child's command line receives its task (SPEC §0.2, R-EXT-3, R-TSK-1).

Owns the translation of an `AgentPlan` plus a task into argv, a stdin file and a private task
file inside the child's directory. Modes: `argv` substitutes `{task}`; `stdin` feeds exactly
`<System instructions>\\n{prompt}\\n\\n<Task>\\n{task}`; `file` writes a 0600 `task.md` whose path
replaces `{task_file}`; `auto` uses what the command asks for and switches to `file` for tasks
over 8,000 characters. `SUBAGENTS_TASK_DELIVERY=file` forces the file. Other placeholders:
`{python}` (this interpreter), `{agent_dir}`, `{system_prompt_file}`. It never logs the task.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from messages.supervisor import AgentPlan

AUTO_FILE_THRESHOLD = 8000  # R-TSK-1
ENV_TASK_DELIVERY = "SUBAGENTS_TASK_DELIVERY"


@dataclass(frozen=True, slots=True)
class Invocation:
    argv: list[str]
    stdin_path: str | None
    task_file: str | None
    delivery: str


def _private_file(path: Path, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return str(path)


def effective_delivery(agent: AgentPlan, task: str, forced: str | None) -> str:
    if (forced or "").strip().lower() == "file":
        return "file"
    joined = " ".join(agent.command)
    mode = agent.task_delivery
    if mode == "auto":
        if len(task) > AUTO_FILE_THRESHOLD:
            return "file"
        if "{task_file}" in joined:
            return "file"
        return "argv" if "{task}" in joined else "stdin"
    return mode


def prepare_invocation(
    agent: AgentPlan, task: str, child_dir: Path, forced_delivery: str | None = None
) -> Invocation:
    """Write what the child needs into `child_dir` (created 0700) and return its argv."""
    child_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    delivery = effective_delivery(agent, task, forced_delivery)
    values = {"python": sys.executable, "agent_dir": agent.agent_dir or "."}
    if any("{system_prompt_file}" in a for a in agent.command):
        values["system_prompt_file"] = _private_file(
            child_dir / "system.md", agent.system_prompt.strip()
        )
    stdin_path = task_file = None
    if delivery == "file":
        task_file = _private_file(child_dir / "task.md", task)
        values["task_file"] = task_file
    elif delivery == "stdin":
        prompt = f"<System instructions>\n{agent.system_prompt.strip()}\n\n<Task>\n{task}"
        stdin_path = _private_file(child_dir / "stdin.txt", prompt)
    else:
        values["task"] = task
    argv = [_substitute(arg, values) for arg in agent.command]
    if delivery == "file" and not any("{task_file}" in a for a in agent.command):
        argv.append(f"@{task_file}")  # R-TSK-1's `@{path}` form
    elif delivery == "argv" and not any("{task}" in a for a in agent.command):
        argv.append(task)
    if argv[0].startswith("./") and agent.agent_dir:
        argv[0] = str(Path(agent.agent_dir, argv[0]).resolve())
    return Invocation(argv=argv, stdin_path=stdin_path, task_file=task_file, delivery=delivery)


def _substitute(arg: str, values: dict[str, str]) -> str:
    # Placeholder by placeholder, so braces inside the task itself are never interpreted.
    for key in ("python", "agent_dir", "system_prompt_file", "task_file", "task"):
        token = "{" + key + "}"
        if token in arg and key in values:
            arg = arg.replace(token, values[key])
    return arg
