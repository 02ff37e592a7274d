"""Pipelines: multi-step work an owner does across other owners, without blocking its thread.

Owns the pipelines in flight (a generator and the reply it will answer) and the routing of
their steps. A pipeline is a generator that yields a request for another owner and receives its
result (or has its typed error thrown in); the driver sends each request through the node's
dispatcher, and the answer comes back through the owner's `deliver(key, outcome)`, which makes
it a tick of the owner's own; handling that tick, the owner calls `resume`, which feeds it to
the right generator. A `Durable` request is sent only after the owner's current transaction
commits. The generator's return value is its reply. A call whose key names no pipeline (a
one-off read) is answered the same way; its failure to send is only logged. What another
owner must hear even when an answer is lost does not go through here: an owner keeps it in an
outbox of its own (the run supervisor's: actors/runs/outbox.py).

Keys are the owner's own frozen, hashable types (`Pipelines` is generic over them): an answer
is routed by its key's type and fields, never by parsing a string. The driver never touches
a table (the generators do, on the owner's thread) and never waits for an answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Hashable, Iterable
from typing import Any, Generic, TypeVar

from subagents_node.actors.context import ActorContext
from subagents_node.actors.outcomes import Outcome, ReplyFn, store_full
from subagents_node.messages.base import Message, Request
from subagents_node.messages.errors import (
    Busy,
    Internal,
    MembershipRefused,
    NodeError,
    OwnerUnavailable,
    StoreError,
    SubagentsError,
    UnknownTarget,
)

log = logging.getLogger(__name__)

Pipeline = Generator[Any, Message, Message]

#: The owner's key type: a frozen record (actors/records.py), or a union of them, naming one
#: call's answer.
K = TypeVar("K", bound=Hashable)


#: How many times one request of a pipeline is sent again after it went unanswered.
MAX_RESENDS = 2


def unanswered(outcome: Outcome) -> bool:
    """Whether `outcome` says the request went unanswered (OwnerLinks: its deadline passed,
    the owner killed or restarting with it in flight), not that its owner refused it or is
    `failed`. One lost with a worker's home (`home_unreachable_in_flight`) is not sent again:
    while the home is unreachable the resend is refused as "not sent", and that answer would
    hide that the first send may have been applied (its outcome is unknown)."""
    return isinstance(outcome, OwnerUnavailable) and outcome.details.get("reason") == "timeout"


#: Failures that say a send was not applied but nothing of an earlier one: no owner's verdict
#: on the request (not sent: a worker's home unreachable, or fenced; a full mailbox; a store
#: that failed the group; an owner that failed on it, or is gone).
_NOT_A_VERDICT: tuple[type[SubagentsError], ...] = (
    OwnerUnavailable,
    Busy,
    MembershipRefused,
    StoreError,
    UnknownTarget,
    Internal,
    NodeError,
)


def lost_then_refused(sent: Request, error: SubagentsError) -> SubagentsError:
    """The answer to a request sent again after a send of it went unanswered: a refusal that
    is not its owner's verdict says nothing of that first send, which may have been applied
    (it may still be, were it waiting in a queue). So the outcome is unknown, not what the
    refusal says (e.g. "was not sent (nothing was applied)", with the home unreachable)."""
    if sent.read_only or not isinstance(error, _NOT_A_VERDICT):
        return error  # a read changes nothing; an owner's verdict stands
    if error.details.get("outcome") == "unknown":
        return error
    return OwnerUnavailable(
        f"{sent.type} to {sent.target} went unanswered, and sending it again failed "
        f"({error.message}): its outcome is unknown (it may have been applied)",
        owner=sent.target,
        state="unknown",
        reason="timeout",
        outcome="unknown",
    )


class Durable:
    """Yielded instead of a request: send it only once the owner's transaction has committed."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request


class Pipelines(Generic[K]):
    def __init__(
        self,
        ctx: ActorContext,
        deliver: Callable[[K, Outcome], None],
        reply_later: Callable[[ReplyFn, Outcome], None],
        after_commit: Callable[[Callable[[], None]], None],
        on_failed: Callable[[K, str], None],
    ) -> None:
        """`deliver(key, outcome)` brings an answer back to the owner as a tick (it runs on
        another thread); `on_failed(key, reason)` lets the owner clean up after a pipeline
        that ended with an error."""
        self._ctx = ctx
        self._deliver = deliver
        self._reply_later = reply_later
        self._after_commit = after_commit
        self._on_failed = on_failed
        self._running: dict[K, tuple[Pipeline, ReplyFn]] = {}
        #: Pipelines whose next request waits for the owner's commit (Durable).
        self._after_commit_keys: set[K] = set()
        #: Each running pipeline's request in flight, and how often it was sent again.
        self._in_flight: dict[K, tuple[Request, int]] = {}

    def start(self, key: K, pipeline: Pipeline, reply: ReplyFn) -> None:
        self._running[key] = (pipeline, reply)
        self._step(key, None, None)

    def running(self, key: K) -> bool:
        """Whether the pipeline `key` names has not ended yet."""
        return key in self._running

    def resume(self, key: K, outcome: Outcome) -> bool:
        """Feed an answer to its pipeline; False when the key names none (bookkeeping).

        A request that went unanswered (its owner killed with it in flight, or restarting) is
        sent again, at most MAX_RESENDS times, when it is safe to send twice
        (`resendable_as_sent`: a read, or a write under an id that makes it count once); the
        pipeline never sees the lost send. Before, a session owner killed after counting a
        launch's spawns failed that launch, and the spawns stayed counted. A resend refused
        without its owner's verdict (`lost_then_refused`) is answered outcome unknown: the
        first send may have been applied."""
        if key not in self._running:
            self._in_flight.pop(key, None)
            return False
        sent, resends = self._in_flight.pop(key, (None, 0))
        # Lost first: a request's own check runs only for one that went unanswered.
        if (
            unanswered(outcome)
            and sent is not None
            and resends < MAX_RESENDS
            and sent.resendable_as_sent()
        ):
            log.warning("%s to %s went unanswered; sending it again", sent.type, sent.target)
            self._send(key, sent, resends + 1)
            return True
        if isinstance(outcome, SubagentsError):
            if resends and sent is not None:
                outcome = lost_then_refused(sent, outcome)
            self._step(key, None, outcome)
        else:
            self._step(key, outcome, None)
        return True

    def call(self, key: K, request: Request | Durable) -> None:
        """Send a request to another owner; its outcome comes back through `deliver`."""
        if isinstance(request, Durable):
            inner = request.request
            self._after_commit_keys.add(key)

            def send() -> None:
                self._after_commit_keys.discard(key)
                self.call(key, inner)

            self._after_commit(send)
            return
        self._send(key, request, 0)

    def _send(self, key: K, request: Request, resends: int) -> None:
        assert self._ctx.dispatch is not None, "the node injects dispatch"
        deliver = self._deliver
        if key in self._running:
            self._in_flight[key] = (request, resends)
        try:
            self._ctx.dispatch(request, request.target, lambda o: deliver(key, o))
        except SubagentsError as err:  # Busy, or the target is gone: nothing was queued
            self._in_flight.pop(key, None)
            if key in self._running:
                self._step(key, None, lost_then_refused(request, err) if resends else err)
            else:
                log.error("%s to %s failed: %s", request.type, request.target, err.message)

    def dropped(self) -> set[K]:
        """The pipelines whose after-commit send was dropped with an undone transaction (they
        would wait for an answer that never comes); forgotten here once taken."""
        keys, self._after_commit_keys = self._after_commit_keys, set()
        return {key for key in keys if key in self._running}

    def fail(self, keys: Iterable[K], error: SubagentsError) -> None:
        """Throw `error` into each pipeline still running among `keys`: its own clean-up runs
        (a slot rolled back) and its caller is answered with the error."""
        for key in keys:
            if key in self._running:
                self._step(key, None, error)

    def _step(self, key: K, value: Message | None, error: SubagentsError | None) -> None:
        self._in_flight.pop(key, None)
        pipeline, reply = self._running[key]
        try:
            # A first send(None) primes the generator.
            request = pipeline.throw(error) if error else pipeline.send(value)  # type: ignore[arg-type]
        except StopIteration as done:
            del self._running[key]
            self._reply_later(reply, done.value)
            return
        except SubagentsError as err:
            del self._running[key]
            self._on_failed(key, err.message)
            self._reply_later(reply, err)
            return
        except Exception as exc:
            del self._running[key]
            self._on_failed(key, f"failed: {exc!r}")
            # A full disk is answered as such (the owner undoes the group, without a crash).
            failed = store_full(exc, "pipeline") or Internal(f"failed: {exc!r}", actor="pipeline")
            self._reply_later(reply, failed)
            raise  # a bug or a full disk: the owner rolls back (and, for a bug, restarts)
        self.call(key, request)
