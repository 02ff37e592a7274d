"""Agents: Markdown files with YAML front matter, found in agent directories (SPEC §0.2, R-AGT-1).

Owns the agent file format, its validation, and discovery with priority. What an agent and a task
become for one child (argv, stdin, task file, environment) is actors.invocation, re-exported
here: `prepare_invocation(agent, task, run_dir) -> Invocation`.

Front matter (snake_case): `name`, `description` (required), `command` (argv list, or a string
split like a shell would, with no shell; its first item names the program), `task_delivery`
(argv|stdin|file|auto, default auto), `timeout_ms`, `env`, `output` (a path or false),
`fanout`, `async`, `max_subagent_depth`, `cwd`.
Unknown keys are kept as `extras`, with a warning. The body is the system prompt.

Discovery, highest priority first: each `--agents-dir` (earlier wins), the project's
`./.subagents/agents/`, the user's `$XDG_CONFIG_HOME/subagents-node/agents/`; `*.chain.md` files
are not agents. A file that cannot be used is skipped and reported (R-AGT-1) unless asked for by
name, when its AgentInvalid is raised. It never reads task text and never starts a process.
"""

from __future__ import annotations

import datetime
import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from subagents_node.client.files import read_small_file, shown_path
from subagents_node.messages.constants import ENV_TASK_DELIVERY, MAX_TIMEOUT_MS
from subagents_node.messages.delivery import (
    AUTO_FILE_THRESHOLD,
    AgentLike,
    Invocation,
    child_environment,
    prepare_invocation,
    resolve_delivery,
    stdin_text,
)
from subagents_node.messages.domains import (
    MAX_TASK_CHARS,
    Command,
    Depth,
    Environment,
    FsPath,
)
from subagents_node.messages.errors import AgentInvalid, AgentNotFound

log = logging.getLogger(__name__)

TaskDelivery = Literal["argv", "stdin", "file", "auto"]
Scope = Literal["explicit", "project", "user"]

PROJECT_AGENTS_DIR = Path(".subagents") / "agents"

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class _FrontMatter(BaseModel):
    # Strict: YAML gives real types, and `PORT: 8080` must not quietly become "8080". The
    # domain types are the wire's (AgentPlan): what this accepts, a launch can carry.
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True, strict=True)

    name: str = Field(min_length=1, max_length=128, pattern=_NAME)
    description: str = Field(min_length=1)
    command: Command
    task_delivery: TaskDelivery = "auto"
    timeout_ms: int | None = Field(default=None, gt=0, le=MAX_TIMEOUT_MS)
    env: Environment = Field(default_factory=dict)
    output: FsPath | None = None
    fanout: bool = False
    run_async: bool | None = Field(default=None, alias="async")
    max_subagent_depth: Depth | None = None
    cwd: FsPath | None = None

    @field_validator("command", mode="before")
    @classmethod
    def _split_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split the command string: {exc}") from None
        return value

    @field_validator("command")
    @classmethod
    def _names_a_program(cls, value: list[str]) -> list[str]:
        # R-EXT-1: the command is non-empty. A blank argv[0] (an empty templated value) would
        # load as an agent and only fail at each launch as "command '' not found".
        if not value[0].strip():
            raise ValueError("the program (its first item) is empty")
        return value

    @field_validator("output", mode="before")
    @classmethod
    def _false_is_none(cls, value: Any) -> Any:
        if value is False:
            return None
        if value is True:
            raise ValueError("output is a path, or false")
        return value


@dataclass(frozen=True)
class Agent:
    """A validated agent definition. `command` is as written (placeholders unresolved)."""

    name: str
    description: str
    command: tuple[str, ...]
    system_prompt: str
    path: Path
    scope: Scope
    task_delivery: TaskDelivery = "auto"
    timeout_ms: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    output: str | None = None
    fanout: bool = False
    run_async: bool | None = None
    max_subagent_depth: int | None = None
    cwd: str | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def agent_dir(self) -> str:
        return str(self.path.parent)


# -- parsing ---------------------------------------------------------------------------------


def parse_agent(text: str, path: Path, scope: Scope = "explicit") -> Agent:
    """Validate one agent file's text, or raise AgentInvalid naming the file and the reason."""
    try:
        header, body = _split_front_matter(text)
    except ValueError as exc:
        raise AgentInvalid.of(path, str(exc)) from None
    try:
        data = yaml.safe_load(header)
    except yaml.YAMLError as exc:
        problem = _yaml_problem(exc, header)
        raise AgentInvalid.of(path, f"bad YAML front matter: {problem}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise AgentInvalid.of(path, "bad YAML front matter: nested too deeply") from None
    if not isinstance(data, dict):
        raise AgentInvalid.of(path, "the front matter is not a mapping of keys to values")
    try:
        front = _FrontMatter.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "front matter"
        reason = f"{where}: {first['msg']}{_unquoted(first['type'], first['input'])}"
        raise AgentInvalid(
            f"Invalid agent file {path}: {reason}", path=str(path), reason=reason
        ) from None
    _check_delivery(front, path)
    system_prompt = body.strip()
    if len(system_prompt) > MAX_TASK_CHARS:
        raise AgentInvalid.of(
            path,
            f"the body (system prompt) is longer than {MAX_TASK_CHARS:,} characters "
            f"({len(system_prompt):,})",
        )
    extras = dict(front.model_extra or {})
    if extras:
        log.warning(
            "agent %s (%s): unknown keys kept as extras: %s", front.name, path, sorted(extras)
        )
    return Agent(
        name=front.name,
        description=" ".join(front.description.split()),  # one line, as every listing shows it
        command=tuple(front.command),
        system_prompt=system_prompt,
        path=path,
        scope=scope,
        task_delivery=front.task_delivery,
        timeout_ms=front.timeout_ms,
        env=dict(front.env),
        output=front.output,
        fanout=front.fanout,
        run_async=front.run_async,
        max_subagent_depth=front.max_subagent_depth,
        cwd=front.cwd,
        extras=extras,
    )


def load_agent_file(path: Path, scope: Scope = "explicit") -> Agent:
    try:
        text = read_small_file(path).decode("utf-8")
    except OSError as exc:
        raise AgentInvalid.of(path, f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        reason = f"cannot read the file: not UTF-8 text (byte {exc.start})"
        raise AgentInvalid.of(path, reason) from None
    return parse_agent(text, path, scope)


def _split_front_matter(text: str) -> tuple[str, str]:
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise ValueError("no YAML front matter (the file must start with a '---' line)")
    for i in range(1, len(lines)):
        if lines[i].strip() in ("---", "..."):
            return "".join(lines[1:i]), "".join(lines[i + 1 :])
    raise ValueError("the front matter is not closed by a '---' line")


def _unquoted(error: str, value: object) -> str:
    """Why a text field got something else, when YAML read an unquoted value as another
    type (`name: yes` is a boolean, `name: 2024` a number, `name: 2024-06-01` a date)."""
    if error != "string_type":
        return ""
    kinds = ((bool, "a boolean"), ((int, float), "a number"), (datetime.date, "a date"))
    for types, kind in kinds:
        if isinstance(value, types):
            return f" (YAML reads this unquoted value as {kind}: put it in quotes)"
    return ""


def _yaml_problem(exc: yaml.YAMLError, header: str) -> str:
    """What is wrong, on one line, with the file's line number (+2: YAML counts from 0, and the
    file's first line is the opening '---')."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        return f"{exc.problem} (line {exc.problem_mark.line + 2})"
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML refuses: str() is 2 lines
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        line = header[: exc.position].count("\n") + 2
        return f"character #x{code:04x} is not allowed (line {line})"
    return " ".join(str(exc).split())


def _check_delivery(front: _FrontMatter, path: Path) -> None:
    has_task = any("{task}" in arg for arg in front.command)
    if front.task_delivery == "argv" and not has_task:
        raise AgentInvalid.of(path, "task_delivery argv needs a {task} placeholder in command")
    if front.task_delivery == "stdin" and has_task:
        raise AgentInvalid.of(path, "task_delivery stdin cannot use a {task} placeholder")


# -- discovery -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentDirectory:
    path: Path
    scope: Scope


def user_agents_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(base) / "subagents-node" / "agents"


def agent_directories(
    cwd: Path | None = None,
    agents_dirs: Sequence[str | os.PathLike[str]] = (),
    environ: Mapping[str, str] | None = None,
) -> list[AgentDirectory]:
    """The directories searched, highest priority first: explicit > project > user. An explicit
    one given relative is this process's, as any path on a command line is: made absolute here,
    since `{agent_dir}` (its agents' own directory) is substituted into commands run elsewhere
    (`--cwd`); relative, a command `{agent_dir}/tool.sh` was looked for at `agents/agents/`."""
    dirs = [
        AgentDirectory(Path(os.path.abspath(Path(d).expanduser())), "explicit") for d in agents_dirs
    ]
    dirs.append(AgentDirectory((cwd or Path.cwd()) / PROJECT_AGENTS_DIR, "project"))
    dirs.append(AgentDirectory(user_agents_dir(environ), "user"))
    # A directory named twice is searched once, where it ranks highest (its later mention
    # would only be overridden by it): an MCP call naming one directory 20,000 times read its
    # agents 20,000 times (14 s on the server's event loop, every other call waiting) and
    # listed each broken file as many times.
    once: dict[Path, AgentDirectory] = {}
    for directory in dirs:
        once.setdefault(directory.path, directory)
    return list(once.values())


@dataclass(frozen=True)
class AgentCatalog:
    """Every usable agent by name (after priority), and the files that were refused."""

    agents: Mapping[str, Agent]
    problems: tuple[AgentInvalid, ...]
    directories: tuple[AgentDirectory, ...]

    def names(self) -> list[str]:
        return sorted(self.agents)

    def get(self, name: str) -> Agent:
        """The agent called `name`; AgentInvalid when only a broken file answers to that name
        (more useful than "not found"); else AgentNotFound listing the names that exist."""
        agent = self.agents.get(name)
        if agent is not None:
            return agent
        for problem in self.problems:
            if Path(problem.path).name in (f"{name}.md", name):
                raise problem
        raise AgentNotFound.of(name, self.names())


def discover_agents(
    cwd: Path | None = None,
    agents_dirs: Sequence[str | os.PathLike[str]] = (),
    environ: Mapping[str, str] | None = None,
) -> AgentCatalog:
    directories = agent_directories(cwd, agents_dirs, environ)
    agents: dict[str, Agent] = {}
    problems: list[AgentInvalid] = []
    for directory in reversed(directories):  # lowest priority first: later ones override
        try:
            files = _agent_files(directory.path)
        except OSError as exc:  # a name the system refuses: too long, not searchable
            reason = f"agents directory is not usable: {exc.strerror or exc}"
            if directory.scope != "explicit":  # the project's or the user's: not asked for
                log.warning(
                    "skipping %s agents directory %s: %s", directory.scope, directory.path, reason
                )
                continue
            raise _bad_directory(directory.path, reason) from None
        if directory.scope == "explicit" and files is None:
            missing = "is not a directory" if directory.path.exists() else "does not exist"
            raise _bad_directory(directory.path, f"agents directory {missing}")
        found: dict[str, Agent] = {}
        for path in files or ():
            try:
                agent = load_agent_file(path, directory.scope)
            except AgentInvalid as problem:
                log.warning("skipping agent file: %s", problem.message)
                problems.append(problem)
                continue
            if agent.name in found:
                log.warning(
                    "agent %r defined twice in %s; using %s",
                    agent.name,
                    directory.path,
                    found[agent.name].path,
                )
                continue
            found[agent.name] = agent
        agents.update(found)
    return AgentCatalog(agents, tuple(problems), tuple(directories))


def find_agent(
    name: str,
    cwd: Path | None = None,
    agents_dirs: Sequence[str | os.PathLike[str]] = (),
    environ: Mapping[str, str] | None = None,
) -> Agent:
    return discover_agents(cwd, agents_dirs, environ).get(name)


def _agent_files(directory: Path) -> list[Path] | None:
    """The agent files under `directory`; None when it is no directory. An OSError when the
    system refuses to look (pathlib's is_dir() is False for a missing one, raises the rest)."""
    if not directory.is_dir():
        return None
    return sorted(
        p for p in directory.rglob("*.md") if p.is_file() and not p.name.endswith(".chain.md")
    )


def _bad_directory(path: Path, reason: str) -> AgentInvalid:
    """An explicit agents directory that cannot be searched (not "Invalid agent file": a
    directory); its path shown at most 160 characters long."""
    shown = shown_path(path)
    return AgentInvalid(
        f"Invalid agents directory {shown} "
        f"(--agents-dir, SUBAGENTS_AGENT_DIRS or agent_dirs): {reason}",
        path=shown,
        reason=reason,
    )


__all__ = [
    "AUTO_FILE_THRESHOLD",
    "ENV_TASK_DELIVERY",
    "Agent",
    "AgentCatalog",
    "AgentDirectory",
    "AgentLike",
    "Invocation",
    "agent_directories",
    "child_environment",
    "discover_agents",
    "find_agent",
    "load_agent_file",
    "parse_agent",
    "prepare_invocation",
    "resolve_delivery",
    "stdin_text",
    "user_agents_dir",
]
