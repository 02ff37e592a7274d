"""TcpBudget (actors/tcpbudget.py) on a real CURVE ROUTER on loopback, driven by a poll loop
of this thread as an owner's loop drives it: the connections it counts, the shed at its budget
(every connection closed, new ones refused), and the listener bound again after the pause."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from subagents_node.actors.tcpbudget import HANDSHAKE_MS, PAUSE_S, TcpBudget, tcp_listener

LIMIT = 4


class Listener:
    def __init__(self) -> None:
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
        self.budget = TcpBudget(self.sock, [self.endpoint], self.poller, "test", limit=LIMIT)
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
