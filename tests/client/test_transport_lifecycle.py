"""The sync transport's life: closed under callers (from other threads, and from a signal
handler on the calling thread itself), shared by many threads, used after close, used in a
forked child, and dialled over IPv6 (client/transport.py, client/thread_channels.py).

A zmq socket used or closed by a thread other than its own aborts the whole process (libzmq
asserts), so each scenario that closed a socket under a caller before the fix runs in a process
of its own: a failure is then an exit code, not the test runner gone. Real node, real sockets.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from subagents_node.client.client import Client, connect
from subagents_node.client.keys import ClientCredentials, Keypair
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Ack
from subagents_node.messages.codec import decode, encode_answer
from subagents_node.messages.errors import NodeNotRunning, SubagentsError
from subagents_node.messages.node import DebugSleep, Pong
from tests.support.descriptors import run_python
from tests.support.nodes import NodeProcess, running_node
from tests.support.runs import wait_until

CLOSED = "this client is closed"


@pytest.fixture(scope="module")
def faulty_node() -> Iterator[NodeProcess]:
    """One node for the module, with debug.sleep (a call that stays in flight)."""
    with running_node("--faults") as node:
        yield node


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- scenarios run in a process of their own (`python -c`, from the repository root) ----------


def close_under_busy_callers(address: str, rounds: int = 20, callers: int = 8) -> None:
    """`rounds` times: `callers` threads call in a loop; once each has answers, close."""
    for _ in range(rounds):
        _close_under(connect(address, timeout=3), callers)
    print("ok")


def _close_under(client: Client, callers: int) -> None:
    answered = threading.Semaphore(0)
    outcomes: list[BaseException] = []

    def call() -> None:
        try:
            while True:
                client.ping()
                client.capacity.snapshot("s")
                answered.release()
        except BaseException as err:  # the one way out: the client closed under it
            outcomes.append(err)

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for _ in range(callers):
        assert answered.acquire(timeout=10), "a caller never got an answer"
    began = time.monotonic()
    client.close()
    assert time.monotonic() - began < 5, "close() waited on the callers"
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), "a caller is stuck after close()"
    assert [type(err) for err in outcomes] == [NodeNotRunning] * callers, outcomes
    assert {str(err) for err in outcomes} == {CLOSED}


def close_under_a_blocked_call(address: str) -> None:
    """A call waits 3 s for its reply; close() from another thread ends it at once."""
    transport = ZmqTransport(address)
    on_the_wire = threading.Event()
    outcome: list[BaseException] = []

    def call() -> None:
        pending = transport.submit(DebugSleep(ms=3000), "capacity")
        on_the_wire.set()
        try:
            pending.result(timeout=8)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=call)
    thread.start()
    assert on_the_wire.wait(10)
    began = time.monotonic()
    transport.close()
    thread.join(10)
    assert not thread.is_alive()
    assert time.monotonic() - began < 1.5, "close() waited for the call's reply"
    assert len(outcome) == 1 and isinstance(outcome[0], NodeNotRunning), outcome
    assert str(outcome[0]) == CLOSED
    print("ok")


def close_from_a_signal_handler_inside_a_call(address: str) -> None:
    """SIGALRM's handler closes the client while this (the main) thread waits 3 s for a reply:
    close() returns at once, the call it interrupted raises NodeNotRunning as soon as the
    handler returned, and every descriptor the client had is released."""
    faulthandler.dump_traceback_later(20, exit=True)  # a hang says where, then ends
    before = _open_descriptors()
    client = connect(address, timeout=8)
    client.ping()
    closing: list[float] = []

    def close(*_: object) -> None:
        began = time.monotonic()
        client.close()
        closing.append(time.monotonic() - began)

    signal.signal(signal.SIGALRM, close)
    signal.setitimer(signal.ITIMER_REAL, 0.3)  # well inside the 3 s the call waits
    began = time.monotonic()
    try:
        client.ask(DebugSleep(ms=3000), Ack, target="capacity")
    except NodeNotRunning as err:
        assert str(err) == CLOSED, err
    else:
        raise AssertionError("the call was answered after close()")
    took = time.monotonic() - began
    assert closing and closing[0] < 0.5, f"close() took {closing}"
    assert took < 1.5, f"the interrupted call ended {took:.2f} s after it began"
    assert _open_descriptors() <= before, "the closed client kept descriptors"
    print("ok")


def close_from_signal_handlers_landing_anywhere(address: str, rounds: int = 150) -> None:
    """`rounds` clients, each pinged in a loop until a timer's handler closes it: the signal
    lands anywhere in a call (opening a channel, sending, waiting, between them, in a lock).
    Each loop ends with NodeNotRunning, nothing hangs, and no descriptor is left behind."""
    faulthandler.dump_traceback_later(60, exit=True)
    before = _open_descriptors()
    for _ in range(rounds):
        client = connect(address, timeout=5)
        signal.signal(signal.SIGALRM, lambda *_: client.close())  # noqa: B023 (this round's)
        signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0001, 0.004))
        try:
            while True:
                client.ping()
        except NodeNotRunning as err:
            assert str(err) == CLOSED, err
    # Closed sockets may wait a moment for libzmq's reaper; a context's term() waits for it.
    assert _open_descriptors() <= before, "closed clients kept descriptors"
    print("ok")


def close_and_exit_from_a_signal_handler_inside_a_call(address: str) -> None:
    """A SIGTERM handler that closes the client and exits (`sys.exit`): the exit goes on from
    the call it interrupted; it is not turned into the call's NodeNotRunning."""
    faulthandler.dump_traceback_later(20, exit=True)
    client = connect(address, timeout=8)
    client.ping()

    def close_and_exit(*_: object) -> None:
        client.close()
        raise SystemExit(7)

    signal.signal(signal.SIGALRM, close_and_exit)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        client.ask(DebugSleep(ms=3000), Ack, target="capacity")
    except SystemExit as exit:
        assert exit.code == 7
        print("ok")
        return
    except BaseException as err:
        raise AssertionError(f"the handler's exit became {type(err).__name__}: {err}") from err
    raise AssertionError("the call was answered after close()")


def ping_from_a_forked_child(address: str) -> None:
    """The parent pings, forks; the child pings with the parent's client, then the parent."""
    client = connect(address, timeout=3)
    client.ping()
    pid = os.fork()
    if pid == 0:  # the child: a hang must end it, never leave it behind
        signal.alarm(15)
        try:
            client.ping(timeout=3)
            client.capacity.snapshot("s")
            client.close()
        except BaseException as err:
            print(f"child: {type(err).__name__}: {err}", flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the child ended with {status:#x}"
    client.ping()  # the child closed its own channels, never the parent's
    client.close()
    print("ok")


def collect_clients_dropped_in_reference_cycles(address: str) -> None:
    """Clients dropped without close(), each in a reference cycle (a refusal's traceback holds
    the frame that holds the client; a client that refers to itself), then collected by the
    cyclic collector: the collection must neither hang nor leave their sockets open."""
    with connect(address, timeout=5) as warm:  # what a first client loads for good
        warm.ping()
        with contextlib.suppress(SubagentsError):
            warm.fanout.create("r", 0)
    gc.collect()
    gc.disable()  # the collection below is the one that would have hung
    before = len(os.listdir("/proc/self/fd"))

    def refused() -> BaseException:
        client = connect(address, timeout=5)
        try:
            client.fanout.create("r", 0)
        except SubagentsError as err:
            return err  # its traceback holds this frame, and the frame the client
        raise AssertionError("a limit of 0 was accepted")

    kept = [refused() for _ in range(3)]
    for _ in range(3):
        looped = connect(address, timeout=5)
        looped.ping()
        looped.loop = looped  # type: ignore[attr-defined]
    del kept, looped
    gc.collect()
    gc.enable()
    assert len(os.listdir("/proc/self/fd")) <= before, "the dropped clients kept descriptors"
    with connect(address, timeout=5) as client:
        client.ping()
    print("ok")


def _scenario(name: str, address: str, timeout: float = 90) -> None:
    done = run_python(
        f"from tests.client.test_transport_lifecycle import {name}; {name}({address!r})",
        timeout=timeout,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    )


# -- the rules --------------------------------------------------------------------------------


def test_close_while_threads_are_mid_call_neither_aborts_nor_hangs_and_they_get_closed(
    faulty_node: NodeProcess,
) -> None:
    _scenario("close_under_busy_callers", faulty_node.address)


def test_close_ends_a_call_blocked_on_its_reply_at_once_with_client_closed(
    node: NodeProcess,
) -> None:
    # A node of its own: its capacity owner stays asleep for the 3 s the call asked for.
    _scenario("close_under_a_blocked_call", node.address)


def test_close_from_a_signal_handler_during_a_call_of_its_own_thread_returns_and_ends_the_call(
    node: NodeProcess,
) -> None:
    """`signal.signal(SIGTERM, lambda *_: client.close())` with the main thread inside a call:
    close() left the call's socket for its thread to close, then waited in the context's
    `term()` for it, on that very thread: the process hung for good. Now the call's thread
    ends the context once its call returned, which is at once, with NodeNotRunning."""
    _scenario("close_from_a_signal_handler_inside_a_call", node.address, timeout=40)


def test_a_close_from_a_signal_handler_landing_anywhere_in_calls_never_hangs_nor_leaks(
    faulty_node: NodeProcess,
) -> None:
    _scenario("close_from_signal_handlers_landing_anywhere", faulty_node.address)


def test_a_signal_handler_that_closes_the_client_and_exits_exits_from_the_call(
    node: NodeProcess,
) -> None:
    _scenario("close_and_exit_from_a_signal_handler_inside_a_call", node.address, timeout=40)


def test_a_forked_child_using_its_parents_client_gets_answers_of_its_own(
    faulty_node: NodeProcess,
) -> None:
    _scenario("ping_from_a_forked_child", faulty_node.address)


def test_a_client_dropped_in_a_reference_cycle_is_collected_without_hanging(
    faulty_node: NodeProcess,
) -> None:
    """Found by hand: the collector finalized the client's zmq context before its sockets (a
    collection clears the weak set the context knows its sockets by), and the context's
    `term()` waited for them for good, in whichever thread happened to collect."""
    _scenario("collect_clients_dropped_in_reference_cycles", faulty_node.address, timeout=30)


def test_a_threads_socket_is_released_when_the_thread_ends(faulty_node: NodeProcess) -> None:
    client = connect(faulty_node.address, timeout=10)
    try:
        client.ping()  # the context's own descriptors and this thread's channel, once
        before = _open_descriptors()
        failures: list[BaseException] = []

        def ping() -> None:
            try:
                client.ping()
            except BaseException as err:
                failures.append(err)

        for _ in range(24):  # 1,200 short-lived threads, 50 at a time
            threads = [threading.Thread(target=ping) for _ in range(50)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        assert failures == []
        # zmq_close is asynchronous: libzmq's reaper thread frees a closed socket's
        # descriptors a moment later, so the last threads' may still be open right now.
        wait_until(lambda: _open_descriptors() - before < 20, 10, "the threads' descriptors")
    finally:
        client.close()


def test_a_client_used_after_close_says_it_is_closed_on_every_thread(
    faulty_node: NodeProcess,
) -> None:
    client = connect(faulty_node.address, timeout=10)
    client.ping()  # this thread has a channel now
    client.close()
    with pytest.raises(NodeNotRunning, match=CLOSED):
        client.ping()
    with pytest.raises(NodeNotRunning, match=CLOSED):
        client.capacity.snapshot("s")
    outcome: list[BaseException] = []

    def ping_from_a_new_thread() -> None:
        try:
            client.ping()
        except BaseException as err:
            outcome.append(err)

    fresh = threading.Thread(target=ping_from_a_new_thread)
    fresh.start()
    fresh.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], NodeNotRunning), outcome
    assert str(outcome[0]) == CLOSED


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_a_client_dials_a_bracketed_ipv6_tcp_address() -> None:
    server_public, server_secret = zmq.curve_keypair()
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = zctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.IPV6, 1)
    router.setsockopt(zmq.CURVE_SERVER, 1)
    router.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
    router.bind("tcp://[::1]:*")
    address = router.getsockopt_string(zmq.LAST_ENDPOINT)
    stop = threading.Event()

    def answer_pings() -> None:  # the node's half, just enough of it
        while not stop.is_set():
            if router.poll(100):
                peer, frame = router.recv_multipart()
                pong = Pong(node_id="v6", version="test", pid=os.getpid(), uptime_s=0.0)
                router.send_multipart([peer, encode_answer(decode(frame), pong, "node")])

    server = threading.Thread(target=answer_pings)
    server.start()
    creds = ClientCredentials(Keypair.generate(), server_public.decode("ascii"))
    try:
        with connect(address, timeout=5, credentials=creds) as client:
            assert client.ping().node_id == "v6"
    finally:
        stop.set()
        server.join(10)
        router.close()
        zctx.term()
