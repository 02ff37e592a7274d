"""The launcher: turns what a person (or a child agent) asked for into a `Launch` request.

Owns the launcher's side of admission: which session this process acts for, its depth and
maximum depth (R-CFG-8), the fan-out descriptor it inherited (R-FAN-4/8), its configured limits
(runtime.config), and the agents it can see from its own directory (runtime.agents). The node
decides everything else. Parallel and chain runs come from TOML files:

    # parallel.toml                      # chain.toml
    concurrency = 4                      [[steps]]
    [[tasks]]                            agent = "scout"
    agent = "scout"                      task = "dir=runtime pattern=TODO"
    task = "dir=runtime pattern=TODO"    [[steps]]
                                         parallel = [{agent = "a", task = "x {previous}"}]
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from subagents_node.client.arguments import listed
from subagents_node.client.files import load_toml, shown_path
from subagents_node.launch.agents import Agent, AgentCatalog, discover_agents
from subagents_node.launch.config import (
    Configuration,
    current_depth,
    load_config,
    validate_call_timeout,
)
from subagents_node.launch.environ import carried_environment, is_text
from subagents_node.messages.base import Message, schema_error
from subagents_node.messages.constants import ENV_FANOUT, ENV_RUN_ID, ENV_SESSION
from subagents_node.messages.errors import BadRequest, ConfigError, RunCwdMissing, RunFileInvalid
from subagents_node.messages.supervisor import (
    AgentPlan,
    ChainStep,
    IntercomMode,
    Launch,
    RunMode,
    TaskItem,
)

M = TypeVar("M", bound=Message)

#: SPEC §0.1: a parallel file runs at most this many children at once (the Launch domain).
MAX_CONCURRENCY = 64


def terminal_session_id() -> str:
    """SPEC §0.1: the caller's Unix session as a session id, `term-USER-SID-START`.

    Every process started from one terminal (one login shell) shares the session leader, so
    every command typed there shares one session and its limits. The leader's start time (in
    clock ticks since boot, from /proc) keeps a later session that reuses the pid apart; when
    the leader has already exited, `0` stands for it (the kernel keeps a session's id unused
    while any member lives, so the id stays unique among live sessions).
    """
    sid = os.getsid(0)
    try:
        with open(f"/proc/{sid}/stat", "rb") as stat:
            # The command name (field 2) may hold spaces and parentheses: split after it.
            fields = stat.read().rsplit(b")", 1)[1].split()
        start = fields[19].decode()  # field 22, starttime
    except (OSError, IndexError):
        start = "0"
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    return f"term-{user}-{sid}-{start}"


def _expect(value: object, kinds: type | tuple[type, ...], field: str, what: str) -> None:
    """None or of `kinds`, else BadRequest naming `field` (not an AttributeError from deep
    inside)."""
    if value is not None and not isinstance(value, kinds):
        raise BadRequest(
            f"{field} must be {what}, not {type(value).__name__}", reason="argument", field=field
        )


def agent_catalog(
    cwd: Path,
    agents_dirs: Sequence[str | os.PathLike[str]] = (),
    env: Mapping[str, str] | None = None,
    config: Configuration | None = None,
) -> AgentCatalog:
    """The agents a launch from `cwd` can use: `agents_dirs`, then the configuration's
    `agent_dirs` (file or $SUBAGENTS_AGENT_DIRS), then the project's and the user's."""
    env = os.environ if env is None else env
    config = config or load_config(env=env, cwd=cwd)
    return discover_agents(cwd, [*agents_dirs, *config.settings.agent_dirs], env)


def _working_directory(cwd: str | os.PathLike[str] | None) -> Path:
    """`cwd` (else the process's own) made absolute; RunCwdMissing, naming it, when no directory
    can have that name: a NUL byte, or a name the system refuses (a component over 255 bytes,
    a path over 4096, one it may not search). That it exists is checked where a run is
    launched (a launch names its cwd; the node refuses a missing one before any claim)."""
    given = cwd or Path.cwd()
    shown = shown_path(given)
    try:
        where = Path(given).resolve()
    except (ValueError, RuntimeError) as exc:  # an embedded NUL; pathlib's symlink loop
        why = "it holds a NUL byte" if isinstance(exc, ValueError) else "a symbolic link loop"
        raise RunCwdMissing(
            f"working directory is not usable: {why}: {shown}", cwd=shown, field="cwd"
        ) from None
    if not is_text(str(where)):  # a request carries it as text: say so, not "invalid Launch"
        raise RunCwdMissing(
            f"working directory is not usable: its name is not UTF-8 text: {shown!a}",
            cwd=ascii(shown),
            field="cwd",
        )
    try:
        found = os.stat(where)
    except (FileNotFoundError, NotADirectoryError):
        return where  # no such directory (yet): the launch's own check says so
    except OSError as exc:  # ENAMETOOLONG, EACCES, ELOOP: every later look at it would fail
        raise RunCwdMissing(
            f"working directory is not usable: {exc.strerror}: {shown}", cwd=shown, field="cwd"
        ) from None
    if not stat.S_ISDIR(found.st_mode):
        # A file there: the look for its subagents.toml said "cannot read FILE/subagents.toml:
        # Not a directory", a config error about a config file nobody named.
        raise RunCwdMissing(
            f"working directory is not a directory: {shown}", cwd=shown, field="cwd"
        )
    return where


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def resolve_session(session_id: str | None, env: Mapping[str, str]) -> str:
    """`--session`, else $SUBAGENTS_SESSION (children inherit it), else the terminal's. The
    variable is held to `--session`'s rule: an id with a newline would split every listing."""
    given = (session_id or "").strip()
    if given:
        return given
    inherited = env.get(ENV_SESSION, "").strip()
    if inherited and (len(inherited) > 256 or _CONTROL.search(inherited) or not is_text(inherited)):
        raise ConfigError(
            f"${ENV_SESSION} is not a session id (1-256 characters, no control characters): "
            f"{inherited[:80]!a}",
            key="session",
            source=ENV_SESSION,
            reason="value",
        )
    return inherited or terminal_session_id()


@dataclass(frozen=True)
class LaunchContext:
    """What a launch is built from, resolved the way the CLI resolves it: the working dir, the
    environment (session, depth, inherited fan-out budget), the configuration and the agents.

    `LaunchContext.from_environment()` picks everything up from the process (a child agent
    inherits its parent run's budget this way); `single`, `launch` and `from_file` build the
    `Launch` request for a mode. It only builds requests; it never talks to a node.
    """

    cwd: Path
    env: Mapping[str, str]
    config: Configuration
    catalog: AgentCatalog
    session_id: str
    depth: int
    inherited_fanout: str | None
    parent_run_id: str | None

    @classmethod
    def from_environment(
        cls,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        agents_dirs: Sequence[str | os.PathLike[str]] = (),
        session_id: str | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> LaunchContext:
        """Each argument's type is checked first: a wrong one is BadRequest naming it (a
        single directory as `agents_dirs` too: write `[path]`)."""
        dirs = listed(agents_dirs, "agents_dirs", "agent directories")
        _expect(cwd, (str, os.PathLike), "cwd", "a directory path")
        _expect(env, Mapping, "env", "a mapping of environment variables")
        _expect(session_id, str, "session_id", "a string")
        _expect(overrides, Mapping, "overrides", "a mapping of configuration keys")
        env = dict(os.environ if env is None else env)
        where = _working_directory(cwd)
        config = load_config(overrides, env=env, cwd=where)
        session = resolve_session(session_id, env)
        depth = current_depth(env)
        return cls(
            cwd=where,
            env=carried_environment(env),
            config=config,
            catalog=agent_catalog(where, dirs, env, config),
            session_id=session,
            depth=depth,
            inherited_fanout=env.get(ENV_FANOUT, "").strip() or None,
            # Every run's child has depth >= 1; at depth 0 a $SUBAGENTS_RUN_ID is a leftover
            # (exported for `intercom send`, copied from a child's environment). Sent as the
            # parent, it made a background run skip its capacity slot (R-TOP-1), and made every
            # run stop at once when that run had been stopped.
            parent_run_id=(env.get(ENV_RUN_ID, "").strip() or None) if depth > 0 else None,
        )

    def plan(self, name: str) -> AgentPlan:
        return agent_plan(self.catalog.get(name))

    def launch(
        self,
        mode: RunMode,
        background: bool,
        items: Sequence[TaskItem] = (),
        chain: Sequence[ChainStep] = (),
        concurrency: int = 4,
        timeout_ms: int | None = None,
        intercom: IntercomMode = "on",
    ) -> Launch:
        settings = self.config.settings
        # R-TMO-3 as a typed error here: the Launch model would refuse it with a bare
        # ValidationError, which a CLI user would see as a traceback.
        timeout_ms = validate_call_timeout(timeout_ms)
        return _build(
            Launch,
            session_id=self.session_id,
            mode=mode,
            background=background,
            items=listed(items, "items", "TaskItem"),
            chain=listed(chain, "chain", "ChainStep"),
            concurrency=concurrency,
            cwd=str(self.cwd),
            timeout_ms=timeout_ms,
            config_timeout_ms=settings.timeout_ms,
            depth=self.depth,
            max_depth=settings.max_subagent_depth,
            inherited_fanout=self.inherited_fanout,
            parent_run_id=self.parent_run_id,
            capacity_limit=settings.max_active_async_runs_per_session,
            spawns_per_run=settings.max_subagent_spawns_per_run,
            spawns_per_session=settings.max_subagent_spawns_per_session or None,
            env=dict(self.env),
            intercom=intercom,
        )

    def single(
        self,
        agent: str,
        task: str,
        background: bool | None,
        timeout_ms: int | None,
        intercom: IntercomMode = "on",
    ) -> Launch:
        found = self.catalog.get(agent)
        run_async = background if background is not None else bool(found.run_async)  # R-AGT-3
        item = _build(TaskItem, agent=agent_plan(found), task=task, cwd=found.cwd)
        return self.launch(
            "single", run_async, items=[item], timeout_ms=timeout_ms, intercom=intercom
        )

    def from_file(
        self,
        mode: RunMode,
        path: Path,
        background: bool,
        timeout_ms: int | None,
        intercom: IntercomMode = "on",
    ) -> Launch:
        return self.from_mapping(mode, _read_toml(path), background, timeout_ms, intercom, path)

    def from_mapping(
        self,
        mode: RunMode,
        data: Mapping[str, Any],
        background: bool,
        timeout_ms: int | None,
        intercom: IntercomMode = "on",
        path: Path | str = "<request>",
    ) -> Launch:
        """A parallel (`tasks`, `concurrency`) or chain (`steps`) launch from the run file's
        shape already parsed: what `from_file` reads, and what the MCP tools receive. `path`
        names the source in errors."""
        path = Path(path)
        if mode == "parallel":
            tasks = data.get("tasks")
            if not isinstance(tasks, list) or not tasks:
                raise RunFileInvalid(
                    f"{path}: expected one or more [[tasks]] tables", file=str(path)
                )
            _no_other_keys(data, {"tasks", "concurrency"}, mode, path)
            items = [self._item(entry, path) for entry in tasks]
            concurrency = data.get("concurrency", 4)
            if (
                not isinstance(concurrency, int)
                or isinstance(concurrency, bool)
                or not 1 <= concurrency <= MAX_CONCURRENCY
            ):
                raise _bad(path, f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}")
            return self.launch(
                "parallel",
                background,
                items=items,
                concurrency=concurrency,
                timeout_ms=timeout_ms,
                intercom=intercom,
            )
        steps = data.get("steps")
        if not isinstance(steps, list) or not steps:
            raise _bad(path, "expected one or more [[steps]] tables")
        _no_other_keys(data, {"steps"}, mode, path)
        chain = []
        for step in steps:
            if isinstance(step, dict) and "checkpoint" in step:
                chain.append(self._checkpoint(step, path))
            elif isinstance(step, dict) and step.get("expand") is not None:
                chain.append(self._expand(step, path))
            elif isinstance(step, dict) and "parallel" in step:
                group, extra = step["parallel"], set(step) - {"parallel"}
                if extra:
                    raise _bad(path, f"a parallel step has no other keys: {sorted(extra)}")
                if not isinstance(group, list) or not group:
                    raise RunFileInvalid(
                        f"{path}: 'parallel' must be a non-empty list", file=str(path)
                    )
                items = [self._item(e, path) for e in group]
                chain.append(_build(ChainStep, items=items, parallel=True))
            else:
                chain.append(_build(ChainStep, items=[self._item(step, path)]))
        return self.launch(
            "chain", background, chain=chain, timeout_ms=timeout_ms, intercom=intercom
        )

    def _checkpoint(self, step: dict[str, Any], path: Path) -> ChainStep:
        """R-RUN-2: `checkpoint = "note"` (or `true`): the run pauses for approve / reject."""
        note, extra = step["checkpoint"], set(step) - {"checkpoint"}
        if extra:
            raise _bad(path, f"a checkpoint step has no other keys: {sorted(extra)}")
        if note is True:
            note = ""
        if not isinstance(note, str):
            raise _bad(path, "'checkpoint' is a note (a string) or true")
        return _build(ChainStep, kind="checkpoint", note=note)

    def _expand(self, step: dict[str, Any], path: Path) -> ChainStep:
        """R-FAN-21: `expand = true` with agent and task: one child per item of the previous
        step's output (`{item}` in the task); `max_items` bounds them."""
        if step["expand"] is not True:
            raise _bad(path, "'expand' is true or absent")
        max_items = step.get("max_items")
        if max_items is not None and (
            not isinstance(max_items, int) or isinstance(max_items, bool)
        ):
            raise _bad(path, "'max_items' is a positive integer")
        entry = {k: v for k, v in step.items() if k not in ("expand", "max_items")}
        return _build(
            ChainStep, kind="expand", items=[self._item(entry, path)], max_items=max_items
        )

    def _item(self, entry: object, path: Path) -> TaskItem:
        if not isinstance(entry, dict):
            raise RunFileInvalid(
                f"{path}: each task is a table with agent and task", file=str(path)
            )
        agent, task = entry.get("agent"), entry.get("task")
        if not isinstance(agent, str) or not isinstance(task, str):
            raise RunFileInvalid(
                f"{path}: each task needs string 'agent' and 'task'", file=str(path)
            )
        extra = set(entry) - {"agent", "task", "cwd", "output"}
        if extra:
            raise _bad(path, f"unknown keys {sorted(extra)}")
        for key in ("cwd", "output"):  # in the file's words, not the wire model's
            value = entry.get(key)
            if value is not None and not isinstance(value, str):
                raise _bad(path, f"a task's {key!r} is a string, not {value!r}")
        found = self.catalog.get(agent)
        try:
            return _build(
                TaskItem,
                agent=agent_plan(found),
                task=task,
                cwd=entry.get("cwd") or found.cwd,
                output=entry.get("output"),
            )
        except BadRequest as err:  # a value out of its domain (a cwd past PATH_MAX, ...)
            raise _bad(path, f"a task's {err.message.partition(': ')[2]}") from None


def _build(model: type[M], /, **fields: Any) -> M:
    """A wire model from what a person gave: a value out of its domain (a session id from the
    environment, a task over the size cap) is a typed BadRequest naming the field."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise schema_error(model.__name__, exc) from None


def _no_other_keys(data: Mapping[str, Any], known: set[str], mode: str, path: Path) -> None:
    """A typo (`concurency`) or a table of the other mode must not pass silently."""
    extra = set(data) - known
    if extra:
        raise _bad(path, f"unknown keys {sorted(map(str, extra))} in a {mode} run file")


def _bad(path: Path, problem: str) -> RunFileInvalid:
    return RunFileInvalid(f"{path}: {problem}", file=str(path))


def agent_plan(agent: Agent) -> AgentPlan:
    """The wire form of a discovered agent (the parser already holds it to the wire's
    domains; a BadRequest here, never a traceback, if the two ever disagree)."""
    return _build(
        AgentPlan,
        name=agent.name,
        command=list(agent.command),
        task_delivery=agent.task_delivery,
        timeout_ms=agent.timeout_ms,
        env=dict(agent.env),
        output=agent.output,
        fanout=agent.fanout,
        max_subagent_depth=agent.max_subagent_depth,
        system_prompt=agent.system_prompt,
        agent_dir=agent.agent_dir,
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return load_toml(path)
    except OSError as exc:
        raise RunFileInvalid(f"cannot read {path}: {exc.strerror}", file=str(path)) from None
    except ValueError as exc:
        raise RunFileInvalid(f"{path} is {exc}", file=str(path)) from None
