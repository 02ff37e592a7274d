"""The launcher's operations as MCP tools: what each tool does with its arguments.

Owns the mapping from a tool call to client calls and back to text a model reads (plus the
same facts as structured content). Every launch is built by `LaunchContext`, exactly as the
CLI builds it, and sent through `AsyncClient` (the `Client` API for asyncio), so a call the MCP
client cancels stops waiting at once; the ledgers' decisions are the node's. A foreground run
whose call is cancelled is stopped, as Ctrl-C stops a foreground `subagents-node run`, and
carries the server's pid: on a node the server embeds, its children end with the server should
it be killed with -9 (actors/runs/binding.py).
Refusals are not handled here: they propagate as `SubagentsError` and the server turns each
into a tool error carrying the ledger's message.

It must never decide admission, read a ledger's store, or launch a process itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from subagents_node.client.aio import AsyncClient
from subagents_node.client.fanout_views import RECORDED, live_fanout_plan
from subagents_node.client.nodewait import node_lost
from subagents_node.launch.agents import discover_agents
from subagents_node.launch.config import current_depth
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages import statefiles
from subagents_node.messages.constants import ENV_FANOUT
from subagents_node.messages.errors import BadRequest, NodeNotRunning, NodeTimeout
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import IntercomMode, Launch, RunView

#: The most log bytes one `logs` call returns per stream (a model's context is not a pager).
MAX_LOG_BYTES = 64_000
#: The most log bytes one `logs` answer holds over every child: a run of hundreds of children
#: (an expand step) answered tens of MB. Children past it are left out whole, and named.
MAX_LOGS_TOTAL = 256_000
#: How many lost nodes a foreground run's call follows its run across (as a workflow's calls).
MAX_NODE_LOSSES = 3
#: How long `stop` waits for the run's process groups to end before answering.
STOP_WAIT_S = 30.0


@dataclass(frozen=True)
class ToolAnswer:
    """What a tool returns: the text the model reads and the same facts as JSON."""

    text: str
    data: dict[str, Any]


@dataclass(frozen=True)
class LauncherTools:
    """The tools of one MCP server process, bound to its node client.

    `session_id` is fixed when the server starts (from the environment, as the CLI resolves
    it), so every launch of one agent session counts against one session's ledgers.
    `env` is the server's environment: an agent child that started it passes on its run
    tree's budget, depth and session through it.
    """

    client: AsyncClient
    session_id: str
    env: Mapping[str, str]
    agents_dirs: tuple[str, ...] = ()
    cwd: Path | None = None

    def context(self, agents_dirs: Sequence[str] = (), cwd: str | None = None) -> LaunchContext:
        return LaunchContext.from_environment(
            cwd=Path(cwd) if cwd else self.cwd,
            env=self.env,
            agents_dirs=[*self.agents_dirs, *agents_dirs],
            session_id=self.session_id,
        )

    # -- tools ---------------------------------------------------------------------------------

    async def agents(self, agents_dirs: Sequence[str] = ()) -> ToolAnswer:
        catalog = discover_agents(
            self.cwd or Path.cwd(), [*self.agents_dirs, *agents_dirs], self.env
        )
        found = [
            {"name": a.name, "description": a.description, "scope": a.scope, "fanout": a.fanout}
            for a in (catalog.agents[name] for name in catalog.names())
        ]
        lines = [
            f"{a['name']}: {a['description']}" + (" [may launch sub-agents]" if a["fanout"] else "")
            for a in found
        ]
        lines += [f"warning: {p.message}" for p in catalog.problems]
        if not found:
            searched = ", ".join(str(d.path) for d in catalog.directories)
            lines.append(f"no agents found (looked in: {searched})")
        problems = [p.message for p in catalog.problems]
        return ToolAnswer("\n".join(lines), {"agents": found, "problems": problems})

    async def run(
        self,
        agent: str | None,
        task: str | None,
        tasks: Sequence[Mapping[str, Any]],
        chain: Sequence[Mapping[str, Any]],
        concurrency: int,
        background: bool | None,
        timeout_ms: int | None,
        intercom: IntercomMode,
        agents_dirs: Sequence[str],
        cwd: str | None,
    ) -> ToolAnswer:
        launch = self._launch(
            agent,
            task,
            tasks,
            chain,
            concurrency,
            background,
            timeout_ms,
            intercom,
            agents_dirs,
            cwd,
        )
        if not launch.background:  # followed here: on the node this server embeds, its children
            launch = launch.model_copy(update={"foreground_pid": os.getpid()})  # end with it
        # Shielded: a cancel that came while the launch was on its way would leave a started
        # run nobody stops; once it is known, the next await (the wait) takes the cancel.
        with anyio.CancelScope(shield=True):
            started = await self.client.runs.launch(launch)
        if launch.background:
            text = (
                f"run {started.run_id} started in the background "
                f"({started.mode}, session {started.session_id}); "
                "follow it with the wait and logs tools"
            )
            return ToolAnswer(f"{fanout_line(started)}\n{text}", run_data(started))
        try:
            final = await self._follow(started.run_id)
        except anyio.get_cancelled_exc_class():
            # The MCP client gave up on a foreground run (its user interrupted it): stop the
            # run, as Ctrl-C does for the CLI, instead of leaving it running unowned.
            with anyio.CancelScope(shield=True):
                await self.client.runs.stop(started.run_id)
            raise
        return ToolAnswer(summary(final), run_data(final))

    async def status(self) -> ToolAnswer:
        pong = await self.client.ping()
        node = await self.client.status()
        config = self.context().config.settings
        spawns = await self.client.session.spawn_snapshot(self.session_id)
        capacity = await self.client.capacity.snapshot(
            self.session_id, config.max_active_async_runs_per_session
        )
        lines = [
            f"node {pong.node_id} (pid {pong.pid}, v{pong.version}) at {self.client.address}",
            f"session {self.session_id}, depth {current_depth(self.env)}",
            spawns.text(),
            f"Active async capacity: {capacity.used}/{capacity.limit or 'unlimited'} used",
        ]
        data: dict[str, Any] = {
            "node": node.model_dump(mode="json"),
            "session_id": self.session_id,
            "depth": current_depth(self.env),
            "spawn_budget": spawns.model_dump(mode="json"),
            "active_async_capacity": capacity.model_dump(mode="json"),
        }
        inherited = self.env.get(ENV_FANOUT, "").strip()
        if inherited:  # this server runs inside a run tree: its launches draw on that budget
            fanout = await self.client.fanout.snapshot(inherited)
            lines.append(f"{fanout.text} (this run tree)")
            data["run_fanout"] = fanout.model_dump(mode="json")
        return ToolAnswer("\n".join(lines), data)

    async def logs(self, run_id: str, child: int | None, max_bytes: int) -> ToolAnswer:
        if not 1 <= max_bytes <= MAX_LOG_BYTES:
            raise BadRequest(f"max_bytes must be 1..{MAX_LOG_BYTES}", field="max_bytes")
        run = await self.client.runs.show(run_id)
        children = run.children
        if child is not None:
            if not 0 <= child < len(children):
                raise BadRequest(
                    f"run {run.run_id} has no child {child} (it has {len(children)})",
                    field="child",
                )
            children = [children[child]]
        sections: list[str] = []
        data: list[dict[str, Any]] = []
        left_out: list[int] = []
        room = MAX_LOGS_TOTAL
        for view in children:
            if left_out:  # the children after one left out are left out too: a range to ask
                left_out.append(view.index)
                continue
            entry: dict[str, Any] = {"index": view.index, "label": view.label, "state": view.state}
            shown: list[str] = []
            size = 0
            for stream, path in (("stdout", view.stdout_path), ("stderr", view.stderr_path)):
                text, cut = read_tail(path, max_bytes)
                size += len(text.encode("utf-8", "replace"))
                entry[stream] = text
                entry[f"{stream}_truncated"] = cut
                head = f"== child {view.index} {view.label} ({view.agent}) {stream}"
                head += f" (last {max_bytes} bytes)" if cut else ""
                shown.append(f"{head} ==\n{text.rstrip()}" if text else f"{head} == (empty)")
            if data and size > room:  # the first child is always shown (2 x MAX_LOG_BYTES fit)
                left_out.append(view.index)
                continue
            room -= size
            sections.extend(shown)
            data.append(entry)
        if left_out:
            sections.append(
                f"== children {left_out[0]} to {left_out[-1]} left out: an answer holds at most "
                f"{MAX_LOGS_TOTAL} bytes of logs; ask for one with child=INDEX, or a smaller "
                "max_bytes =="
            )
        header = f"run {run.run_id} {run.state}"
        answer = {"run_id": run.run_id, "children": data, "left_out": left_out}
        return ToolAnswer("\n".join([header, *sections]), answer)

    async def wait(self, run_id: str, timeout_s: float) -> ToolAnswer:
        try:
            final = await self.client.runs.wait(run_id, timeout=timeout_s)
        except NodeTimeout:
            # Not a failure of the tool: the run is simply not over yet.
            view = await self.client.runs.show(run_id)
            if view.state in TERMINAL_RUN_STATES:
                return ToolAnswer(summary(view), run_data(view))
            # Still going: its children's nested launches claim as it runs (R-FAN-26).
            view, recorded = await self._live(view)
            text = f"run {view.run_id} is still {view.state} after {timeout_s:g}s"
            return ToolAnswer(text, {**run_data(view, recorded), "timed_out": True})
        return ToolAnswer(summary(final), {**run_data(final), "timed_out": False})

    async def stop(self, run_id: str) -> ToolAnswer:
        await self.client.runs.stop(run_id)
        final = await self.client.runs.wait(run_id, timeout=STOP_WAIT_S)
        return ToolAnswer(f"run {final.run_id} {final.state}", run_data(final))

    async def resume(self, run_id: str, message: str) -> ToolAnswer:
        ctx = self.context()
        run = await self.client.runs.resume(  # one run, even when its answer is lost
            run_id,
            message,
            depth=ctx.depth,
            capacity_limit=ctx.config.settings.max_active_async_runs_per_session,
            env=dict(self.env),
            inherited_fanout=ctx.inherited_fanout,  # inside a run: nested (R-TOP-1, R-FAN-4)
        )
        text = f"run {run.run_id} resumes {run_id} in the background"
        return ToolAnswer(f"{fanout_line(run)}\n{text}", run_data(run))

    async def attach(
        self, run_id: str, steps: Sequence[Mapping[str, Any]], agents_dirs: Sequence[str]
    ) -> ToolAnswer:
        """R-RES-6: a background chain whose step 0 is live background run `run_id`."""
        ctx = self.context(agents_dirs)
        chain = ctx.from_mapping("chain", {"steps": list(steps)}, True, None, path="steps").chain
        run = await self.client.runs.attach(
            run_id,
            chain,
            capacity_limit=ctx.config.settings.max_active_async_runs_per_session,
            depth=ctx.depth,
            env=dict(self.env),
            inherited_fanout=ctx.inherited_fanout,  # inside a run: nested (R-TOP-1, R-FAN-4)
        )
        text = f"run {run.run_id} chains after {run_id} in the background"
        return ToolAnswer(f"{fanout_line(run)}\n{text}", run_data(run))

    async def rerun(self, run_id: str, task: str, child: int) -> ToolAnswer:
        """R-MISC-2: child `child` of `run_id` again with a new task, in the foreground (a
        live foreground run with one child is superseded); waits for the rerun to end."""
        with anyio.CancelScope(shield=True):  # as for `run`: a started rerun is always known
            # Followed here, as a foreground `run` is: it ends with this server (kill -9).
            started = await self.client.runs.rerun(
                run_id, task, child, dict(self.env), foreground_pid=os.getpid()
            )
        try:
            final = await self._follow(started.run_id)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):  # as for a foreground run (see `run`)
                await self.client.runs.stop(started.run_id)
            raise
        return ToolAnswer(summary(final), run_data(final))

    async def pause(self, run_id: str) -> ToolAnswer:
        run, recorded = await self._live(await self.client.runs.pause(run_id))
        text = f"run {run.run_id} pausing: its children are stopped"
        return ToolAnswer(text, run_data(run, recorded))

    async def approve(self, run_id: str) -> ToolAnswer:
        ctx = self.context()
        run = await self.client.runs.approve(
            run_id,
            depth=ctx.depth,
            capacity_limit=ctx.config.settings.max_active_async_runs_per_session,
            env=dict(self.env),
            inherited_fanout=ctx.inherited_fanout,  # a relaunch inside a run: nested (R-TOP-1)
        )
        # After a node restart the approve is a launch (a relaunch, charged to the caller's
        # tree from inside a run): R-FAN-25's first line, read after its claims.
        run, recorded = await self._live(run)
        text = f"run {run.run_id} goes on past the checkpoint"
        return ToolAnswer(f"{fanout_line(run, recorded)}\n{text}", run_data(run, recorded))

    async def reject(self, run_id: str, reason: str) -> ToolAnswer:
        run, recorded = await self._live(await self.client.runs.reject(run_id, reason))
        return ToolAnswer(f"run {run.run_id} {run.state}", run_data(run, recorded))

    async def append(
        self, run_id: str, steps: Sequence[Mapping[str, Any]], agents_dirs: Sequence[str]
    ) -> ToolAnswer:
        chain = (
            self.context(agents_dirs)
            .from_mapping("chain", {"steps": list(steps)}, True, None, path="steps")
            .chain
        )
        # Under an append id, sent again under it when its answer is lost: queued once.
        result = await self.client.runs.append(run_id, chain)
        return ToolAnswer(result.text, result.model_dump(mode="json"))

    # -- helpers -------------------------------------------------------------------------------

    async def _follow(self, run_id: str) -> RunView:
        """A foreground run's end, followed on the state dir's next node when its node is lost
        (stopped, as an upgrade does, or killed): the run's shims outlive the node and the next
        one adopts it, as a foreground `subagents-node run` follows on. The call used to end at
        once with "no node is running", which named no run: the run went on unfollowed, its
        output and id lost to the model. Without a next node in time, the error names it."""
        losses = 0
        while True:
            try:
                return await self.client.runs.wait(run_id)
            except (NodeNotRunning, NodeTimeout) as err:
                if not node_lost(err):
                    raise
                if losses == MAX_NODE_LOSSES or not await self.client.runs.served_again():
                    raise type(err)(
                        f"{err.message.rstrip('.')}; run {run_id} goes on without its node "
                        "(the next node on the state dir adopts it): wait for it once one serves",
                        **{**err.details, "run_id": run_id},
                    ) from None
                losses += 1

    async def _live(self, run: RunView) -> tuple[RunView, str]:
        """R-FAN-26: `run` with its tree's fan-out as the budget's owner has it now (the run's
        record lags every later claim on the tree) and ''; or, when the budget cannot be read
        live, `run` with the figure it recorded and why (one request, never a failed tool)."""
        live = await self.client.perform(live_fanout_plan([run]))
        return live.runs[0], live.recorded.get(run.run_id, "")

    def _launch(
        self,
        agent: str | None,
        task: str | None,
        tasks: Sequence[Mapping[str, Any]],
        chain: Sequence[Mapping[str, Any]],
        concurrency: int,
        background: bool | None,
        timeout_ms: int | None,
        intercom: IntercomMode,
        agents_dirs: Sequence[str],
        cwd: str | None,
    ) -> Launch:
        """One of: `agent` + `task` (single), `tasks` (parallel), `chain` (chain)."""
        shapes = [bool(agent or task), bool(tasks), bool(chain)]
        if shapes.count(True) != 1 or (shapes[0] and not (agent and task)):
            raise BadRequest(
                "give agent and task (single), or tasks (parallel), or chain (chain)",
                field="mode",
            )
        ctx = self.context(agents_dirs, cwd)
        if agent and task:
            return ctx.single(agent, task, background, timeout_ms, intercom)
        run_async = bool(background)
        if tasks:
            data = {"tasks": list(tasks), "concurrency": concurrency}
            return ctx.from_mapping("parallel", data, run_async, timeout_ms, intercom, "tasks")
        data = {"steps": list(chain)}
        return ctx.from_mapping("chain", data, run_async, timeout_ms, intercom, "chain")


def read_tail(path: str, limit: int) -> tuple[str, bool]:
    """The last `limit` bytes of a log file, and whether anything before them was left out.

    The log is opened as the CLI's `logs` opens it (messages/statefiles.py): a regular file,
    never through a symlink. A plain open() of a FIFO a child put in its log's place waited for
    a writer on the event loop, and every call of the server waited with it; a symlink showed
    whatever file it named."""
    if not path:
        return "", False
    try:
        with open(statefiles.open_file(path), "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - limit))
            data = log.read(limit)
    except FileNotFoundError:
        return "", False  # the child has not written (or started) yet
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror or exc})", False
    return data.decode("utf-8", "replace"), size > limit


def fanout_line(run: RunView, recorded: str = "") -> str:
    """R-FAN-25: the run tree's budget as the launch left it, the first line of every launch
    result's text (started in the background, or settled), beside the `fanout` of its data;
    `recorded` says why the figure is the run's record, not a live reading."""
    snaps = run.snapshots
    note = f" ({RECORDED}: {recorded})" if recorded else ""
    return f"Run fan-out: {snaps.fanout_used}/{snaps.fanout_limit} used{note}"


def summary(run: RunView) -> str:
    """What a model needs from a settled run: its end, its ledgers and its output."""
    count = len(run.children)
    lines = [
        fanout_line(run),
        f"run {run.run_id} {run.state} ({run.mode}, {count} child{'ren' * (count != 1)})",
    ]
    if run.error:
        lines.append(f"error: {run.error}")
    for child in run.children:
        if child.state != "complete" and child.error:
            lines.append(f"child {child.index} {child.label}: {child.state}: {child.error}")
    if run.output:
        lines.append(run.output.rstrip())
    return "\n".join(lines)


def run_data(run: RunView, recorded: str = "") -> dict[str, Any]:
    """The structured form of a run: the parts a program decides on, not every field;
    `fanout_recorded` (when `recorded` is given) says why `fanout` is the run's record."""
    return {
        "run_id": run.run_id,
        "state": run.state,
        "mode": run.mode,
        "background": run.background,
        "session_id": run.session_id,
        "root_run_id": run.root_run_id,
        "output": run.output,
        "error": run.error,
        "fanout": {"used": run.snapshots.fanout_used, "limit": run.snapshots.fanout_limit},
        # Links (R-RES, R-RES-6, R-MISC-2): where the run came from, and its superseding rerun.
        "source_run_id": run.source_run_id,
        "source_kind": run.source_kind,
        "superseded_by": run.superseded_by,
        "children": [
            {
                "index": c.index,
                "label": c.label,
                "agent": c.agent,
                "state": c.state,
                "exit_code": c.exit_code,
                "output": c.output,
            }
            for c in run.children
        ],
        **({"fanout_recorded": recorded} if recorded else {}),
    }
