"""A home and a worker one release apart (docs/operations.md, "Upgrading a home and its
workers"; DESIGN §1 "Multi-host"): every reply one node reads from the other tolerates fields
a newer release added, at the top and nested, as a client reads a node's, while a node of
another protocol version is an UnsupportedProtocol at once, never a silent timeout.

A real home and a real worker node, on loopback, started through the real CLI; the worker
joins through a real CURVE proxy in the test (tests/support/newerpeer.py) that rewrites the
replies each way: grown (a field added in every map) or in another protocol version. What
the worker reads from its home: the join's and every heartbeat's answer (its home link) and
its ledgers' answers to its run supervisor's admissions (owner links, through its gateway's
relay). What the home reads from the worker: its answers to what the home asks (`run --on`,
ping, the views of every host), passed on to the home's client as they came.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from subagents_node.client.client import Client
from subagents_node.client.keys import CLIENT_KEY, SERVER_KEY, keys_dir, read_keypair
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.capacity import CAPACITY
from subagents_node.messages.envelope import PROTOCOL_VERSION
from subagents_node.messages.errors import UnsupportedProtocol
from subagents_node.messages.fanout import FANOUT
from subagents_node.messages.session import SESSION
from tests.support.fleet import EXAMPLE_AGENTS, Fleet, fleet
from tests.support.newerpeer import NewerPeer, Rewrite, as_sent, grow, in_version
from tests.support.nodes import NodeProcess, free_home_port, new_state_dir, run_cli
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow

LATER = PROTOCOL_VERSION + 1
#: Far below the home's call timeout for a worker (75 s) and the clients' here (30 s): an
#: answer within it is the mismatch's doing, not a timeout's.
AT_ONCE_S = 10.0
LEDGERS = (CAPACITY, FANOUT, SESSION)


class Pair:
    def __init__(self, crew: Fleet, peer: NewerPeer, worker: NodeProcess) -> None:
        self.crew = crew
        self.peer = peer
        self.worker = worker
        self.home = Client(ZmqTransport(crew.home.address), timeout=30)

    def joined_since(self, since: float) -> bool:
        cluster = self.worker.status().cluster
        return (
            cluster is not None
            and cluster.state == "joined"
            and (cluster.last_heartbeat_ok or 0) > since
        )

    def run_on_worker(self, session: str) -> tuple[int, str, str]:
        env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": "1"}
        args = ("run", "--async", "--session", session, "--agents-dir", str(EXAMPLE_AGENTS))
        done = run_cli(*args, "sleeper", "seconds=60", state_dir=self.worker.state_dir, env=env)
        return done.returncode, done.stdout, done.stderr

    def used(self, session: str) -> int:
        return self.home.capacity.snapshot(session, 1).used


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """A home, and worker `w1` joined through a NewerPeer that grows every reply both ways."""
    with fleet(()) as crew:
        worker_dir = new_state_dir()
        done = run_cli("keys", "generate", state_dir=worker_dir)
        assert done.returncode == 0, done.stderr
        worker_key = read_keypair(keys_dir(worker_dir) / CLIENT_KEY)
        allowed = run_cli(
            "keys", "allow", "--name", "w1", "--", worker_key.public, state_dir=crew.home.state_dir
        )
        assert allowed.returncode == 0, allowed.stderr
        home_key = read_keypair(keys_dir(crew.home.state_dir) / SERVER_KEY)
        home_port = int(crew.endpoint.rpartition(":")[2])
        peer = NewerPeer(home_key, worker_key, home_port, free_home_port())
        peer.to_worker, peer.to_home = grow, grow
        args = ("--join", peer.endpoint, "--home-key", crew.home_key, "--name", "w1")
        worker = crew.workers["w1"] = NodeProcess(worker_dir, args)
        try:
            worker.start()  # its join was answered grown already
            made = Pair(crew, peer, worker)
            yield made
            made.home.close()
        finally:
            worker.cleanup()
            peer.close()


@pytest.fixture(autouse=True)
def _grown_and_joined(pair: Pair) -> Iterator[None]:
    """Each test starts with grown replies both ways and the worker joined (a test before may
    have spoken another protocol version to it), and ends with its own rewrites undone."""
    pair.peer.to_worker, pair.peer.to_home = grow, grow
    pair.peer.asks_to_worker = as_sent
    since = time.time()
    wait_until(lambda: pair.joined_since(since), what="w1 joined on a fresh heartbeat")
    yield
    pair.peer.to_worker, pair.peer.to_home = grow, grow
    pair.peer.asks_to_worker = as_sent


def _session() -> str:
    return f"rel-{uuid.uuid4().hex[:8]}"


def _from_ledgers(then: Rewrite, otherwise: Rewrite) -> Rewrite:
    """`then` for the replies of the home's ledger owners, `otherwise` for the rest."""
    return lambda raw: then(raw) if raw.get("sender") in LEDGERS else otherwise(raw)


# -- what a worker reads from a newer home -------------------------------------------------------


def test_a_worker_one_release_older_stays_joined_on_heartbeat_answers_with_fields_it_does_not_know(
    pair: Pair,
) -> None:
    """Its heartbeat's answer (a Membership with a field added at the top and in its nested
    maps) renews its membership: it was read strictly, so the worker called its home
    `unreachable` on the first beat and failed every admission closed."""
    since = time.time()
    beat = pair.crew.heartbeat[0]
    wait_until(lambda: pair.joined_since(since + 3 * beat), what="three heartbeats renewed")
    view = pair.crew.nodes()["w1"]
    assert (view.state, view.role) == ("up", "worker")


def test_a_worker_one_release_older_runs_a_child_its_home_admits_with_grown_ledger_replies(
    pair: Pair,
) -> None:
    """The run supervisor's admission (session, capacity, fan-out at the home) and the slot's
    start and release all read grown answers of the home's ledger owners."""
    session = _session()
    code, out, err = pair.run_on_worker(session)
    assert code == 0, err
    run_id = out.strip().splitlines()[0].strip()
    assert pair.used(session) == 1
    wait_until(lambda: pair.crew.nodes()["w1"].slots == 1, what="the slot held by w1")
    code, _, err = pair.crew.cli(pair.worker, "stop", run_id)
    assert code == 0, err
    wait_until(lambda: pair.used(session) == 0, what="the slot released after stop")


def test_a_home_in_another_protocol_version_leaves_its_worker_unreachable_saying_so_at_once(
    pair: Pair,
) -> None:
    """It used to drop the home's answers as garbled and report no answer to a heartbeat."""
    pair.peer.to_worker = in_version(LATER, grow)
    wait_until(
        lambda: (c := pair.worker.status().cluster) is not None and c.state == "unreachable",
        what="w1 unreachable",
    )
    cluster = pair.worker.status().cluster
    assert cluster is not None
    assert f"answered in protocol version {LATER}" in cluster.reason
    assert f"this worker speaks {PROTOCOL_VERSION}" in cluster.reason


def test_a_home_ledger_answering_in_another_protocol_version_fails_the_admission_at_once(
    pair: Pair,
) -> None:
    """Heartbeats pass; the ledgers answer in another version: the run is refused with
    UnsupportedProtocol at once, not after the worker's call timeout as `unavailable`."""
    pair.peer.to_worker = _from_ledgers(in_version(LATER, grow), grow)
    session = _session()
    started = time.monotonic()
    code, _, err = pair.run_on_worker(session)
    took = time.monotonic() - started
    assert code != 0
    assert f"answered in protocol version {LATER}" in err, err
    assert took < AT_ONCE_S, err
    pair.peer.to_worker = grow
    assert pair.used(session) == 0


# -- what a home reads from a newer worker -------------------------------------------------------


def test_a_home_one_release_older_reads_its_workers_grown_answers_and_follows_its_run(
    pair: Pair,
) -> None:
    """The home passes them on as they came and its client reads them tolerantly: ping, the
    worker's run list, a launch placed with `run --on`, and a stop of that run from the home,
    answered by the worker (its follow-up watch too)."""
    pair.peer.to_worker = as_sent
    with pair.home.on("w1") as w1:
        assert w1.ping().node_id == pair.worker.status().node_id
        assert w1.runs.list(limit=1) is not None
    session = _session()
    env = {**os.environ, "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": "1"}
    args = ("run", "--async", "--on", "w1", "--session", session)
    done = run_cli(
        *args,
        "--agents-dir",
        str(EXAMPLE_AGENTS),
        "sleeper",
        "seconds=60",
        state_dir=pair.crew.home.state_dir,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip().splitlines()[0].strip()
    code, _, err = pair.crew.cli(pair.crew.home, "stop", run_id)
    assert code == 0, err
    wait_until(lambda: pair.used(session) == 0, what="the slot released after stop")


def _ask_w1_ping(pair: Pair) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    with pair.home.on("w1") as w1:
        try:
            w1.ping()
        except Exception as exc:
            return exc, time.monotonic() - started
    return None, time.monotonic() - started


def test_a_worker_answering_in_another_protocol_version_is_unsupported_protocol_at_once(
    pair: Pair,
) -> None:
    """The home refused the worker's answer as a bad frame and its client waited out its
    timeout (NodeTimeout); now the client hears UnsupportedProtocol, naming both versions."""
    pair.peer.to_home = in_version(LATER, grow)
    raised, took = _ask_w1_ping(pair)
    assert isinstance(raised, UnsupportedProtocol), raised
    assert raised.details == {"got": LATER, "supported": PROTOCOL_VERSION}
    assert "worker 'w1' answered in protocol version" in raised.message
    assert took < AT_ONCE_S


def test_a_worker_asked_in_another_protocol_version_answers_unsupported_protocol_at_once(
    pair: Pair,
) -> None:
    """A request is still never read in another version, but the worker answers it with
    the typed refusal instead of dropping it (the home's client waited out its timeout)."""

    def later_ask(raw: dict[str, Any]) -> dict[str, Any]:
        return {**raw, "v": LATER}

    pair.peer.asks_to_worker = later_ask
    raised, took = _ask_w1_ping(pair)
    assert isinstance(raised, UnsupportedProtocol), raised
    assert raised.details["got"] == LATER
    assert took < AT_ONCE_S


def test_a_worker_joining_a_home_in_another_protocol_version_does_not_start_and_says_why(
    pair: Pair,
) -> None:
    """Its join goes through the client's transport: UnsupportedProtocol at once (the worker
    is stopped cleanly first, so the home frees its name; it is started again after)."""
    code, _, err = pair.crew.cli(pair.worker, "stop")
    assert code == 0, err
    pair.peer.to_worker = in_version(LATER, grow)
    started = time.monotonic()
    done = run_cli("start", "--detach", *pair.worker.args, state_dir=pair.worker.state_dir)
    took = time.monotonic() - started
    assert done.returncode != 0
    assert f"answered in protocol version {LATER}" in done.stderr, done.stderr
    assert f"this worker speaks {PROTOCOL_VERSION}" in done.stderr, done.stderr
    assert "upgrade the home and its workers alike" in done.stderr
    assert took < AT_ONCE_S + 5  # a start's own cost, plus the answer: no join timeout
    pair.peer.to_worker = grow
    # The home took that join (only its answer was rewritten): its name is free again once
    # the failed start has been silent past the heartbeat timeout.
    wait_until(lambda: pair.crew.nodes()["w1"].state == "unreachable", what="w1 silent")
    pair.worker.start()
