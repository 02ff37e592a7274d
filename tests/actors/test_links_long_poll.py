"""Owner links (actors/links.py) give a long poll its wait: a `runs.watch` / `runs.watch_all`
that its owner holds for `wait_s` by design is no silent owner. Forwarded through the node's
gateway with the usual call timeout alone, a watch longer than that timeout was answered
`unavailable` while the supervisor was healthy, and its real answer was dropped. A real ROUTER
that receives and never answers; the links' own deadlines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from subagents_node.actors.links import OwnerLinks
from subagents_node.messages.errors import OwnerUnavailable
from subagents_node.messages.supervisor import Show, WatchAll
from tests.support.descriptors import run_python

CALL_TIMEOUT_S = 0.2
WAIT_S = 1.0


@pytest.fixture
def silent_owner(tmp_path: Path) -> Iterator[tuple[zmq.Context[zmq.Socket[bytes]], str]]:
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    owner = zctx.socket(zmq.ROUTER)
    endpoint = f"ipc://{tmp_path}/owner.sock"
    owner.bind(endpoint)
    try:
        yield zctx, endpoint
    finally:
        owner.close(linger=0)
        zctx.term()


def test_a_long_poll_is_waited_for_its_wait_beyond_the_call_timeout(
    silent_owner: tuple[zmq.Context[zmq.Socket[bytes]], str],
) -> None:
    zctx, endpoint = silent_owner
    links = OwnerLinks(zctx, "node", lambda target: endpoint, timeout_s=CALL_TIMEOUT_S)
    answered: dict[str, tuple[float, object]] = {}
    sent = time.monotonic()
    links.send(
        Show(run_id="abc"), "supervisor", lambda a: answered.update(show=(time.monotonic(), a))
    )
    links.send(
        WatchAll(after_seq=0, wait_s=WAIT_S),
        "supervisor",
        lambda a: answered.update(watch=(time.monotonic(), a)),
    )
    try:
        while len(answered) < 2:
            deadline = links.next_deadline()
            assert deadline is not None
            time.sleep(max(0.0, deadline - time.monotonic()))  # the links' own timer
            links.expire()
    finally:
        links.close()

    show_at, show = answered["show"]
    watch_at, watch = answered["watch"]
    assert isinstance(show, OwnerUnavailable) and isinstance(watch, OwnerUnavailable)
    assert show_at - sent < WAIT_S
    assert watch_at - sent >= WAIT_S + CALL_TIMEOUT_S
    # Each timeout names the time it was given.
    assert f"within {CALL_TIMEOUT_S:g}s" in show.message
    assert f"within {WAIT_S + CALL_TIMEOUT_S:g}s" in watch.message


LINKS_OUT_OF_DESCRIPTORS = """
import zmq
from subagents_node.actors.links import OwnerLinks
from subagents_node.messages.errors import Busy
from subagents_node.messages.supervisor import Show
from tests.support.descriptors import exhaust_descriptors

zctx = zmq.Context()
links = OwnerLinks(zctx, "node", lambda target: "ipc:///nonexistent/owner.sock")
request = Show(run_id="abc")  # built (and its schema) before the descriptors run out
exhaust_descriptors()
try:
    links.send(request, "supervisor", lambda answer: None)
    print("sent")
except Busy as err:
    print("busy:", err.message)
"""


def test_out_of_descriptors_a_link_is_refused_busy_never_a_crash() -> None:
    """A ZMQError(EMFILE) opening a link crashed the run supervisor until its restart
    intensity gave up on it; it is load, answered like a full queue."""
    done = run_python(LINKS_OUT_OF_DESCRIPTORS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("busy: cannot open a link to ipc:///nonexistent/owner.sock")
