"""HostCalls: a home node's requests on their way to one of its workers (DESIGN §1 "Multi-host").

Owns, for the home gateway's I/O thread only, the routing id of each worker's home link (the
DEALER it joined and heartbeats on; learned from each answered heartbeat, so a worker that
reconnected is reached on its new connection) and the requests in flight to workers: a local
client's request whose envelope names a `host` goes out on that connection under a fresh id,
and the worker's answer goes back to the client under the client's own id, body as it came
(the client reads it tolerantly; one in another protocol version is an UnsupportedProtocol for
the client at once: `in_other_version`).
A worker needs no listener of its own: the home reaches it over the connection the worker
opened (and authenticated with CURVE) itself.

It never decides whether a request is one a worker serves (the worker does, once), nor what an
answer changes at the home (the caller's `Settle`, run on the answer before it goes on): a
request the worker does not answer within `timeout_s` is answered `unavailable` here, and a
worker the home cannot reach now is refused before anything is sent. The one exception is a
long poll (`runs.watch`), which waits anyway: one for a member that is unreachable is held for
as long as it asked to wait and sent the moment the worker is linked again (its next
heartbeat), else answered `host_unreachable`, so a follower rides out a partition without
asking in a loop. A worker not heard from yet since the home started (or since it joined) is
not known to be away: any request for it is held so, until its first heartbeat is due.

A request that was sent and timed out may still be applied: a worker stopped (SIGSTOP, a
swapping host) or cut off finds it in its socket when it resumes. So a request that changes
something (a launch, a stop) is answered `host_timeout` with `outcome: unknown` (never
"nothing was applied"), saying how to find what it may have done, and the home remembers it
(a slim record: its worker, type, session and `Settle`, for `LATE_KEEP_S`, at most `MAX_LATE`):
the worker's late answer is settled as a timely one would have been (a nested launch's run
recorded as placed by its worker, so that worker may follow and stop it) and logged, then
dropped, since nobody waits for it any more.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from subagents_node.messages.base import Request, resendable
from subagents_node.messages.codec import encode, encode_answer, in_other_version
from subagents_node.messages.envelope import ERROR, Envelope, new_message_id
from subagents_node.messages.errors import (
    Busy,
    OwnerUnavailable,
    SubagentsError,
    UnsupportedProtocol,
)
from subagents_node.messages.members import ONE_PROTOCOL
from subagents_node.messages.protocol import REQUEST_BY_TYPE

log = logging.getLogger(__name__)

#: Longer than the longest long-poll a client may ask for (`WaitS`: 60 s) with margin: the
#: client's own timeout ends its wait first; this only bounds what the home keeps.
HOST_CALL_TIMEOUT_S = 75.0
#: How long a worker waits for its home to answer a request it carries to another worker:
#: longer than the home waits for that worker, so the home's answer (a `host_timeout` saying
#: the outcome is unknown) reaches the child, not a bare timeout of its own.
CARRIED_TIMEOUT_S = HOST_CALL_TIMEOUT_S + 5.0
#: Requests to workers in flight at once, over all of them (a bound on the home's memory).
MAX_IN_FLIGHT = 10_000
#: How long the home keeps a request that changes something after giving up on its answer, so
#: that a late answer is still settled: a day covers a host resumed or a partition healed.
LATE_KEEP_S = 24 * 3600.0
#: Such requests kept at once (slim records, no body; the oldest go first).
MAX_LATE = 10_000
#: Why a request for worker `name` is not sent now (None: send it).
HostCheck = Callable[[str], "SubagentsError | None"]
#: Long polls: held while their worker is unreachable, for as long as they ask to wait.
HELD_WHILE_UNREACHABLE = frozenset({"runs.watch"})
#: The longest a long poll waits (`WaitS`'s bound); a body that says otherwise is not held.
_MAX_HOLD_S = 60.0
#: What an answer changes at the home before it goes on, given its kind (`reply`, `error`) and
#: body: None passes the answer on as it came, an error is passed on instead of it.
Settle = Callable[[str, Mapping[str, Any]], "SubagentsError | None"]


class HomeChecks(Protocol):
    """What a home's gateway asks of its HomeService (runtime/node/home.py) about a tcp
    request, given its peer's principal and the host it is for."""

    def admit(self, request: Request, principal: str, host: str) -> Request:
        """The request to dispatch (raises to refuse it)."""

    def check_placement(self, request: Request, principal: str) -> None:
        """Raises unless the peer may have the request carried to another worker."""

    def settler(self, request: Request, principal: str, host: str) -> Settle | None:
        """What its answer changes at the home before it goes on (None: nothing)."""


class Reachability(Protocol):
    """What the home says of a worker before a request goes to it (HomeService)."""

    def unreachable(self, name: str) -> SubagentsError | None:
        """Why a request cannot be carried to worker `name` now (None: it can)."""

    def awaited_s(self, name: str) -> float:
        """How long a request for worker `name` may wait for its first heartbeat (0: none)."""


class _Late:
    """A request given up on that its worker may still apply: what its late answer needs."""

    __slots__ = ("at", "host", "session_id", "settle", "type")

    def __init__(self, call: _Call) -> None:
        self.host = call.host
        self.type = call.request.type
        session = call.request.body.get("session_id")
        self.session_id = session if isinstance(session, str) else ""
        self.settle = call.settle
        self.at = time.monotonic()


class _Call:
    """A request on its way to a worker. (Slotted, not a dataclass: ~1 ms of every start.)"""

    __slots__ = ("client", "deadline", "held", "host", "request", "settle", "via")

    def __init__(
        self, via: int, client: bytes, request: Envelope, host: str, settle: Settle | None
    ) -> None:
        self.via = via
        self.client = client
        self.request = request
        self.host = host
        self.settle = settle
        self.deadline = 0.0
        #: Why it is held, not sent: its worker is unreachable (None: sent).
        self.held: OwnerUnavailable | None = None


#: A frame for the gateway to send: (socket index, peer routing id, frame).
Outbound = tuple[int, bytes, bytes]


class HostCalls:
    def __init__(
        self,
        node_id: str,
        check: HostCheck,
        worker_via: int = 1,
        timeout_s: float = HOST_CALL_TIMEOUT_S,
        limit: int = MAX_IN_FLIGHT,
        late_limit: int = MAX_LATE,
        awaited: Callable[[str], float] = lambda name: 0.0,
    ) -> None:
        self._node_id = node_id
        self._check = check
        self._awaited = awaited
        self._worker_via = worker_via
        self._timeout_s = timeout_s
        self._limit = limit
        self._late_limit = late_limit
        self._links: dict[str, bytes] = {}
        self._calls: dict[str, _Call] = {}
        #: Requests given up on that their workers may still apply, oldest first (by id).
        self._late: dict[str, _Late] = {}
        self._deadlines: list[tuple[float, str]] = []
        #: The calls held for each worker, by id: a heartbeat looks at its worker's only (it
        #: comes every second from each worker; the calls in flight may number thousands).
        self._held: dict[str, set[str]] = {}

    @classmethod
    def serving(
        cls, node_id: str, home: Reachability | None, settings: Mapping[str, object]
    ) -> HostCalls | None:
        """A home's HostCalls (None on a node that is no home); the test-only setting
        `host_call_timeout_s` shortens its wait, so a late answer takes seconds in a test."""
        if home is None:
            return None
        timeout_s = settings.get("host_call_timeout_s")
        if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool):
            timeout_s = HOST_CALL_TIMEOUT_S
        return cls(node_id, home.unreachable, timeout_s=float(timeout_s), awaited=home.awaited_s)

    def linked(self, name: str, routing_id: bytes) -> list[Outbound]:
        """Worker `name`'s home link answered a heartbeat on this connection: the long polls
        held for it go out now."""
        self._links[name] = routing_id
        return [self._onward(call_id) for call_id in self._held.pop(name, ())]

    def send(
        self, request: Envelope, via: int, client: bytes, settle: Settle | None = None
    ) -> Outbound | None:
        """The frame that carries `request` on to its host (raises why it is not sent; None:
        a long poll held until its unreachable worker is linked again); `settle` sees the
        worker's answer before the client does."""
        host = request.host
        refusal = self._check(host)
        if refusal is None and host not in self._links:
            refusal = OwnerUnavailable(
                f"worker {host!r} has not heartbeat on this home since it started; "
                f"{request.type} was not sent",
                owner=request.target,
                state="unreachable",
                reason="host_unreachable",
                host=host,
            )
        hold_s = _hold_s(request) if _unreachable(refusal) else None
        if hold_s is None and _unreachable(refusal):
            # Not heard from yet since this home started (or since it joined): any request
            # waits for its first beat, as a follower would; a launch sent again after the
            # home was restarted must reach the worker that may hold its first send's run.
            hold_s = self._awaited(host) or None
        if refusal is not None and hold_s is None:
            raise refusal
        if len(self._calls) >= self._limit:
            raise Busy(
                f"{len(self._calls)} requests to workers are in flight; retry shortly",
                limit=self._limit,
            )
        call_id = new_message_id()
        call = self._calls[call_id] = _Call(via, client, request, host, settle)
        if hold_s is not None:
            assert isinstance(refusal, OwnerUnavailable)
            call.held = refusal
            self._held.setdefault(host, set()).add(call_id)
            self._arm(call_id, hold_s)
            return None
        return self._onward(call_id)

    def _onward(self, call_id: str) -> Outbound:
        """Send call `call_id` now: its frame, under its own deadline."""
        call = self._calls[call_id]
        request = call.request
        body = request.body
        if call.held is not None and request.type in HELD_WHILE_UNREACHABLE:
            # The worker answers the long poll by the time the client was promised.
            body = {**body, "wait_s": max(0.0, call.deadline - time.monotonic())}
        call.held = None
        self._arm(call_id, self._timeout_s)
        onward = Envelope(
            type=request.type,
            body=body,
            target=request.target,
            id=call_id,
            sender=self._node_id,
        )
        return (self._worker_via, self._links[call.host], encode(onward))

    def _arm(self, call_id: str, after_s: float) -> None:
        deadline = self._calls[call_id].deadline = time.monotonic() + after_s
        heapq.heappush(self._deadlines, (deadline, call_id))

    def answer(self, reply: Envelope, principal: str) -> Outbound | None:
        """The client's frame for a worker's reply (None: not one we wait for, from this
        worker: a late answer after its deadline, or a peer answering for another)."""
        call = self._calls.get(reply.corr or "")
        if call is None:
            self._answered_late(reply, principal)
            return None
        if call.host != principal or call.held is not None:
            return None
        del self._calls[reply.corr or ""]
        refusal = call.settle(reply.type, reply.body) if call.settle is not None else None
        if refusal is not None:
            return (call.via, call.client, encode_answer(call.request, refusal, self._node_id))
        answer = call.request.reply(reply.type, reply.body, self._node_id)
        return (call.via, call.client, encode(answer))

    def in_other_version(
        self, frame: bytes, refused: SubagentsError, principal: str
    ) -> Envelope | None:
        """The answer standing for worker `principal`'s frame that `refused` for its protocol
        version (a worker of another release): an UnsupportedProtocol for the call it answers,
        for `answer` to pass on now instead of the call's timeout (None: no answer to a call,
        or refused for another reason; the gateway refuses the frame as it would any)."""
        if not isinstance(refused, UnsupportedProtocol):
            return None
        answer = in_other_version(frame, refused, f"worker {principal!r}", "its home", ONE_PROTOCOL)
        if answer is None:
            return None
        return Envelope(type=answer.type, body=answer.body, corr=answer.corr, sender=principal)

    def next_deadline(self) -> float | None:
        """Seconds until the earliest call runs out (None: nothing in flight)."""
        while self._deadlines and not self._due(*self._deadlines[0]):
            heapq.heappop(self._deadlines)  # answered already, or re-armed when sent
        if not self._deadlines:
            return None
        return max(0.0, self._deadlines[0][0] - time.monotonic())

    def expire(self) -> list[Outbound]:
        """Answer every call past its deadline `unavailable` (the worker did not answer)."""
        now = time.monotonic()
        out: list[Outbound] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, call_id = heapq.heappop(self._deadlines)
            if not self._due(deadline, call_id):
                continue
            call = self._calls.pop(call_id)
            if call.held is not None:
                self._held.get(call.host, set()).discard(call_id)
                err = call.held
            else:
                err = self._gave_up(call_id, call)
            out.append((call.via, call.client, encode_answer(call.request, err, self._node_id)))
        return out

    def _gave_up(self, call_id: str, call: _Call) -> OwnerUnavailable:
        """Why sent call `call_id` is answered without its worker's answer; one that changes
        something is kept for its late answer (its outcome is unknown, not "nothing done")."""
        request = call.request
        said = f"worker {call.host!r} did not answer {request.type} within {self._timeout_s:g}s"
        details: dict[str, Any] = {
            "owner": request.target,
            "state": "unreachable",
            "reason": "host_timeout",
            "host": call.host,
        }
        kind = REQUEST_BY_TYPE.get(request.type)
        if kind is None or resendable(kind):
            return OwnerUnavailable(said, **details)
        late = self._late[call_id] = _Late(call)
        self._forget_late(late.at)
        details["outcome"] = "unknown"
        if request.type != "runs.launch":
            return OwnerUnavailable(
                f"{said}: its outcome is unknown (the worker may still apply it); look before "
                "sending it again",
                **details,
            )
        session = late.session_id
        details["session_id"] = session
        return OwnerUnavailable(
            f"{said}: its outcome is unknown, the worker may still start the run (its slots "
            f"are then held in the home's ledgers like any run's); before launching again, "
            f"look for it on the home: subagents-node runs --session {session} "
            f"(client.hosts.runs(session_id={session!r}))",
            **details,
        )

    def _forget_late(self, now: float) -> None:
        """Drop the kept requests past `LATE_KEEP_S`, and the oldest past `late_limit`."""
        late = self._late
        while late:
            call_id, oldest = next(iter(late.items()))
            if len(late) <= self._late_limit and now - oldest.at < LATE_KEEP_S:
                return
            del late[call_id]
            log.info("host calls: no longer waiting for %s to answer %s", oldest.host, oldest.type)

    def _answered_late(self, reply: Envelope, principal: str) -> None:
        """A worker answered a request the home gave up on: it is settled as a timely answer
        would have been (its run recorded as placed), and logged; nobody waits for it."""
        late = self._late.get(reply.corr or "")
        if late is None or late.host != principal:
            return
        del self._late[reply.corr or ""]
        refusal = late.settle(reply.type, reply.body) if late.settle is not None else None
        run = reply.body.get("run")
        run_id = run.get("run_id") if isinstance(run, Mapping) else None
        late_s = time.monotonic() - late.at
        if reply.type == ERROR:
            log.warning(
                "worker %s answered %s (session %r) %.1fs after the home gave up on it: %s",
                late.host,
                late.type,
                late.session_id,
                late_s,
                reply.body.get("code"),
            )
        else:
            log.warning(
                "worker %s answered %s (session %r) %.1fs after the home gave up on it: it was "
                "applied%s%s",
                late.host,
                late.type,
                late.session_id,
                late_s,
                f", run {run_id} is on {late.host}" if run_id else "",
                f" (but: {refusal.message})" if refusal is not None else "",
            )

    def _due(self, deadline: float, call_id: str) -> bool:
        """Whether this heap entry is its call's current deadline."""
        call = self._calls.get(call_id)
        return call is not None and call.deadline == deadline


def _unreachable(refusal: SubagentsError | None) -> bool:
    """A member the home cannot reach now (not one unknown here, or forgotten: `lost`)."""
    return (
        isinstance(refusal, OwnerUnavailable)
        and refusal.details.get("reason") == "host_unreachable"
        and refusal.details.get("state") == "unreachable"
    )


def _hold_s(request: Envelope) -> float | None:
    """How long long poll `request` may be held (None: it is no long poll; answer now)."""
    if request.type not in HELD_WHILE_UNREACHABLE:
        return None
    wait = request.body.get("wait_s", 10.0)
    if isinstance(wait, bool) or not isinstance(wait, int | float):
        return None  # the worker would refuse it: so does the home, now
    if not 0.0 <= wait <= _MAX_HOLD_S:  # NaN fails both
        return None
    return float(wait)
