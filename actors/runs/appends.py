"""RunAppends: how the RunSupervisor appends steps to a running background chain (`runs.append`).

Owns the appends in flight: each request's pipeline started (management.py has its steps and
rules: the paths it claims, R-APP-4's claims and record committed together), the chain's
pending counts held while it runs (R-APP-1: a chain with an append pending does not settle), the
committed steps made the chain's last groups (R-APP-6 order) and started once that has
committed, and a failed append's counts given back. An append under its client's
`append_id` is made once (docs/api.md, "Launching again"): sent again while it is in flight it
waits for that one's answer; once recorded (by this node or a lost one) it is answered as made,
and queues nothing more. It never blocks on another owner (the pipeline's calls come back as
`Answer` ticks) and never starts a step before the transaction that appended it commits. What a
restarted node owes for an append is runs/restart.py's.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol

from subagents_node.actors.inbox import DEFERRED, Tick
from subagents_node.actors.owner import ReplyFn
from subagents_node.actors.pipelines import Pipelines
from subagents_node.actors.runs import management, runstore
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.ticks import Advance, AppendKey, CallKey
from subagents_node.messages.base import Message
from subagents_node.messages.errors import BadRequest
from subagents_node.messages.lineage import Append, AppendResult
from subagents_node.messages.supervisor import ChainStep

P = ParamSpec("P")


class AppendsHost(management.AppendHost, Protocol):
    """What appending needs from the RunSupervisor, beyond the append pipeline's host."""

    @property
    def current_reply(self) -> ReplyFn | None:
        """The reply of the request being handled."""

    def resolve(self, run_id: str) -> str: ...

    def record_event(self, run_id: str, kind: str, data: dict[str, Any]) -> None: ...

    def advance(self, live: LiveRun) -> None: ...

    def to_self(self, make: Callable[P, Tick]) -> Callable[P, None]:
        """A callback (run on another thread) that delivers the tick `make` builds to us."""


class RunAppends:
    """Appends to the host's live chains (`live`, the host's own map of its live runs)."""

    def __init__(
        self, host: AppendsHost, live: dict[str, LiveRun], pipelines: Pipelines[CallKey]
    ) -> None:
        self._host = host
        self._live = live
        self._pipelines = pipelines
        #: The appends in flight: the chain each holds open and how many steps it adds.
        self._appending: dict[AppendKey, tuple[LiveRun, int]] = {}
        #: Those under a client's append id, by (run id, append id): the request's digest and
        #: the replies of the same append sent again meanwhile (answered with its outcome).
        self._by_id: dict[tuple[str, str], tuple[str, list[ReplyFn]]] = {}

    def append(self, request: Append) -> Message:
        """R-APP-1..4: queue steps on a running background chain, claims and record together."""
        host = self._host
        run_id = host.resolve(request.run_id)
        row = runstore.run_row(host.db, run_id)
        assert row is not None and host.current_reply is not None
        digest = None
        if request.append_id is not None:
            digest = hashlib.sha256(request.model_dump_json().encode()).hexdigest()
            made = self._made(run_id, request.append_id, digest)
            if made is not None:
                return made
        live = self._live.get(run_id)
        descriptor = management.check_appendable(row, live)
        assert live is not None
        start = len(live.groups) + live.pending_steps
        assert live.launch is not None  # check_appendable: a live chain this node launched
        management.check_append_items(run_id, live.launch, start, list(request.steps))
        paths = management.append_paths(start, request.steps)
        live.pending_appends += 1
        live.pending_steps += len(request.steps)
        key = AppendKey(run_id, uuid.uuid4().hex[:8])
        count = len(request.steps)

        def pending_after() -> int:
            self._appending.pop(key, None)
            live.pending_appends -= 1
            live.pending_steps -= count
            return live.pending_appends

        pipeline = management.append_pipeline(
            host,
            run_id,
            descriptor,
            list(request.steps),
            paths,
            pending_after,
            request.append_id,
            digest,
        )
        self._appending[key] = (live, count)
        reply = host.current_reply
        if request.append_id is not None and digest is not None:
            reply = self._answering_joined(run_id, request.append_id, digest, reply)
        self._pipelines.start(key, pipeline, reply)
        return DEFERRED  # type: ignore[no-any-return]

    def _made(self, run_id: str, append_id: str, digest: str) -> Message | None:
        """The answer to an append whose id was used on this chain already: wait for the one
        in flight, or answer the one recorded; None when the id appended nothing yet."""
        going = self._by_id.get((run_id, append_id))
        if going is not None:
            _same(append_id, run_id, going[0], digest)
            assert self._host.current_reply is not None
            going[1].append(self._host.current_reply)
            return DEFERRED  # type: ignore[no-any-return]
        row = self._host.db.execute(
            "SELECT steps, digest FROM run_appends WHERE run_id=? AND append_id=?",
            (run_id, append_id),
        ).fetchone()
        if row is None:
            return None
        _same(append_id, run_id, row[1], digest)
        live = self._live.get(run_id)
        pending = live.pending_appends if live is not None else 0
        text = (
            f"Append {append_id} was queued already for chain run {run_id}: {row[0]} step(s); "
            f"sent again, it queued nothing more. Pending appends: {pending}."
        )
        return AppendResult(run_id=run_id, steps=int(row[0]), pending_appends=pending, text=text)

    def _answering_joined(
        self, run_id: str, append_id: str, digest: str, reply: ReplyFn
    ) -> ReplyFn:
        """`reply`, which also answers the same append sent again while this one is made."""
        joined: list[ReplyFn] = []
        self._by_id[(run_id, append_id)] = (digest, joined)

        def answer(outcome: Any) -> None:
            self._by_id.pop((run_id, append_id), None)
            reply(outcome)
            for other in joined:
                other(outcome)

        return answer

    def extend_chain(self, run_id: str, steps: list[ChainStep]) -> str:
        """AppendHost: the committed steps become the chain's last groups (R-APP-6 order)."""
        host = self._host
        live = self._live[run_id]
        warning = management.extend_chain(host.db, live, steps)
        host.record_event(run_id, "chain.append", {"steps": len(steps)})
        # Start the new steps (if the chain was idle) once this transaction has committed.
        advance = host.to_self(Advance)
        host.after_commit(lambda: advance(run_id))
        return warning

    def failed(self, key: AppendKey) -> None:
        """The append's pipeline ended with an error: it no longer holds its chain open."""
        entry = self._appending.pop(key, None)
        if entry is not None:
            live, steps = entry
            live.pending_appends -= 1
            live.pending_steps -= steps
            self._host.advance(live)


def _same(append_id: str, run_id: str, made: str | None, digest: str) -> None:
    """One append id names one append of a chain: another request under it is refused."""
    if made != digest:
        raise BadRequest(
            f"append id '{append_id}' was already used for another append to chain run "
            f"{run_id}; use a new append id",
            reason="append_id",
            field="append_id",
        )
