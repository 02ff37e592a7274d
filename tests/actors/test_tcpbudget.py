"""TcpBudget (actors/tcpbudget.py) on a real CURVE ROUTER on loopback, driven by a poll loop
of this thread as an owner's loop drives it: the connections it counts, the shed at its budget
(every connection closed, new ones refused), and the listener bound again after the pause."""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from subagents_node.actors.tcpbudget import (
    HANDSHAKE_MS,
    PAUSE_S,
    REPORT_S,
    Report,
    TcpBudget,
    tcp_listener,
)

LIMIT = 4


class Listener:
    def __init__(self, report: Report | None = None) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        tcp_listener(self.sock)
        public, secret = zmq.curve_keypair()
        self.sock.curve_server = True
        self.sock.curve_secretkey = secret
        self.sock.curve_publickey = public
        self.sock.bind("tcp://127.0.0.1:0")
        self.endpoint = str(self.sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self.port = int(self.endpoint.rsplit(":", 1)[1])
        self.poller = zmq.Poller()
        self.budget = TcpBudget(
            self.sock, [self.endpoint], self.poller, "test", limit=LIMIT, report=report
        )
        self.held: list[socket.socket] = []

    def pump(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        """Run the loop (poll, then the budget's turn) until `done()`, at most `timeout` s."""
        end = time.monotonic() + timeout
        while not done():
            left = end - time.monotonic()
            assert left > 0, "timed out"
            due = self.budget.next_deadline()
            wait = left if due is None else min(left, due)
            self.budget.handle(dict(self.poller.poll(int(wait * 1000) + 1)))

    def connect(self) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.held.append(conn)
        return conn

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.budget.close()
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def listener() -> Iterator[Listener]:
    made = Listener()
    yield made
    made.close()


def _closed_by_peer(conn: socket.socket) -> bool:
    """Whether the other end closed `conn` (read past libzmq's greeting to the end)."""
    conn.settimeout(5)
    try:
        while conn.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_tcp_listener_gets_a_short_handshake_limit(listener: Listener) -> None:
    assert listener.sock.getsockopt(zmq.HANDSHAKE_IVL) == HANDSHAKE_MS < 30_000


def test_connections_closed_by_their_peers_are_no_longer_counted(listener: Listener) -> None:
    for _ in range(LIMIT - 1):
        listener.connect()
    listener.pump(lambda: listener.budget.open == LIMIT - 1)
    for conn in listener.held:
        conn.close()
    listener.held.clear()
    listener.pump(lambda: listener.budget.open == 0)
    for _ in range(LIMIT - 1):
        listener.connect()
    listener.pump(lambda: listener.budget.open == LIMIT - 1)
    assert listener.budget.sheds == 0


def test_at_its_budget_the_listener_closes_every_connection_refuses_new_ones_then_listens_again(
    listener: Listener,
) -> None:
    flood = [listener.connect() for _ in range(LIMIT)]
    listener.pump(lambda: listener.budget.sheds == 1)
    assert all(_closed_by_peer(conn) for conn in flood)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", listener.port), timeout=5).close()
    started = time.monotonic()
    listener.pump(lambda: listener.budget.next_deadline() is None)
    assert time.monotonic() - started <= PAUSE_S + 1.0
    listener.connect()  # bound again, on the same port
    listener.pump(lambda: listener.budget.open == 1)
    assert listener.budget.sheds == 1


def test_a_shed_is_reported_at_once_and_a_moved_count_within_a_second_with_no_further_event() -> (
    None
):
    """What an owner tells the node for `status` (budget, open, sheds, last shed's time)."""
    reports: list[tuple[float, int, int, int, float | None]] = []
    listener = Listener(lambda *figures: reports.append((time.monotonic(), *figures)))
    try:
        began = time.time()
        flood = [listener.connect() for _ in range(LIMIT)]
        listener.pump(lambda: listener.budget.sheds == 1)
        _, budget, open_, sheds, last_shed = reports[-1]  # handed over in the shed's own pass
        assert (budget, open_, sheds) == (LIMIT, 0, 1)
        assert last_shed is not None and began <= last_shed <= time.time()
        for conn in flood:
            conn.close()
        listener.pump(lambda: listener.budget.next_deadline() is None)
        listener.connect()
        # The count moved less than REPORT_S after the last report: it goes out at the
        # budget's deadline, with no other event to wake the loop.
        listener.pump(lambda: reports[-1][2] == 1, timeout=REPORT_S + 5.0)
        assert reports[-1][1:4] == (LIMIT, 1, 1) and reports[-1][4] == last_shed
        moves = [at for at, _, _, sheds, _ in reports if sheds == 1]
        assert all(b - a >= REPORT_S * 0.99 for a, b in itertools.pairwise(moves))
    finally:
        listener.close()
