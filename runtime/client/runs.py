"""Client API for runs: launch, watch, wait, show, list, stop (attached as `client.runs`).

`wait()` follows a run through long-poll `watch` requests: each one is answered by the node as
soon as the run has new events, so nothing here polls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from subagents_node.messages.base import validate_request
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


class RunsAPI:
    """Every method builds its request with `validate_request`: a bad argument raises the
    documented `BadRequest` naming the field, never pydantic's ValidationError."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def launch(self, launch: Launch) -> RunView:
        """Admit and start a run; returns as soon as its first children started."""
        return self._client.ask(launch, LaunchResult).run

    def watch(self, run_id: str, after_seq: int = 0, wait_s: float = WATCH_WAIT_S) -> RunEvents:
        return self._client.ask(
            validate_request(Watch, {"run_id": run_id, "after_seq": after_seq, "wait_s": wait_s}),
            RunEvents,
            timeout=wait_s + self._client.timeout,
        )

    def watch_all(
        self, after_seq: int = 0, wait_s: float = WATCH_WAIT_S, limit: int = 500
    ) -> FleetEvents:
        """Events of every run after `after_seq`, answered as soon as there are any."""
        return self._client.ask(
            validate_request(WatchAll, {"after_seq": after_seq, "wait_s": wait_s, "limit": limit}),
            FleetEvents,
            timeout=wait_s + self._client.timeout,
        )

    def wait(
        self,
        run_id: str,
        timeout: float | None = None,
        on_event: Callable[[RunEvent, RunView], None] | None = None,
    ) -> RunView:
        """Block until the run is terminal (R-RUN-3); `on_event` sees each event in order."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seq = 0
        while True:
            wait_s = WATCH_WAIT_S
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
            batch = self.watch(run_id, seq, wait_s)
            for event in batch.events:
                if on_event is not None:
                    on_event(event, batch.run)
            seq = batch.last_seq
            if batch.run.state in TERMINAL_RUN_STATES:
                return batch.run
            if deadline is not None and time.monotonic() >= deadline:
                raise NodeTimeout(
                    f"run {run_id} is still {batch.run.state} after {timeout:g}s",
                    address=self._client.address,
                    timeout_s=timeout,
                )

    def show(self, run_id: str) -> RunView:
        return self._client.ask(validate_request(Show, {"run_id": run_id}), RunView)

    def list(
        self,
        session_id: str | None = None,
        active_only: bool = False,
        limit: int = 50,
        root_run_id: str | None = None,
    ) -> list[RunView]:
        request = validate_request(
            ListRuns,
            {
                "session_id": session_id,
                "active_only": active_only,
                "limit": limit,
                "root_run_id": root_run_id,
            },
        )
        return self._client.ask(request, RunList).runs

    def stop(self, run_id: str) -> RunView:
        return self._client.ask(validate_request(Stop, {"run_id": run_id}), RunView)
