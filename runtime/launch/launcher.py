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
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from subagents_node.launch.agents import Agent, AgentCatalog, discover_agents
from subagents_node.launch.config import (
    Configuration,
    current_depth,
    load_config,
    validate_call_timeout,
)
from subagents_node.messages.constants import ENV_FANOUT, ENV_RUN_ID, ENV_SESSION
from subagents_node.messages.errors import RunFileInvalid
from subagents_node.messages.supervisor import (
    AgentPlan,
    ChainStep,
    IntercomMode,
    Launch,
    RunMode,
    TaskItem,
)


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
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        agents_dirs: Sequence[str | os.PathLike[str]] = (),
        session_id: str | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> LaunchContext:
        env = dict(os.environ if env is None else env)
        cwd = (cwd or Path.cwd()).resolve()
        config = load_config(overrides, env=env, cwd=cwd)
        dirs = [*agents_dirs, *config.settings.agent_dirs]
        session = session_id or env.get(ENV_SESSION, "").strip() or f"cli-{uuid.uuid4().hex[:8]}"
        return cls(
            cwd=cwd,
            env=env,
            config=config,
            catalog=discover_agents(cwd, dirs, env),
            session_id=session,
            depth=current_depth(env),
            inherited_fanout=env.get(ENV_FANOUT, "").strip() or None,
            parent_run_id=env.get(ENV_RUN_ID, "").strip() or None,
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
        return Launch(
            session_id=self.session_id,
            mode=mode,
            background=background,
            items=list(items),
            chain=list(chain),
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
        item = TaskItem(agent=agent_plan(found), task=task, cwd=found.cwd)
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
            items = [self._item(entry, path) for entry in tasks]
            concurrency = data.get("concurrency", 4)
            if not isinstance(concurrency, int) or isinstance(concurrency, bool):
                raise _bad(path, "concurrency must be an integer")
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
        chain = []
        for step in steps:
            if isinstance(step, dict) and "parallel" in step:
                group = step["parallel"]
                if not isinstance(group, list) or not group:
                    raise RunFileInvalid(
                        f"{path}: 'parallel' must be a non-empty list", file=str(path)
                    )
                chain.append(ChainStep(items=[self._item(e, path) for e in group], parallel=True))
            else:
                chain.append(ChainStep(items=[self._item(step, path)]))
        return self.launch(
            "chain", background, chain=chain, timeout_ms=timeout_ms, intercom=intercom
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
        found = self.catalog.get(agent)
        return TaskItem(
            agent=agent_plan(found),
            task=task,
            cwd=entry.get("cwd") or found.cwd,
            output=entry.get("output"),
        )


def _bad(path: Path, problem: str) -> RunFileInvalid:
    return RunFileInvalid(f"{path}: {problem}", file=str(path))


def agent_plan(agent: Agent) -> AgentPlan:
    """The wire form of a discovered agent."""
    return AgentPlan(
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
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise RunFileInvalid(f"cannot read {path}: {exc.strerror}", file=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise RunFileInvalid(f"{path} is not valid TOML: {exc}", file=str(path)) from None
