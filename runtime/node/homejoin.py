"""HomeJoin: a worker node's join to its home, as the node wires it (DESIGN §1 "Multi-host").

Owns, for the node's lifetime, the worker's link to its home (runtime/node/homelink.py: joined
at start, a refusal being the start's failure, started once the node serves, stopped with it),
the CURVE keys the worker's links to the home's owners offer, the link's latest state (read by
the forwarder and the gateway's relay) and the route to each of the home's owners; told that the
operator forgot this worker, the ask that its run supervisor stop the runs whose slots the home
released, pending until the supervisor answers it (sent when it is ready, and again each time it
becomes ready: no timer). On a node that joins no home it holds no link: the state stays
`joined` and every route is the home's.
It never forwards a request itself (runtime/node/forwarder.py, relay.py), never decides what
the worker serves the home (runtime/node/homeasks.py), never writes the address book, and never
asks the run supervisor for a stop once the node stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from subagents_node.actors.links import RemoteKeys
from subagents_node.actors.owner import Outcome
from subagents_node.client.keys import client_credentials
from subagents_node.client.listing import Listing, every_run_plan
from subagents_node.client.plans import Ask, Plan
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.supervisor import RunList, StopReleased
from subagents_node.node.dispatch import Dispatcher
from subagents_node.node.homeasks import HomeAsks
from subagents_node.node.homelink import HomeLink

log = logging.getLogger(__name__)

#: The error a run of a forgotten worker ends `stopped` with (`runs.stop_released`).
FORGOTTEN_STOP = (
    "Stopped: this worker was forgotten by its home {home} (`nodes forget`{why}) while it was "
    "cut off; its capacity slots were released there, so its children could not go on."
)


class HomeJoin:
    """A worker's link to the home at `home` (a tcp endpoint; "" on a node that is no worker)."""

    def __init__(self, home: str, dispatcher: Dispatcher, node_id: str) -> None:
        self.home = home
        self.link: HomeLink | None = None
        self.keys: RemoteKeys | None = None
        self._dispatcher = dispatcher
        self._node_id = node_id
        self._state: tuple[str, str] = ("joined", "")
        #: Told (from the link's thread) when the home is lost (silent for the membership's
        #: timeout, or refusing this worker): what is in flight to it is answered then, not at
        #: its deadline.
        self._on_lost: list[Callable[[str], None]] = []
        #: A forgotten worker's stop (`runs.stop_released`) until its run supervisor answers
        #: it with its RunList; whether it is in flight, whether that supervisor is ready now,
        #: and how often it became ready (an answer tells whether it did while in flight).
        #: Written from the link's, the owners' and the forwarder's threads: under the lock.
        self._lock = threading.Lock()
        self._pending: StopReleased | None = None
        self._in_flight = False
        self._ready = False
        self._readied = 0
        self._stopping = False

    def join(self, state_dir: Path, home_key: str, name: str, client_key: str) -> None:
        """A worker's first step: join its home (a refusal is this start's failure)."""
        creds = client_credentials(state_dir, home_key, client_key or None)
        self.keys = RemoteKeys(creds.client.public, creds.client.secret, creds.server_public)
        link = HomeLink(
            self.home,
            creds,
            name,
            self._on_state,
            counts=self._worker_counts,
            serve=HomeAsks(self._dispatcher, self._node_id),
            on_lost=self._lost,
            on_forgotten=self._forgotten,
        )
        self.link = link
        try:
            link.join()
        except SubagentsError:
            link.stop()
            self.link = None
            raise

    def start(self, zctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        """Heartbeat and serve the home, once the node serves (no-op unless joined)."""
        if self.link is not None:
            self.link.start(zctx)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True  # no stop is asked of the run supervisor from now on
        if self.link is not None:
            self.link.stop()

    def state(self) -> tuple[str, str]:
        """How the home is (joined, unreachable, fenced) and why, as the link last said."""
        return self._state

    def when_lost(self, lost: Callable[[str], None]) -> None:
        """Call `lost(why)` each time the link finds the home lost (before `start`)."""
        self._on_lost.append(lost)

    def _on_state(self, state: str, reason: str) -> None:
        """The home link's thread says how the home is; the forwarder and the gateway's relay
        read it (one tuple, replaced whole: no lock needed)."""
        self._state = (state, reason)

    def _lost(self, why: str) -> None:
        """The home link's thread: the home is lost (silent for the membership's timeout, or
        refusing this worker). What the forwarder and the relay have in flight to it is failed
        now: the home will not answer it, and a caller should not wait out its deadline."""
        for lost in self._on_lost:
            lost(why)

    def runs_ready(self, ready: bool) -> None:
        """The node's word (from the thread that supervises the owners, at each change, and
        the node's own once it serves) on whether its run supervisor is ready (`running`).
        Becoming ready is the event that sends a forgotten worker's pending stop again."""
        with self._lock:
            became = ready and not self._ready
            self._ready = ready
            if became:
                self._readied += 1
        if became:
            self._send_stop()

    def _forgotten(self, forget_reason: str) -> None:
        """The home link's thread: the operator forgot this worker while it was cut off, and
        the home released the slots of its runs (R-CAP-1: the home's ledger is the truth).
        Their children must not run on past their sessions' limits: the run supervisor stops
        every run that holds a slot, saying why. The worker stays fenced until it is started
        again with --join."""
        why = f": {forget_reason}" if forget_reason else ""
        with self._lock:
            self._pending = StopReleased(reason=FORGOTTEN_STOP.format(home=self.home, why=why))
        self._send_stop()

    def _send_stop(self) -> None:
        """Ask the run supervisor to stop the runs (any thread), if a stop is pending, none is
        in flight, the supervisor is ready and the node is not stopping. Asked again only on
        an event: the supervisor becoming ready (`runs_ready`), or an answer that is not its
        RunList when it became ready meanwhile. A supervisor that restarted with the ask in
        flight, or that was not ready, is asked once it is; the ask is idempotent (a run
        stopping already is left as it is)."""
        with self._lock:
            request = self._pending
            if self._stopping or request is None or self._in_flight or not self._ready:
                return
            self._in_flight = True
            sent_at = self._readied

        def answered(outcome: Outcome) -> None:
            with self._lock:
                self._in_flight = False
                if isinstance(outcome, RunList):
                    self._pending = None
                again = self._readied != sent_at  # it became ready since: that event passed
            if isinstance(outcome, RunList):
                ids = ", ".join(view.run_id for view in outcome.runs) or "none"
                log.warning("forgotten by the home: stopped its slot-holding runs: %s", ids)
                return
            log.warning(
                "forgotten by the home: its runs are not stopped yet (%s); asked again once "
                "its run supervisor is ready",
                outcome,
            )
            if again:
                self._send_stop()

        log.info("forgotten by the home: asking its run supervisor to stop its slot-holding runs")
        try:
            self._dispatcher.dispatch(request, "", answered)
        except SubagentsError as exc:
            answered(exc)

    def _worker_counts(self, done: Callable[[tuple[int, int]], None]) -> None:
        """What this worker runs, for the home: every active run and their running children,
        however many pages of the run supervisor's listing that takes (one page holds at most
        1,000 runs). `done` is called with the counts once the last page is in, from that
        reply's thread; a page that fails leaves it uncalled (the last counts stand)."""
        listing = every_run_plan(active_only=True, bound=None)  # all of them, not a page
        self._ask_next(listing, next(listing), done)

    def _ask_next(
        self, listing: Plan[Listing], ask: Ask[Any], done: Callable[[tuple[int, int]], None]
    ) -> None:
        """Send the listing's next page request; its reply sends the one after, from the
        reply's thread (the dispatcher's routes take requests from any thread), until the
        listing returns."""

        def paged(outcome: Outcome) -> None:
            if not isinstance(outcome, RunList):
                listing.close()  # refused or unanswered: no partial count reaches the home
                return
            try:
                following = listing.send(outcome)
            except StopIteration as end:
                runs = end.value.runs
                done((len(runs), sum(1 for r in runs for c in r.children if c.state == "running")))
                return
            try:
                self._ask_next(listing, following, done)
            except SubagentsError:  # the node is stopping: the last counts stand
                listing.close()

        self._dispatcher.dispatch(ask.request, "", paged)

    def owner_route(self, target: str) -> str:
        """A worker's route to the home's owner `target`: its own tcp port on the host the
        worker joined, as the home said at the join; else the home's endpoint (its gateway
        relays)."""
        link = self.link
        port = link.membership.owner_ports.get(target) if link and link.membership else None
        if port is None:
            return self.home
        host = self.home.removeprefix("tcp://").rpartition(":")[0]
        return f"tcp://{host}:{port}"
