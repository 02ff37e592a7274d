"""Task delivery: one agent + one task -> the child's argv, stdin, task file and environment.

Owns SPEC §0.2's delivery modes (R-EXT-3, R-TSK-1): `argv` substitutes `{task}`; `stdin` feeds
exactly `<System instructions>\n{trimmed prompt}\n\n<Task>\n{task}`; `file` writes a private
(0600) `task.md` whose path replaces `{task_file}` (and `{task}` becomes `@path`, R-TSK-1);
`auto` takes the form the command asks for and switches to `file` for tasks over 8,000
characters; `SUBAGENTS_TASK_DELIVERY=file` forces the file. Also resolves the command (argv[0])
and assembles the child's complete environment.

Placeholders: `{task}`, `{task_file}`, `{system_prompt_file}`, `{agent_dir}`, `{python}` (this
interpreter, so shipped examples are portable). Substitution is a single pass, so a task that
contains `{task_file}` stays literal text. Everything is checked (cwd, command) before any file
is written. It never logs task text (R-MISC-1) and never starts a process.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from subagents_node.messages.constants import (
    ENV_AGENT,
    ENV_CHILD_ID,
    ENV_DEPTH,
    ENV_FANOUT,
    ENV_MAX_DEPTH,
    ENV_NODE,
    ENV_OUTPUT,
    ENV_RUN_ID,
    ENV_SESSION,
    ENV_TASK_DELIVERY,
    ENV_TASK_FILE,
)
from subagents_node.messages.domains import MAX_ARG_BYTES
from subagents_node.messages.errors import (
    AgentCommandNotFound,
    AgentInvalid,
    BadRequest,
    RunCwdMissing,
)

log = logging.getLogger(__name__)

Delivery = Literal["argv", "stdin", "file"]

#: R-TSK-1: `auto` switches to a task file for tasks longer than this many characters.
AUTO_FILE_THRESHOLD = 8000
#: Variables that describe one child only; never inherited from a launcher that is a child.
_PER_CHILD = (ENV_OUTPUT, ENV_TASK_FILE, ENV_AGENT, ENV_FANOUT)

_PLACEHOLDER = re.compile(r"\{(task|task_file|system_prompt_file|agent_dir|python)\}")


class AgentLike(Protocol):
    """What `prepare_invocation` reads: an `Agent`, or the supervisor's `AgentPlan`."""

    @property
    def name(self) -> str: ...
    @property
    def command(self) -> Sequence[str]: ...
    @property
    def task_delivery(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def output(self) -> str | None: ...
    @property
    def system_prompt(self) -> str: ...
    @property
    def agent_dir(self) -> str: ...


@dataclass(frozen=True)
class Invocation:
    """How one child receives its task. `env` holds only what the agent adds; the supervisor
    lays it over the launcher's environment (see `child_environment`)."""

    argv: tuple[str, ...]
    stdin_path: Path | None
    task_file: Path | None
    env: Mapping[str, str]
    cwd: Path
    delivery: Delivery
    output_path: Path | None


def resolve_delivery(
    agent: AgentLike, task: str, environ: Mapping[str, str] | None = None
) -> Delivery:
    """R-TSK-1 and §0.2: SUBAGENTS_TASK_DELIVERY=file forces the file (any other value means
    auto); an explicit agent setting is used as is; `auto` takes the form the command asks for
    ({task} -> argv, {task_file} -> file, neither -> stdin) and switches to file for tasks
    over 8,000 characters."""
    env = os.environ if environ is None else environ
    if env.get(ENV_TASK_DELIVERY, "").strip().lower() == "file":
        return "file"
    if agent.task_delivery in ("argv", "stdin", "file"):
        return agent.task_delivery  # type: ignore[return-value]
    if len(task) > AUTO_FILE_THRESHOLD:
        return "file"
    if any("{task}" in arg for arg in agent.command):
        return "argv"
    if any("{task_file}" in arg for arg in agent.command):
        return "file"
    return "stdin"


def stdin_text(system_prompt: str, task: str) -> str:
    """R-EXT-3: exactly what a stdin-delivered child reads."""
    return f"<System instructions>\n{system_prompt.strip()}\n\n<Task>\n{task}"


def prepare_invocation(
    agent: AgentLike,
    task: str,
    run_dir: Path,
    *,
    cwd: Path | None = None,
    label: str = "",
    environ: Mapping[str, str] | None = None,
) -> Invocation:
    """Check everything first (cwd, command), then write the child's private files (0600) in
    `run_dir` and return its argv. `label` keeps the files of several children apart."""
    env_in = os.environ if environ is None else environ
    workdir = _workdir(agent, cwd)
    delivery = resolve_delivery(agent, task, env_in)
    values = {"python": sys.executable, "agent_dir": agent.agent_dir}
    search_path = agent.env.get("PATH", env_in.get("PATH", os.defpath))
    command0 = _resolve_command(agent, _substitute(agent.command[0], values), search_path)

    prefix = f"{label}." if label else ""
    uses = {m for arg in agent.command for m in _PLACEHOLDER.findall(arg)}
    task_file = stdin_path = None
    # `run_dir` is made only when a file goes in it: a child whose task rides in its argv
    # costs no directory here (its shim makes the one it keeps its records in). A mkdir is a
    # millisecond on a busy disk, and the supervisor prepares children one at a time.
    writes_task = delivery == "file" or "task_file" in uses
    if writes_task or delivery == "stdin" or "system_prompt_file" in uses:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if writes_task:
        task_file = _write_private(run_dir / f"{prefix}task.md", task)
    if delivery == "stdin":
        stdin_path = _write_private(
            run_dir / f"{prefix}stdin.txt", stdin_text(agent.system_prompt, task)
        )
    if "system_prompt_file" in uses:
        prompt = _write_private(run_dir / f"{prefix}system-prompt.md", agent.system_prompt.strip())
        values["system_prompt_file"] = str(prompt)
    values["task_file"] = str(task_file or "")
    values["task"] = {"argv": task, "file": f"@{task_file}", "stdin": ""}[delivery]
    argv = (command0, *(_substitute(arg, values) for arg in agent.command[1:]))

    env = dict(agent.env)
    env[ENV_AGENT] = agent.name
    if task_file is not None:
        env[ENV_TASK_FILE] = str(task_file)
    output_path = workdir / agent.output if agent.output else None
    if output_path is not None:
        env[ENV_OUTPUT] = str(output_path)
    log.debug("agent %s: task of %d characters delivered by %s", agent.name, len(task), delivery)
    return Invocation(argv, stdin_path, task_file, env, workdir, delivery, output_path)


def _substitute(arg: str, values: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), arg)


def _workdir(agent: AgentLike, cwd: Path | None) -> Path:
    base = cwd if cwd is not None else Path.cwd()
    if not _is_dir(base):
        raise BadRequest(
            f"the working directory {base} does not exist", reason="cwd", cwd=str(base)
        )
    own = getattr(agent, "cwd", None)
    if not own:
        return base
    workdir = base / Path(own).expanduser()
    if not _is_dir(workdir):
        raise AgentInvalid.of(
            getattr(agent, "path", agent.agent_dir), f"cwd {workdir} does not exist"
        )
    return workdir


def _is_dir(path: Path) -> bool:
    """`Path.is_dir` that answers False for a path the kernel refuses (too long, no access)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def check_working_directory(path: Path) -> None:
    """RunCwdMissing unless `path` is a directory (checked before admission: a launch's, an
    item's, a workflow member's; nothing is charged for a child that could not start)."""
    try:
        found = path.is_dir()
    except OSError as exc:  # ENAMETOOLONG, EACCES, ...: the caller's path, not our bug
        raise RunCwdMissing(
            f"working directory is not usable: {exc.strerror}", cwd=str(path)[:512]
        ) from None
    except ValueError:  # an embedded NUL: no path the kernel takes
        raise RunCwdMissing(
            "working directory is not usable: it holds a NUL byte", cwd=str(path)[:512]
        ) from None
    if not found:
        raise RunCwdMissing(f"working directory does not exist: {path}", cwd=str(path))


def check_launch_directory(cwd: str) -> None:
    """RunCwdMissing unless a launch's working directory is absolute. A relative one was read
    from the run supervisor's own directory (`/`), not the caller's: `cwd="."` ran the
    children in `/`, and `cwd="src"` was checked as `src/src`. An item's own cwd may be
    relative: it is under the launch's."""
    if not Path(cwd).is_absolute():
        raise RunCwdMissing(
            "working directory is not usable: it is a relative path, and the node's own "
            f"directory is not yours; give it absolute: {cwd[:512]}",
            cwd=cwd[:512],
            field="cwd",
        )


def check_command(agent: AgentLike, environ: Mapping[str, str] | None = None) -> str:
    """The agent's argv[0] resolved, or AgentCommandNotFound (checked before admission)."""
    env_in = os.environ if environ is None else environ
    values = {"python": sys.executable, "agent_dir": agent.agent_dir}
    search_path = agent.env.get("PATH", env_in.get("PATH", os.defpath))
    return _resolve_command(agent, _substitute(agent.command[0], values), search_path)


def argv_task_problem(
    agent: AgentLike, task: str, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why exec(2) would refuse `task` in this agent's argv (None: it would not, or the task
    does not ride in argv). Checked before admission, like the command."""
    if resolve_delivery(agent, task, environ) != "argv":
        return None
    if "\x00" in task:
        return "it contains a NUL character; use task_delivery: file or stdin"
    for arg in agent.command[1:]:
        if "{task}" not in arg:
            continue
        size = len(arg.replace("{task}", task).encode("utf-8", "surrogateescape"))
        if size >= MAX_ARG_BYTES:
            return (
                f"the argument would be {size:,} bytes, over Linux's {MAX_ARG_BYTES - 1:,}; "
                "use task_delivery: file or stdin"
            )
    return None


def _resolve_command(agent: AgentLike, command: str, search_path: str) -> str:
    """argv[0] as an absolute path: `./x` and `dir/x` beside the agent file, bare names on
    PATH (the child's PATH when the agent sets one)."""
    candidate = Path(command).expanduser()
    if not candidate.is_absolute() and "/" not in command:
        found = shutil.which(command, path=search_path)
        if found is None:
            raise AgentCommandNotFound.of(agent.name, command, agent.agent_dir, "not on PATH")
        return found
    if not candidate.is_absolute():
        candidate = Path(agent.agent_dir) / candidate
    try:
        executable = candidate.is_file() and os.access(candidate, os.X_OK)
    except OSError:  # a name the kernel refuses (too long) is no executable either
        executable = False
    if executable:
        return str(candidate)
    raise AgentCommandNotFound.of(
        agent.name, command, candidate, f"no executable file at {candidate}"
    )


def _write_private(path: Path, text: str) -> Path:
    """A file only this user can read (the task may be private), replaced if it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


# -- the child's environment -----------------------------------------------------------------


def child_environment(
    base: Mapping[str, str],
    invocation: Invocation,
    *,
    fanout: bool,
    node_address: str,
    session_id: str,
    run_id: str,
    child_id: str,
    depth: int,
    max_depth: int,
    fanout_descriptor: str | None,
) -> dict[str, str]:
    """The complete environment of one child: the launcher's, then the agent's additions, then
    the node's variables (which an agent cannot override). `depth` and `max_depth` are the
    child's own (R-CFG-8). The fan-out descriptor is passed only to `fanout: true` agents and
    removed for every other child (§0.2, R-FAN-4)."""
    env = dict(base)
    for inherited in _PER_CHILD:  # a nested launcher's own task file is not its child's
        env.pop(inherited, None)
    env.update(invocation.env)
    env.update(
        {
            ENV_NODE: node_address,
            ENV_SESSION: session_id,
            ENV_RUN_ID: run_id,
            ENV_CHILD_ID: child_id,
            ENV_DEPTH: str(depth),
            ENV_MAX_DEPTH: str(max_depth),
        }
    )
    if fanout and fanout_descriptor is not None:
        env[ENV_FANOUT] = fanout_descriptor
    return env
