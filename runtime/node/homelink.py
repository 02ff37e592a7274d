"""HomeLink: a worker node's membership in its home (DESIGN §1 "Multi-host").

Owns the worker's side of membership: the join at start (refused joins are the worker's start
failing with the home's typed reason), then one thread that heartbeats at the interval the home
gives and tells the forwarder the link's state (joined, unreachable, fenced), so that
admissions fail closed at once while the home cannot be reached or has fenced this worker.
The heartbeat says how many runs and children this worker has (asked of its own run
supervisor). A heartbeat refused as `fenced` (the operator forgot this worker, or
a newer start of it joined) leaves the worker fenced: it stops forwarding for good, until it is
started again with `--join`.

It never decides admissions itself and never writes a ledger; it talks to the home's node only
(`node.members.*`), over its own CURVE connection.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable

from subagents_node.client.keys import ClientCredentials
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.constants import version
from subagents_node.messages.errors import MembershipRefused, SubagentsError
from subagents_node.messages.members import MemberHeartbeat, MemberJoin, Membership
from subagents_node.messages.node import ClusterStatus

log = logging.getLogger(__name__)

#: How long a worker waits for its home to answer the join at start.
JOIN_TIMEOUT_S = 10.0
#: How often the counts a heartbeat carries are asked of the run supervisor again: a listing
#: of every active run is far more work than a beat, and `nodes` needs no fresher figure.
COUNTS_EVERY_S = 5.0


class HomeLink:
    def __init__(
        self,
        home: str,
        credentials: ClientCredentials,
        name: str,
        on_state: Callable[[str, str], None],
        counts: Callable[[], tuple[int, int]] = lambda: (0, 0),
    ) -> None:
        self.home = home
        self.name = name
        self.instance = uuid.uuid4().hex
        self._transport = ZmqTransport(home, credentials=credentials, sender=f"worker-{name}")
        self._on_state = on_state
        self._counts = counts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.membership: Membership | None = None
        self.state = "joining"  # joined | unreachable | fenced
        self.reason = ""
        self.last_ok: float | None = None
        self._counted: tuple[float, tuple[int, int]] = (float("-inf"), (0, 0))

    def join(self, timeout_s: float = JOIN_TIMEOUT_S) -> Membership:
        """Join the home (raises its typed refusal, or a NodeError when it cannot be reached)."""
        request = MemberJoin(name=self.name, instance=self.instance, version=version())
        result = self._transport.call(request, timeout_s)
        assert isinstance(result, Membership)
        self.membership = result
        self.state, self.last_ok = "joined", time.time()
        log.info("joined home %s as %s (generation %d)", self.home, self.name, result.generation)
        return result

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="subagents-home", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._transport.close()

    def status(self) -> ClusterStatus:
        member = self.membership
        return ClusterStatus(
            role="worker",
            name=self.name,
            home=self.home,
            state=self.state,
            reason=self.reason,
            generation=member.generation if member else 0,
            last_heartbeat_ok=self.last_ok,
        )

    def _run(self) -> None:
        # A timed wait on the stop event is the heartbeat's clock, not a poll: each wake-up
        # is one heartbeat, and a stop ends the wait at once.
        while self.membership is not None and not self._stop.wait(self.membership.heartbeat_s):
            self._beat(self.membership)
            if self.state == "fenced":
                return

    def _beat(self, member: Membership) -> None:
        runs, children = self._current_counts()
        request = MemberHeartbeat(
            name=self.name,
            instance=self.instance,
            generation=member.generation,
            runs=runs,
            children=children,
        )
        try:
            answer = self._transport.call(request, member.heartbeat_s)
        except MembershipRefused as err:
            self._set("fenced", err.message)
            log.error("home %s fenced this worker: %s", self.home, err.message)
            return
        except SubagentsError as err:  # a NodeError (timeout, refused key) or the home's
            self._set("unreachable", err.message)
            # The next beat goes out on a fresh connection: one that stalled in a partition
            # would otherwise wait out TCP's retransmission backoff after the link is back.
            self._transport.reset()
            return
        if isinstance(answer, Membership):
            self.membership = answer
        self.last_ok = time.time()
        self._set("joined", "")

    def _current_counts(self) -> tuple[int, int]:
        at, counts = self._counted
        now = time.monotonic()
        if now - at >= COUNTS_EVERY_S:
            with contextlib.suppress(SubagentsError):  # restarting: the last counts stand
                counts = self._counts()
            self._counted = (now, counts)
        return counts

    def _set(self, state: str, reason: str) -> None:
        if state != self.state:
            log.warning("home %s: %s -> %s %s", self.home, self.state, state, reason)
        self.state, self.reason = state, reason
        self._on_state(state, reason)
