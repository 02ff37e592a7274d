"""Client API for runs: launch, watch, wait, settle, logs, show, list, stop (`client.runs`).

`wait()` and `settle()` follow runs through long-poll `watch` requests: each one is answered by
the node as soon as the run has new events, so nothing here polls. `logs()` streams the child
logs (client/logs.py: inotify for new bytes, the same long-poll for the run's end). Requests
are built with `validate_request`, so a bad argument is a typed `BadRequest`, never pydantic's
ValidationError.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
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
    from subagents_node.client.logs import LogLine

#: How long one watch request may wait at the node before answering with no events.
WATCH_WAIT_S = 10.0


class RunsAPI:
    def __init__(self, client: Client) -> None:
        self._client = client

    def launch(self, launch: Launch) -> RunView:
        """Admit and start a run; returns as soon as its first children started."""
        return self._client.ask(launch, LaunchResult).run

    def watch(self, run_id: str, after_seq: int = 0, wait_s: float = WATCH_WAIT_S) -> RunEvents:
        request = validate_request(
            Watch, {"run_id": run_id, "after_seq": after_seq, "wait_s": wait_s}
        )
        return self._client.ask(
            request,
            RunEvents,
            timeout=wait_s + self._client.timeout,
        )

    def watch_all(
        self, after_seq: int = 0, wait_s: float = WATCH_WAIT_S, limit: int = 500
    ) -> FleetEvents:
        """Events of every run after `after_seq`, answered as soon as there are any."""
        request = validate_request(
            WatchAll, {"after_seq": after_seq, "wait_s": wait_s, "limit": limit}
        )
        return self._client.ask(
            request,
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

    def settle(
        self,
        run_ids: Sequence[str],
        timeout: float | None = None,
        on_end: Callable[[RunView], None] | None = None,
    ) -> list[RunView]:
        """Block until every run is terminal, or until `timeout` seconds have passed.

        Returns the latest view of each run, in the order given: a view that is not terminal
        means the deadline came first (nothing is raised for that). `on_end` sees each run
        once it has ended, in the order given. Unknown or ambiguous ids raise before any wait.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        views = [self.show(run_id) for run_id in run_ids]
        for i, view in enumerate(views):
            seq = 0
            while view.state not in TERMINAL_RUN_STATES:
                wait_s = WATCH_WAIT_S
                if deadline is not None:
                    wait_s = min(wait_s, deadline - time.monotonic())
                    if wait_s <= 0:
                        return views
                batch = self.watch(view.run_id, seq, wait_s)
                seq, view = batch.last_seq, batch.run
                views[i] = view
            if on_end is not None:
                on_end(view)
        return views

    def logs(
        self, run_id: str, child: str | None = None, follow: bool = False
    ) -> Iterator[LogLine]:
        """The lines of run `run_id`'s child logs (all children, or the one labelled `child`),
        stdout and stderr labelled; with `follow`, new lines as they are written until the run
        ends. The logs are read from the run's directory, so the node must be on this host."""
        from subagents_node.client.logs import follow_logs

        return follow_logs(self._client, run_id, child, follow)

    def show(self, run_id: str) -> RunView:
        return self._client.ask(validate_request(Show, {"run_id": run_id}), RunView)

    def list(
        self,
        session_id: str | None = None,
        active_only: bool = False,
        limit: int = 50,
        root_run_id: str | None = None,
    ) -> list[RunView]:
        fields = {
            "session_id": session_id,
            "active_only": active_only,
            "limit": limit,
            "root_run_id": root_run_id,
        }
        return self._client.ask(validate_request(ListRuns, fields), RunList).runs

    def stop(self, run_id: str) -> RunView:
        return self._client.ask(validate_request(Stop, {"run_id": run_id}), RunView)
