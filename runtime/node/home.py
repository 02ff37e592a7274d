"""HomeService: what a home node serves and checks for its workers (DESIGN §1 "Multi-host").

Owns the home's Members (runtime/node/members.py) and the lock that serialises them: the
gateway's thread calls `admit` on every tcp request and `serve` for `node.members.*`, and an
embedded home's in-process client may call `serve` from its own thread. `admit` refuses a
forgotten worker everything but a new join, refuses a worker's key the runs it did not place
through this home (`not_placed_by_you`) and stamps a worker's name as the `host` of what it
asks the ledgers. `settler` gives the gateway what a worker's placed request's answer changes
before it goes on: a launch's run is recorded as that worker's (runtime/node/placed.py). `serve`
answers joins, heartbeats, leaves, the listing (with each node's slots, asked of the capacity
owner) and forget (whose slot release it asks of the capacity owner).

It never writes a ledger itself; it asks the capacity owner through `submit`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from subagents_node.actors.outcomes import Outcome, ReplyFn, store_full
from subagents_node.actors.peergate import stamp_host
from subagents_node.messages.base import Ack, Message, Request
from subagents_node.messages.capacity import CAPACITY
from subagents_node.messages.capacity_hosts import HostSlots, ReleaseHost
from subagents_node.messages.envelope import ERROR, REPLY
from subagents_node.messages.errors import (
    BadRequest,
    MembershipRefused,
    StoreError,
    SubagentsError,
)
from subagents_node.messages.members import (
    HOME_NAME,
    MemberForget,
    MemberHeartbeat,
    MemberJoin,
    MemberLeave,
    MemberList,
)
from subagents_node.messages.peers import OwnerPeers
from subagents_node.messages.supervisor import Launch, Show, Stop, Watch
from subagents_node.node import roles
from subagents_node.node.hostcalls import Settle
from subagents_node.node.members import DB_NAME, Members, forgotten, slots_merged

log = logging.getLogger(__name__)

#: What a worker may have the home carry to another worker: a nested child's launch (it
#: carries its run tree's fan-out descriptor, so the tree's budget at the home admits it) and
#: what the child's `run` follows it with, for that run only (`not_placed_by_you` for any
#: other: runtime/node/placed.py). Nothing else: a worker never runs a top-level run, or
#: anything but a run, on another host.
PLACEABLE = frozenset({"runs.launch", "runs.watch", "runs.show", "runs.stop"})
#: What a worker may ask of the home node itself, besides its ledgers and `PLACEABLE`: its
#: key speaks for that worker alone, never as the home's operator (no stop of the home, no
#: top-level run on it, no listing of other hosts' runs).
WORKER_NODE_TYPES = frozenset({"node.ping", "node.members.heartbeat", "node.members.leave"})
#: Hands a request to an owner (the forwarder's `submit`): (request, target, reply).
Submit = Callable[[Request, str, ReplyFn], None]


class HomeService:
    def __init__(
        self,
        state_dir: Path,
        home_node_id: str,
        heartbeat_s: float,
        timeout_s: float,
        submit: Submit,
        tcp_endpoints: Callable[[], list[str]],
        owner_ports: dict[str, int] | None = None,
        allowed: Callable[[], dict[str, str]] = dict,
        tell: Callable[[OwnerPeers], None] = lambda table: None,
    ) -> None:
        self._path = str(state_dir / DB_NAME)
        self._members = Members(state_dir, home_node_id, heartbeat_s, timeout_s, owner_ports)
        self._lock = threading.Lock()
        self._submit = submit
        self._tcp_endpoints = tcp_endpoints
        #: The allow-list (name -> key), and how the ledger owners are told who may reach
        #: their own tcp sockets: after each join and forget (before its answer), and on
        #: `tell_owners` (an owner started, a key was allowed or revoked).
        self._allowed = allowed
        self._tell = tell

    def close(self) -> None:
        self._members.close()

    def admit(self, request: Request, principal: str, host: str = HOME_NAME) -> Request:
        """The gateway's check of a tcp request for `host` (the home itself, or the worker it
        is to carry it to): a forgotten worker is refused (but may join again), a worker asks
        only what a worker may (`WORKER_SCOPE`: its ledgers, its membership, a nested child's
        run, and only the runs it placed), and a worker's name is the `host` of what it asks
        (it can neither hide nor spoof where a slot is held)."""
        if isinstance(request, MemberJoin):
            return request
        with self._lock:
            if self._members.fenced(principal):
                raise self._members.fenced_error(principal)
            member = self._members.is_member(principal)
            ledger = request.target in roles.REMOTE_OWNERS
            if member and not ledger and request.type not in WORKER_NODE_TYPES:
                _check_placeable(request)
                if isinstance(request, Watch | Show | Stop):
                    self._check_placed_by(principal, host or HOME_NAME, request.run_id)
        return stamp_host(request, principal, member)

    def _check_placed_by(self, principal: str, host: str, run_id: str) -> None:
        try:
            mine = self._members.placed.placed_by(principal, host, run_id)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: {exc}", path=self._path) from None
        if not mine:
            raise BadRequest(
                f"run {run_id!r} on host {host!r} was not placed by worker {principal!r} "
                "through this home: a worker's key follows only the runs it placed (by their "
                "full id)",
                reason="not_placed_by_you",
                run_id=run_id,
                host=host,
            )

    def settler(self, request: Request, principal: str, host: str = HOME_NAME) -> Settle | None:
        """What the answer to worker `principal`'s `request` for `host` changes here before it
        goes on (None: nothing): a nested launch's run is recorded as placed by that worker
        (if it cannot be, the worker gets the store's error instead: it could never follow the
        run), and a run its host no longer has is dropped from the record."""
        host = host or HOME_NAME
        if not isinstance(request, Launch | Watch | Show | Stop):
            return None  # the ledgers' requests, first of all: no lock taken for them
        with self._lock:
            if not self._members.is_member(principal):
                return None
        if isinstance(request, Launch):
            return lambda kind, body: self._launched(principal, host, kind, body)
        run_id = request.run_id
        return lambda kind, body: self._followed(host, run_id, kind, body)

    def _launched(
        self, principal: str, host: str, kind: str, body: Mapping[str, Any]
    ) -> SubagentsError | None:
        run = body.get("run") if kind == REPLY else None
        run_id = run.get("run_id") if isinstance(run, Mapping) else None
        if not isinstance(run_id, str) or not run_id:
            return None  # refused, or no run in it: nothing to follow
        try:
            with self._lock:
                self._members.placed.record(principal, host, run_id)
        except Exception as exc:  # members.db failed under us: a full disk, a bad file
            # Not StoreFull: that says nothing changed, and the run was launched.
            log.exception("members: recording run %s placed by %s failed", run_id, principal)
            return StoreError(
                f"run {run_id} was launched on host {host!r} but the home could not record it "
                f"as placed by {principal!r} ({exc}), so this worker cannot follow it; the "
                "home's operator may stop it",
                path=self._path,
                run_id=run_id,
                host=host,
            )
        return None

    def _followed(
        self, host: str, run_id: str, kind: str, body: Mapping[str, Any]
    ) -> SubagentsError | None:
        if kind == ERROR and body.get("code") == "run_not_found":
            try:  # pruned on its host: its record goes too (retention)
                with self._lock:
                    self._members.placed.gone(host, run_id)
            except sqlite3.Error as exc:  # the answer still goes on; the row stays
                log.warning("members: cannot drop placed run %s on %s: %s", run_id, host, exc)
        return None

    def tell_owners(self) -> None:
        with self._lock:
            table = self._table()
            try:  # a name no longer allowed (its key revoked) loses what it placed
                self._members.placed.keep_only(table.allowed)
            except sqlite3.Error as exc:
                log.warning("members: cannot drop placed runs of revoked keys: %s", exc)
        self._tell(table)

    def _table(self) -> OwnerPeers:
        """What the ledger owners' own tcp sockets must know: keys, members, fenced names."""
        members, fenced = self._members.standing()
        return OwnerPeers(allowed=self._allowed(), members=members, fenced=fenced)

    def check_placement(self, request: Request, principal: str) -> None:
        """Refuse what worker `principal` may not have carried to another worker."""
        with self._lock:
            member = self._members.is_member(principal)
        if not member:
            raise MembershipRefused(
                f"{principal!r} is no member of this home: it places nothing on its workers",
                name=principal,
                reason="not_member",
            )
        _check_placeable(request)

    def unreachable(self, name: str) -> SubagentsError | None:
        """Why a local client's request cannot be carried to worker `name` now (None: it can)."""
        with self._lock:
            return self._members.unreachable(name)

    def awaited_s(self, name: str) -> float:
        """How long a request for worker `name` may wait for its first heartbeat (0: none)."""
        with self._lock:
            return self._members.awaited_s(name)

    def serve(self, request: Request, principal: str | None, reply: ReplyFn) -> None:
        """node.members.*, answered through `reply` (at once, or once capacity answered)."""
        try:
            with self._lock:
                self._serve(request, principal, reply)
        except SubagentsError as err:
            reply(err)
        except Exception as exc:  # members.db failed under us: a full disk, a bad file
            log.exception("members: %s failed", request.type)
            reply(store_full(exc, "node") or StoreError(f"{self._path}: {exc}", path=self._path))

    def _serve(self, request: Request, principal: str | None, reply: ReplyFn) -> None:
        members = self._members
        if isinstance(request, MemberJoin | MemberHeartbeat | MemberLeave):
            if principal is None:  # the gateway lets these in on tcp only
                raise BadRequest(f"{request.type} names a tcp peer", reason="peer_only")
            if isinstance(request, MemberJoin):
                joined = members.join(request, principal)
                self._tell(self._table())
                reply(joined)
            elif isinstance(request, MemberLeave):
                members.leave(request, principal)
                log.info("worker %s left (a clean stop)", request.name)
                reply(Ack())
            else:
                reply(members.heartbeat(request, principal))
        elif isinstance(request, MemberList):
            listing = members.listing(",".join(self._tcp_endpoints()))
            # Without the capacity owner's answer the listing still goes out (slots unknown).
            self._submit(HostSlots(), CAPACITY, lambda held: reply(slots_merged(listing, held)))
        elif isinstance(request, MemberForget):
            generation, at = members.forget(request)
            # The owners fence it first: the release below reaches capacity after the word.
            self._tell(self._table())
            release = ReleaseHost(
                host=request.name, reason=request.reason, operator="subagents-node nodes forget"
            )
            self._ask_capacity(
                release, reply, lambda done: forgotten(request.name, generation, at, done)
            )
        else:
            raise BadRequest(f"the home does not serve {request.type}", reason="wrong_target")

    def _ask_capacity(
        self, request: Request, reply: ReplyFn, answer: Callable[[Message], Outcome]
    ) -> None:
        """Send `request` to the capacity owner; reply with `answer(result)`, or its error."""

        def answered(outcome: Outcome) -> None:
            reply(outcome if isinstance(outcome, SubagentsError) else answer(outcome))

        self._submit(request, CAPACITY, answered)


def _check_placeable(request: Request) -> None:
    """Refuse what a worker may not have run on another host (the home included)."""
    nested = not isinstance(request, Launch) or request.inherited_fanout is not None
    if request.type not in PLACEABLE or not nested:
        raise BadRequest(
            f"a worker may place only a nested child's run on another host (and follow it); "
            f"not {request.type}" + ("" if nested else " of a top-level run"),
            reason="not_placeable",
        )
