"""`AsyncClient.runs`: launch, watch, wait, show, list, stop, awaited.

Each method performs the plan of `RunsAPI`'s method of the same name (client/runs.py): the
requests, their checks and the meaning of the replies live there, once; here is only the
awaiting (a wait lets the loop's other coroutines run meanwhile).

It must never build a request itself, nor import the node or the actors.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from subagents_node.client import launchagain, lineage
from subagents_node.client import runs as run_plans
from subagents_node.client.channel import closed_error
from subagents_node.client.client import checked_timeout
from subagents_node.client.plans import Plan
from subagents_node.client.runs import WATCH_WAIT_S, OnEvent, OnGap
from subagents_node.messages.constants import NODE_BACK_S
from subagents_node.messages.errors import BadRequest, NodeNotRunning, NodeTimeout
from subagents_node.messages.lineage import AppendResult
from subagents_node.messages.supervisor import ChainStep, FleetEvents, Launch, RunEvents, RunView

T = TypeVar("T")

if TYPE_CHECKING:
    from subagents_node.client.aio import AsyncClient


class AsyncRunsAPI:
    """`client.runs` of an AsyncClient: launch, watch, wait, show, list, stop."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def launch(self, launch: Launch, next_node_s: float = NODE_BACK_S) -> RunView:
        """As `RunsAPI.launch`: under a launch id, sent again under it when its answer is lost
        (client/launchagain.py); the wait for the next node (up to `next_node_s`) runs in a
        thread (an inotify wait), so the loop's other coroutines go on meanwhile."""
        return await self._sent_again(launch, next_node_s)

    async def _sent_again(self, request: launchagain.Relaunch, next_node_s: float) -> RunView:
        return await self._sent(request, launchagain.plan_of, next_node_s)

    async def _sent(
        self, request: launchagain.Keyed, plan: Callable[[Any], Plan[T]], next_node_s: float
    ) -> T:
        wait_s = checked_timeout(next_node_s, "next_node_s")
        sends = launchagain.Sends(request)
        while True:
            try:
                return await self._client.perform(plan(sends.launch))
            except BadRequest as err:
                sends.older_node(err)
            except (NodeNotRunning, NodeTimeout) as err:
                if sends.again_after_node(err) and not await self._served_again(wait_s):
                    if self._client.transport.closed:  # closed meanwhile: no node was waited for
                        raise closed_error(self._client.address) from None
                    sends.give_up()

    async def served_again(self, wait_s: float = NODE_BACK_S) -> bool:
        """Whether the state dir's next node serves within `wait_s` seconds, after the node
        was lost under a call (`nodewait.node_lost`): for a caller that follows a run across
        it (the MCP server's foreground run, whose shims outlive the node). Always False over
        tcp; a cancel ends the wait at once."""
        return await self._served_again(checked_timeout(wait_s, "wait_s"))

    async def _served_again(self, wait_s: float) -> bool:
        """Whether the state dir's next node serves within `wait_s`, waited for in a thread
        (an inotify wait). A cancel, or the client's close, ends that thread's wait too (closing
        the pipe it polls): left to run, it kept `asyncio.run` from returning for up to `wait_s`
        (30 s) after the launch was cancelled (or the program interrupted), and a client closed
        meanwhile raised its launch's NodeTimeout 30 s later, not "this client is closed"."""
        client = self._client
        stop, stopping = os.pipe()
        client.transport.ends_with_close(stopping)
        try:
            back = launchagain.served_again_at
            return await asyncio.to_thread(back, client.address, client.timeout, wait_s, stop)
        finally:
            if client.transport.release(stopping):
                os.close(stopping)  # the thread closes `stop` itself, once its wait has ended

    async def watch(
        self, run_id: str, after_seq: int = 0, wait_s: float = WATCH_WAIT_S
    ) -> RunEvents:
        plan = run_plans.watch_plan(run_id, after_seq, wait_s, self._client.timeout)
        return await self._client.perform(plan)

    async def watch_all(
        self, after_seq: int = 0, wait_s: float = WATCH_WAIT_S, limit: int = 500
    ) -> FleetEvents:
        plan = run_plans.watch_all_plan(after_seq, wait_s, limit, self._client.timeout)
        return await self._client.perform(plan)

    async def wait(
        self,
        run_id: str,
        timeout: float | None = None,
        on_event: OnEvent | None = None,
        on_gap: OnGap | None = None,
        after_seq: int = 0,
    ) -> RunView:
        """Until the run is terminal (R-RUN-3); other coroutines run meanwhile. A worker's
        partition does not end it; `on_event` sees the events after `after_seq` (`Runs.wait`)."""
        client = self._client
        carried = bool(getattr(client.transport, "host", ""))
        plan = run_plans.wait_plan(
            client.address, client.timeout, run_id, timeout, on_event, on_gap, carried, after_seq
        )
        return await client.perform(plan)

    async def resume(
        self,
        run_id: str,
        message: str = "",
        depth: int = 0,
        capacity_limit: int = 0,
        env: Mapping[str, str] | None = None,
        inherited_fanout: str | None = None,
        intercom: str | None = None,
    ) -> RunView:
        """As `Client.runs.resume` (R-RES-1..7)."""
        request = lineage.resume_request(
            run_id, message, depth, capacity_limit, env, inherited_fanout, intercom
        )
        return await self._sent_again(request, NODE_BACK_S)

    async def append(self, run_id: str, steps: Sequence[ChainStep]) -> AppendResult:
        """As `Client.runs.append` (R-APP-1..6)."""
        request = lineage.append_request(run_id, steps)
        return await self._sent(request, lineage.append_plan, NODE_BACK_S)

    async def attach(
        self,
        run_id: str,
        steps: Sequence[ChainStep],
        capacity_limit: int = 0,
        depth: int = 0,
        env: Mapping[str, str] | None = None,
        inherited_fanout: str | None = None,
    ) -> RunView:
        """As `Client.runs.attach` (R-RES-6)."""
        request = lineage.attach_request(
            run_id, steps, capacity_limit, depth, env, inherited_fanout
        )
        return await self._sent_again(request, NODE_BACK_S)

    async def rerun(
        self,
        run_id: str,
        task: str,
        child: int = 0,
        env: Mapping[str, str] | None = None,
        foreground_pid: int | None = None,
    ) -> RunView:
        """As `Client.runs.rerun` (R-MISC-2)."""
        request = lineage.rerun_request(run_id, task, child, env, foreground_pid)
        return await self._sent_again(request, 0.0)

    async def show(self, run_id: str) -> RunView:
        return await self._client.perform(run_plans.show_plan(run_id))

    async def list(
        self,
        session_id: str | None = None,
        active_only: bool = False,
        limit: int = 50,
        root_run_id: str | None = None,
        parent_run_id: str | None = None,
        after_run_id: str | None = None,
    ) -> list[RunView]:
        plan = run_plans.list_plan(
            session_id, active_only, limit, root_run_id, parent_run_id, after_run_id
        )
        return await self._client.perform(plan)

    async def stop(self, run_id: str) -> RunView:
        return await self._client.perform(run_plans.stop_plan(run_id))

    async def pause(self, run_id: str) -> RunView:
        """R-RUN-2 interrupt-as-pause (RunsAPI.pause)."""
        return await self._client.perform(run_plans.pause_plan(run_id))

    async def approve(
        self,
        run_id: str,
        depth: int = 0,
        capacity_limit: int = 0,
        env: dict[str, str] | None = None,
        inherited_fanout: str | None = None,
    ) -> RunView:
        """The run that goes on past the checkpoint `run_id` waits at (RunsAPI.approve):
        under an approve id, sent again under it when its answer is lost."""
        request = run_plans.approve_request(run_id, depth, capacity_limit, env, inherited_fanout)
        return await self._sent(request, run_plans.approve_plan, NODE_BACK_S)

    async def reject(self, run_id: str, reason: str = "") -> RunView:
        """The run waiting at a checkpoint ends `rejected` (RunsAPI.reject)."""
        return await self._client.perform(run_plans.reject_plan(run_id, reason))
