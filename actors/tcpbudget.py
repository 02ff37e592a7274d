"""TcpBudget: how many tcp connections one bound ROUTER may hold at once, and the shed past it.

Owns a ZeroMQ monitor of one CURVE ROUTER, the count of tcp connections open on it, and whether
its tcp endpoints are bound. libzmq spends a descriptor on every tcp connection it accepts
before any key is checked, and while its tcp accept survives EMFILE its ipc accept asserts on
it: once idle tcp peers hold every descriptor, the next ipc connection (any CLI command, any
client) aborts the whole process. So when the count reaches the budget (half the process's soft
RLIMIT_NOFILE less a reserve, computed once) every tcp endpoint is unbound, which closes each
connection accepted on it (authenticated peers reconnect by themselves), and bound again once
the listeners have closed and PAUSE_S has passed, or after HOLD_S whatever the monitor said.
Its figures (budget, open, sheds, the time of the last shed) are what `status` and `doctor`
show of the listener; a listener in another process than the node's hands them to `report`,
at once on a shed and otherwise at most once per REPORT_S while the count moves.

It lives in the thread of the loop that polls the socket: its monitor is registered in that
loop's poller, and the loop polls no longer than `next_deadline` (no thread, no timer of its
own). It never reads or sends a message on the socket it watches.
"""

from __future__ import annotations

import logging
import resource
import struct
import time
from collections.abc import Callable

import zmq

log = logging.getLogger(__name__)

#: How long a tcp connection may take to finish its ZMTP/CURVE handshake (libzmq's default is
#: 30 s). A handshake on a LAN takes milliseconds; a silent connection costs a descriptor until
#: then.
HANDSHAKE_MS = 5_000
#: Descriptors kept out of the budget for everything else (ipc clients, databases, children).
RESERVE = 64
#: How long the endpoints stay unbound after a shed (connections meet a refusal meanwhile).
PAUSE_S = 1.0
#: ...and at most this long, even if the monitor never reports the listeners closed.
HOLD_S = 10.0
#: How often at most a moving count of open connections is handed to `report`.
REPORT_S = 1.0
_WATCHED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
#: Monitor events read per pass (one per connection opened or closed).
_READ_MAX = 1024


def tcp_listener(sock: zmq.Socket[bytes]) -> None:
    """Options of a tcp ROUTER, set before it binds (a listener copies them at bind)."""
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)


def budget_for(soft: int) -> int:
    """The tcp connections a process whose soft limit on open files is `soft` may hold."""
    if soft == resource.RLIM_INFINITY or soft < 0:
        soft = 1 << 20
    return max(8, soft // 2 - RESERVE)


#: What a TcpBudget hands its `report`: its budget, connections open, sheds, last shed's time.
Report = Callable[[int, int, int, float | None], None]


def earliest(*waits: float | None) -> float | None:
    """The shortest of the waits given (None: none)."""
    known = [w for w in waits if w is not None]
    return min(known) if known else None


class TcpBudget:
    def __init__(
        self,
        sock: zmq.Socket[bytes],
        endpoints: list[str],
        poller: zmq.Poller,
        name: str,
        limit: int | None = None,
        report: Report | None = None,
    ) -> None:
        """Watch `sock`, already bound to the tcp `endpoints` (as resolved: LAST_ENDPOINT)."""
        self._sock = sock
        self.endpoints = list(endpoints)
        self.name = name
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.limit = budget_for(soft) if limit is None else limit
        self._monitor: zmq.Socket[bytes] = sock.get_monitor_socket(_WATCHED)
        self._poller = poller
        poller.register(self._monitor, zmq.POLLIN)
        #: tcp connections open now (as the monitor reported them while bound).
        self.open = 0
        #: How many times the endpoints were unbound for holding too many connections.
        self.sheds = 0
        #: When the last shed happened (time.time()); None: never.
        self.last_shed: float | None = None
        self._report = report
        #: (open, sheds) as last reported, and when the next report of a moved count may go.
        self._reported = (0, 0)
        self._report_at = 0.0
        self._unbound: list[str] = []
        #: Listeners unbound whose close the monitor has not reported yet: its events until
        #: then are of connections already gone.
        self._closing = 0
        self._pause_until = 0.0
        self._hold_until = 0.0

    def next_deadline(self) -> float | None:
        """Seconds until the endpoints are due to be bound again, or a moved count is due to
        be reported (None: neither)."""
        dues = [self._report_at] if self._report_pending() else []
        if self._unbound:
            dues.append(self._bind_at())
        return max(0.0, min(dues) - time.monotonic()) if dues else None

    def handle(self, events: dict[object, int]) -> None:
        """After each poll of the loop: read the monitor's events, bind again when due."""
        if events.get(self._monitor):
            self._read()
        if self._unbound and self._bind_at() <= time.monotonic():
            self._bind()
        if self._report_pending() and (
            self.sheds != self._reported[1] or time.monotonic() >= self._report_at
        ):
            self.report()

    def report(self) -> None:
        """Hand the figures to `report` now (also once at the start: the budget)."""
        if self._report is not None:
            self._reported = (self.open, self.sheds)
            self._report_at = time.monotonic() + REPORT_S
            self._report(self.limit, self.open, self.sheds, self.last_shed)

    def _bind_at(self) -> float:
        return self._hold_until if self._closing else self._pause_until

    def _report_pending(self) -> bool:
        return self._report is not None and (self.open, self.sheds) != self._reported

    def close(self) -> None:
        self._poller.unregister(self._monitor)
        self._sock.disable_monitor()
        self._monitor.close(linger=0)

    def _read(self) -> None:
        for _ in range(_READ_MAX):
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # (event id, value) in native order; not zmq.utils.monitor, which loads asyncio.
            event = struct.unpack_from("=H", frames[0])[0]
            if event == zmq.EVENT_CLOSED:
                self._closing = max(0, self._closing - 1)
            elif self._closing or self._unbound:
                continue  # a connection of a listener since unbound: closed with it
            elif event == zmq.EVENT_ACCEPTED:
                self.open += 1
                if self.open >= self.limit:
                    self._shed()
            elif event == zmq.EVENT_DISCONNECTED:
                self.open = max(0, self.open - 1)

    def _shed(self) -> None:
        for endpoint in self.endpoints:
            try:
                self._sock.unbind(endpoint)
            except zmq.ZMQError as exc:
                log.warning("%s: could not unbind %s: %s", self.name, endpoint, exc)
                continue
            self._unbound.append(endpoint)
            self._closing += 1
        self.sheds += 1
        self.last_shed = time.time()
        log.warning(
            "%s: %d tcp connections open at once, its budget under a limit of %d open files: "
            "closed them all and unbound %s for %.0f s (shed %d; authenticated peers reconnect)",
            self.name,
            self.open,
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            " ".join(self.endpoints),
            PAUSE_S,
            self.sheds,
        )
        self.open = 0
        now = time.monotonic()
        self._pause_until = now + PAUSE_S
        self._hold_until = now + HOLD_S

    def _bind(self) -> None:
        self._closing = 0
        failed: list[str] = []
        for endpoint in self._unbound:
            try:
                self._sock.bind(endpoint)
            except zmq.ZMQError as exc:  # the port taken meanwhile: try again after a pause
                log.warning("%s: could not bind %s again: %s", self.name, endpoint, exc)
                failed.append(endpoint)
        self._unbound = failed
        now = time.monotonic()
        self._pause_until = self._hold_until = now + PAUSE_S
        if not failed:
            log.info("%s: listening on %s again", self.name, " ".join(self.endpoints))
