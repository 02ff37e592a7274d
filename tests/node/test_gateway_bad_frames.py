"""Bad input at the gateway (issue 2, "Bad input"; DESIGN §4).

Every invalid inbound frame, sent from a raw ZeroMQ DEALER to a real node process, is answered
with a typed error reply when it can be addressed (correlated to the frame's id whenever an id
can be read), dropped otherwise, logged, and the node keeps serving: a valid request then
succeeds on the same socket and on a new one, and the node process is still alive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from subagents_node.messages.codec import MAX_FRAME_BYTES, encode
from subagents_node.messages.envelope import PROTOCOL_VERSION, REPLY, Envelope
from tests.support.nodes import ForegroundNode, NodeProcess, RawPeer, error_of, running_node
from tests.support.runs import wait_until

FRAME_ID = "bad-frame-1"


def raw_map(**fields: Any) -> bytes:
    """A msgpack map: a valid node.ping envelope with `fields` overridden (None deletes one)."""
    raw: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": FRAME_ID, "type": "node.ping", "body": {}}
    for key, value in fields.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    packed: bytes = msgpack.packb(raw, use_bin_type=True)
    return packed


def frame_of_size(size: int) -> bytes:
    """A well-formed envelope (with id FRAME_ID) padded to exactly `size` bytes."""
    base = len(raw_map(body={"pad": "x" * 70_000}))  # str32 header from here on: linear growth
    frame = raw_map(body={"pad": "x" * (70_000 + size - base)})
    assert len(frame) == size
    return frame


@dataclass(frozen=True)
class BadFrame:
    name: str
    frames: Callable[[], list[bytes]]
    code: str
    reason: str | None
    correlated: bool  # the error reply names FRAME_ID as its corr


def one(**fields: Any) -> Callable[[], list[bytes]]:
    return lambda: [raw_map(**fields)]


CASES = [
    BadFrame("not-msgpack", lambda: [b"\xc1\xc1garbage"], "malformed_frame", "msgpack", False),
    BadFrame("empty-frame", lambda: [b""], "malformed_frame", "msgpack", False),
    BadFrame("truncated-msgpack", lambda: [raw_map()[:-3]], "malformed_frame", "msgpack", False),
    BadFrame(
        "msgpack-but-not-a-map",
        lambda: [msgpack.packb(["node.ping", FRAME_ID])],
        "malformed_frame",
        "not_a_map",
        False,
    ),
    BadFrame("missing-id", one(id=None), "malformed_frame", "header", False),
    BadFrame("missing-type", one(type=None), "malformed_frame", "header", True),
    BadFrame("id-not-a-string", one(id=7), "malformed_frame", "id", False),
    BadFrame("type-not-a-string", one(type=["node.ping"]), "malformed_frame", "type", True),
    BadFrame("target-too-long", one(target="t" * 300), "malformed_frame", "target", True),
    BadFrame("corr-not-a-string", one(corr=5), "malformed_frame", "corr", True),
    BadFrame("body-not-a-map", one(body=[1, 2]), "malformed_frame", "body", True),
    BadFrame("unknown-message-type", one(type="node.nope"), "unknown_type", None, True),
    BadFrame(
        "schema-negative-ms",
        one(type="debug.sleep", target="capacity", body={"ms": -1}),
        "bad_request",
        "schema",
        True,
    ),
    BadFrame(
        "schema-ill-typed-field",
        one(type="debug.sleep", target="capacity", body={"ms": "soon"}),
        "bad_request",
        "schema",
        True,
    ),
    BadFrame("schema-extra-field", one(body={"extra": 1}), "bad_request", "schema", True),
    BadFrame("wrong-protocol-version", one(v=2), "unsupported_protocol", None, True),
    BadFrame("missing-protocol-version", one(v=None), "unsupported_protocol", None, True),
    BadFrame(
        "unknown-target",
        one(type="debug.sleep", target="nobody", body={"ms": 0}),
        "unknown_target",
        None,
        True,
    ),
    BadFrame("wrong-target", one(target="capacity"), "bad_request", "wrong_target", True),
    BadFrame(
        "just-over-the-size-cap",
        lambda: [frame_of_size(MAX_FRAME_BYTES + 1)],
        "frame_too_large",
        None,
        True,
    ),
    BadFrame(
        "multi-frame-message",
        lambda: [encode(Envelope(type="node.ping", body={}, id=FRAME_ID))] * 2,
        "malformed_frame",
        None,
        False,
    ),
]


@pytest.fixture(scope="module")
def served() -> Iterator[NodeProcess]:
    """One node for the whole module: that it survives every case in turn is part of the point."""
    with running_node("--faults") as node:
        yield node


def assert_still_serving(
    node: NodeProcess, peer: RawPeer, raw_dealer: Callable[[str], RawPeer]
) -> None:
    assert peer.ping().type == REPLY
    assert raw_dealer(node.address).ping().type == REPLY
    assert node.alive()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_frame_gets_a_typed_error_reply_and_the_node_keeps_serving(
    case: BadFrame, served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    peer = raw_dealer(served.address)
    peer.send_frames(*case.frames())
    reply = peer.recv_env(timeout=10)
    assert reply is not None, f"no error reply to {case.name}"
    err = error_of(reply)
    assert err.code == case.code, err.message
    assert err.details.get("reason") == case.reason
    assert reply.corr == (FRAME_ID if case.correlated else None)
    assert err.message
    assert f"refused a frame: {case.code}" in served.log()
    assert_still_serving(served, peer, raw_dealer)


def test_frame_too_large_reply_names_the_size_and_the_limit(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    peer = raw_dealer(served.address)
    peer.send_frames(frame_of_size(MAX_FRAME_BYTES + 1))
    reply = peer.recv_env(timeout=10)
    assert reply is not None
    assert error_of(reply).details == {"size": MAX_FRAME_BYTES + 1, "limit": MAX_FRAME_BYTES}


def test_a_frame_at_the_size_cap_is_decoded_and_judged_by_its_content(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    peer = raw_dealer(served.address)
    peer.send_frames(frame_of_size(MAX_FRAME_BYTES))
    reply = peer.recv_env(timeout=10)
    assert reply is not None
    assert error_of(reply).code == "bad_request"  # the padding is an unknown field, not a size


def test_far_oversize_frame_is_dropped_by_zmq_without_reply_and_the_node_keeps_serving(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    peer = raw_dealer(served.address)
    assert peer.ping().type == REPLY  # connected before we watch the connection
    monitor = peer.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        peer.send_frames(b"\x00" * (4 * MAX_FRAME_BYTES + 1024))
        events = []
        while zmq.EVENT_CONNECTED not in events:
            assert monitor.poll(10_000), f"no reconnect after the node dropped us: {events}"
            events.append(recv_monitor_message(monitor)["event"])
        assert events[0] == zmq.EVENT_DISCONNECTED  # zmq cut the connection: nothing answered
    finally:
        peer.sock.disable_monitor()
        monitor.close(linger=0)
    ping = Envelope(type="node.ping", body={})
    peer.send_env(ping)
    reply = peer.recv_env(timeout=10)
    assert reply is not None
    assert (reply.type, reply.corr) == (REPLY, ping.id)  # no error reply for the dropped frame
    assert_still_serving(served, peer, raw_dealer)


def test_a_burst_of_every_bad_frame_on_one_socket_gets_one_reply_each(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    peer = raw_dealer(served.address)
    for case in CASES:
        peer.send_frames(*case.frames())
    codes = []
    for _ in CASES:
        reply = peer.recv_env(timeout=10)
        assert reply is not None
        codes.append(error_of(reply).code)
    assert codes == [case.code for case in CASES]  # one socket, one I/O thread: in order
    assert_still_serving(served, peer, raw_dealer)


def test_a_request_under_the_cap_is_judged_the_same_through_the_gateway_as_at_its_owner(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer], tmp_path: Path
) -> None:
    """The gateway relays the body as it came: re-encoded with every default filled in, a
    944 KB launch came out over the 1 MiB cap and was refused `frame_too_large` through the
    node's socket while its owner, asked directly, judged it by its content."""
    item = {"agent": {"name": "t", "command": ["/bin/true"]}, "task": "x" * 880}
    body = {
        "session_id": "relay-size",
        "mode": "parallel",
        "background": False,
        "items": [item] * 1024,
        "cwd": str(tmp_path),
        "spawns_per_run": 1,
    }
    raw = {"v": PROTOCOL_VERSION, "id": FRAME_ID, "type": "runs.launch", "body": body}
    frame: bytes = msgpack.packb(raw, use_bin_type=True)
    assert 900_000 < len(frame) < MAX_FRAME_BYTES
    codes = []
    for address in (served.address, f"ipc://{served.state_dir.resolve()}/runs.sock"):
        peer = raw_dealer(address)
        peer.send_frames(frame)
        reply = peer.recv_env(timeout=20)
        assert reply is not None and reply.corr == FRAME_ID
        codes.append(error_of(reply).code)
    assert codes[0] == codes[1] == "RUN_FANOUT_LIMIT", codes


#: A field name a client made up: OSC 52 (set the clipboard of whoever tails the log), then a
#: newline and a line of its own dressed as one of the node's records.
FORGED_FIELD = "\x1b]52;c;cHduZWQ=\x07\n2026-12-06 20:40:00,000 ERROR subagents_node: FORGED"


def _refused_twice(
    node: NodeProcess | ForegroundNode, raw_dealer: Callable[[str], RawPeer]
) -> None:
    """FORGED_FIELD sent to the gateway and to an owner; each refusal names it, as sent."""
    for address in (node.address, f"ipc://{node.state_dir / 'capacity.sock'}"):
        peer = raw_dealer(address)
        peer.send_frames(raw_map(body={FORGED_FIELD: 1}))
        reply = peer.recv_env(timeout=10)
        assert reply is not None
        assert error_of(reply).details.get("field") == FORGED_FIELD  # the data, as sent


def test_a_refused_field_name_stays_inert_on_its_one_line_of_node_log(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    """The refusal names the unknown field, as it should; the log shows it escaped, on the
    refusal's own line, at the gateway and at an owner alike (both write node.log)."""
    _refused_twice(served, raw_dealer)
    _assert_inert(served.log())


def test_a_foreground_nodes_stderr_log_keeps_a_refused_field_name_inert_too(
    foreground_node: Callable[..., ForegroundNode], raw_dealer: Callable[[str], RawPeer]
) -> None:
    node = foreground_node()
    _refused_twice(node, raw_dealer)
    node.cleanup()  # its log is complete once it has stopped
    _assert_inert(node.log())


def _assert_inert(log: str) -> None:
    refusals = [line for line in log.splitlines() if r"\x1b]52;c;cHduZWQ=\x07\n2026" in line]
    assert len(refusals) == 2, log[-2000:]
    assert all("refused a frame: bad_request" in line for line in refusals)
    assert not any(line.startswith("2026-12-06 20:40:00,000") for line in log.splitlines())
    assert "\x1b" not in log and "\x07" not in log


def test_a_flood_of_bad_frames_from_one_peer_is_one_line_and_a_count_in_node_log(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    """One WARNING per refused frame (or per reply a peer never read) let one local client
    rotate every useful line out of node.log and its backups (actors/loglimit.py). Each
    frame is still answered."""
    peer = raw_dealer(served.address)
    for n in range(300):
        peer.send_frames(raw_map(type=f"no.such.type.{n}"))
    for _ in range(300):
        assert peer.recv_env(timeout=10) is not None
    mark = "refused a frame: unknown_type"
    # The count is logged once its second has passed (node.log announces nothing: re-read).
    count = "299 more like it (refused frames, from the same peer)"
    wait_until(lambda: count in served.log(), 10.0, "the count in node.log")
    flood = [line for line in served.log().splitlines() if "no.such.type." in line]
    assert len(flood) <= 3, flood[:5]
    assert any(mark in line for line in flood)
    assert any(count in line and "no.such.type.299" in line for line in flood)
