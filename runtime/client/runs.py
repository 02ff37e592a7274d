"""Client API for runs: launch, watch, wait, show, list, stop (attached as `client.runs`).

`wait()` follows a run through long-poll `watch` requests: each one is answered by the node as
soon as the run has new events, so nothing here polls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from subagents_node.client.plans import Plan, build, one
from subagents_node.messages.errors import NodeTimeout
from subagents_node.messages.runs import TERMINAL_RUN_STATES
from subagents_node.messages.supervisor import (
    FleetEvents,
    Launch,
    LaunchResult,
    ListRuns,
    RunEvent,
    RunEvents,
    RunList,
    RunView,
    Show,
    Stop,
    Watch,
    WatchAll,
)

if TYPE_CHECKING:
    from subagents_node.client.client import Client

#: How long one watch request may wait at the node before answering with no events.
WATCH_WAIT_S = 10.0


# -- the requests, one plan each (shared with the asyncio client, subagents_node.client.aio) --

#: Called with each event of a followed run, in order, and the run as that batch left it.
OnEvent = Callable[[RunEvent, RunView], None]


def launch_plan(launch: Launch) -> Plan[RunView]:
    result: LaunchResult = yield from one(launch, LaunchResult)
    return result.run


def watch_plan(run_id: str, after_seq: int, wait_s: float, reply_timeout: float) -> Plan[RunEvents]:
    """A long poll: the node answers as soon as the run has events after `after_seq`; the reply
    may take `wait_s` plus the client's own timeout."""
    request = build(Watch, run_id=run_id, after_seq=after_seq, wait_s=wait_s)
    return one(request, RunEvents, timeout=wait_s + reply_timeout)


def watch_all_plan(
    after_seq: int, wait_s: float, limit: int, reply_timeout: float
) -> Plan[FleetEvents]:
    request = build(WatchAll, after_seq=after_seq, wait_s=wait_s, limit=limit)
    return one(request, FleetEvents, timeout=wait_s + reply_timeout)


def wait_plan(
    address: str,
    reply_timeout: float,
    run_id: str,
    timeout: float | None = None,
    on_event: OnEvent | None = None,
) -> Plan[RunView]:
    """Follow a run through long polls until it is terminal (R-RUN-3)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seq = 0
    while True:
        wait_s = WATCH_WAIT_S
        if deadline is not None:
            wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
        batch: RunEvents = yield from watch_plan(run_id, seq, wait_s, reply_timeout)
        for event in batch.events:
            if on_event is not None:
                on_event(event, batch.run)
        seq = batch.last_seq
        if batch.run.state in TERMINAL_RUN_STATES:
            return batch.run
        if deadline is not None and time.monotonic() >= deadline:
            raise NodeTimeout(
                f"run {run_id} is still {batch.run.state} after {timeout:g}s",
                address=address,
                timeout_s=timeout,
            )


def show_plan(run_id: str) -> Plan[RunView]:
    return one(build(Show, run_id=run_id), RunView)


def list_plan(
    session_id: str | None = None,
    active_only: bool = False,
    limit: int = 50,
    root_run_id: str | None = None,
) -> Plan[list[RunView]]:
    request = build(
        ListRuns,
        session_id=session_id,
        active_only=active_only,
        limit=limit,
        root_run_id=root_run_id,
    )
    found: RunList = yield from one(request, RunList)
    return found.runs


def stop_plan(run_id: str) -> Plan[RunView]:
    return one(build(Stop, run_id=run_id), RunView)


class RunsAPI:
    def __init__(self, client: Client) -> None:
        self._client = client

    def launch(self, launch: Launch) -> RunView:
        """Admit and start a run; returns as soon as its first children started."""
        return self._client.perform(launch_plan(launch))

    def watch(self, run_id: str, after_seq: int = 0, wait_s: float = WATCH_WAIT_S) -> RunEvents:
        return self._client.perform(watch_plan(run_id, after_seq, wait_s, self._client.timeout))

    def watch_all(
        self, after_seq: int = 0, wait_s: float = WATCH_WAIT_S, limit: int = 500
    ) -> FleetEvents:
        """Events of every run after `after_seq`, answered as soon as there are any."""
        return self._client.perform(watch_all_plan(after_seq, wait_s, limit, self._client.timeout))

    def wait(
        self, run_id: str, timeout: float | None = None, on_event: OnEvent | None = None
    ) -> RunView:
        """Block until the run is terminal (R-RUN-3); `on_event` sees each event in order."""
        client = self._client
        return client.perform(wait_plan(client.address, client.timeout, run_id, timeout, on_event))

    def show(self, run_id: str) -> RunView:
        return self._client.perform(show_plan(run_id))

    def list(
        self,
        session_id: str | None = None,
        active_only: bool = False,
        limit: int = 50,
        root_run_id: str | None = None,
    ) -> list[RunView]:
        return self._client.perform(list_plan(session_id, active_only, limit, root_run_id))

    def stop(self, run_id: str) -> RunView:
        return self._client.perform(stop_plan(run_id))
