"""Request/reply round trip through a real node process, beside a bare pyzmq REQ/REP echo.

Three request paths, each with 1, 4 and 16 client processes in the same run:
- floor: a REQ client and a REP echo server process (pyzmq only, the same frame size as a
  ping envelope): what ZeroMQ and Python cost before any of our code runs;
- node.ping: our client, the gateway's decode + validate, answered by the gateway itself;
- debug.sleep ms=0 to "capacity": the full path through the dispatcher, an owner actor's
  SAVEPOINT + group commit, and the reply hand-off back to the I/O thread (needs --faults).
Plus the codec alone (encode, decode + validate) in this process, against the ping's p50.
Fixed request counts, so every run is bounded (a few seconds each on 2 cores).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event
from pathlib import Path

import zmq

from bench.common import (
    Call,
    ClientFactory,
    Measurement,
    detached_node,
    markdown_table,
    measure,
)
from subagents_node.messages.base import Ack
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.envelope import Envelope
from subagents_node.messages.node import DebugSleep
from subagents_node.messages.protocol import parse_request

#: Requests per client process, by client count: bounded work, roughly equal wall time.
COUNTS = {1: 4000, 4: 1500, 16: 400}
PING_FRAME = encode(Envelope(type="node.ping", body={}, sender="client-00000"))


# -- the floor: bare REQ/REP ---------------------------------------------------------------------


def _echo_server(address: str, ready: Event) -> None:
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = zctx.socket(zmq.REP)
    sock.bind(address)
    ready.set()
    while True:  # ended by terminate(): the floor has no protocol, not even a stop message
        sock.send(sock.recv())


@contextlib.contextmanager
def echo_server() -> Iterator[str]:
    directory = Path(tempfile.mkdtemp(prefix="sa-echo-", dir="/tmp"))
    address = f"ipc://{directory}/echo.sock"
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    proc = spawn.Process(target=_echo_server, args=(address, ready), daemon=True)
    proc.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the echo server did not start")
        yield address
    finally:
        proc.terminate()
        proc.join(10)
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()


def floor_client(address: str) -> tuple[Call, Callable[[], None]]:
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = zctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)

    def call() -> bytes:
        sock.send(PING_FRAME)
        return sock.recv()

    def close() -> None:
        sock.close()
        zctx.term()

    return call, close


# -- through the node ---------------------------------------------------------------------------


def ping_client(address: str) -> tuple[Call, Callable[[], None]]:
    from subagents_node.client.client import connect

    client = connect(address)
    return client.ping, client.close


def actor_client(address: str) -> tuple[Call, Callable[[], None]]:
    from subagents_node.client.client import connect

    client = connect(address)
    request = DebugSleep(ms=0)
    return lambda: client.ask(request, Ack, target="capacity"), client.close


# -- the run --------------------------------------------------------------------------------------


def _run_all(floor: str, node: str) -> list[tuple[str, Measurement]]:
    paths: list[tuple[str, str, ClientFactory]] = [
        ("floor: pyzmq REQ/REP echo", floor, floor_client),
        ("node.ping (gateway)", node, ping_client),
        ("debug.sleep 0 (actor + commit)", node, actor_client),
    ]
    runs = []
    for clients, count in COUNTS.items():
        for name, address, factory in paths:
            runs.append((name, measure(name, factory, address, clients, count)))
    return runs


def _codec_us(repeat: int = 20_000) -> dict[str, float]:
    env = Envelope(type="node.ping", body={})
    frame = encode(env)
    timings = {}
    t0 = time.perf_counter()
    for _ in range(repeat):
        encode(env)
    timings["encode"] = (time.perf_counter() - t0) / repeat * 1e6
    t0 = time.perf_counter()
    for _ in range(repeat):
        decoded = decode(frame)
        parse_request(decoded.type, decoded.body)
    timings["decode + validate"] = (time.perf_counter() - t0) / repeat * 1e6
    return timings


def main() -> str:
    with echo_server() as floor, detached_node("--faults") as node:
        runs = _run_all(floor, node)
    floor_by_clients = {m.clients: m for name, m in runs if name.startswith("floor")}
    rows = []
    for name, m in runs:
        base = floor_by_clients[m.clients]
        rows.append(
            [
                name,
                m.clients,
                m.requests,
                m.percentile_us(50),
                m.percentile_us(99),
                m.throughput,
                m.percentile_us(50) / base.percentile_us(50),
                m.throughput / base.throughput,
            ]
        )
    table = markdown_table(
        [
            "path",
            "client procs",
            "requests",
            "p50 µs",
            "p99 µs",
            "req/s",
            "p50 ÷ floor",
            "req/s ÷ floor",
        ],
        rows,
    )
    codec = _codec_us()
    ping_p50 = next(m.percentile_us(50) for name, m in runs if "ping" in name and m.clients == 1)
    codec_rows = [[step, us, us / ping_p50 * 100] for step, us in codec.items()]
    codec_table = markdown_table(
        ["codec step (in-process)", "µs", "% of 1-client ping p50"], codec_rows
    )
    return (
        "## Round trip: request/reply through a node process (ipc)\n\n"
        "Each client process sends one request at a time; latency per request, throughput "
        "over the span from the first client's start to the last one's finish.\n\n"
        f"{table}\n\n{codec_table}\n"
    )


if __name__ == "__main__":
    print(main())
