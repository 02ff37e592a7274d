"""Hostile input against a real node (issue 12, item 3 "Four schema-valid frames stop the node"
and item 4 "Reply amplification"; DESIGN §4).

Each frame here was accepted by the old schemas and crashed its owner (`internal`, a restart; a
few in a row stopped the node). Now each is refused at the boundary with a typed BadRequest that
names the field, answered exactly once (`RawPeer.request_once`), and no owner restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

from subagents_node.messages.capacity import SlotHandle
from subagents_node.messages.envelope import PROTOCOL_VERSION, REPLY, Envelope
from subagents_node.messages.errors import BadRequest
from subagents_node.messages.supervisor import AgentPlan, ChainStep, Launch, TaskItem
from tests.support.nodes import NodeProcess, RawPeer, error_of, running_node

HUGE = 2**63  # one past SQLite's largest INTEGER
LONG_RUN_ID = "r" * 50_000  # longer than SQLite's LIKE pattern limit (50,000 bytes)
LONG_COMPONENT = "a" * 256  # one byte past NAME_MAX: every system call answers ENAMETOOLONG


@pytest.fixture(scope="module")
def served() -> Iterator[NodeProcess]:
    """One node for the module: surviving every case in turn, with no restart, is the point."""
    with running_node("--faults") as node:
        yield node


def handle(**changes: Any) -> dict[str, Any]:
    fields = SlotHandle(
        session_id="s1", slot=0, token="t", run_id="r1", generation=1, kind="runner"
    ).model_dump()
    return {**fields, **changes}


def launch_body(cwd: str = "/tmp", item_cwd: str | None = None) -> dict[str, Any]:
    agent = AgentPlan(name="echo", command=["/bin/true"])
    launch = Launch(
        session_id="s1",
        mode="single",
        background=False,
        items=[TaskItem(agent=agent, task="hi")],
        cwd="/tmp",
    )
    body = launch.to_body()
    body["cwd"] = cwd
    body["items"][0]["cwd"] = item_cwd
    return body


def step() -> dict[str, Any]:
    agent = AgentPlan(name="echo", command=["/bin/true"])
    return ChainStep(items=[TaskItem(agent=agent, task="hi")]).model_dump()


# (case id, request type, body, the field the error must name)
OUT_OF_RANGE = [
    ("rollback-slot-2**63", "capacity.rollback", {"handle": handle(slot=HUGE)}, "handle.slot"),
    (
        "rollback-generation-2**64-1",
        "capacity.rollback",
        {"handle": handle(generation=2**64 - 1)},
        "handle.generation",
    ),
    (
        "mark_started-slot-2**63",
        "capacity.mark_started",
        {"handle": handle(slot=HUGE), "runner_id": "x"},
        "handle.slot",
    ),
    (
        "mark_started-pid-2**63",
        "capacity.mark_started",
        {"handle": handle(), "runner_id": "x", "pid": HUGE},
        "pid",
    ),
    (
        "mark_workflow_started-slot-2**63",
        "capacity.mark_workflow_started",
        {"handle": handle(slot=HUGE, kind="workflow")},
        "handle.slot",
    ),
    ("watch_all-after_seq-2**63", "runs.watch_all", {"after_seq": HUGE, "wait_s": 0}, "after_seq"),
    (
        "watch-after_seq-2**63",
        "runs.watch",
        {"run_id": "r1", "after_seq": HUGE, "wait_s": 0},
        "after_seq",
    ),
    ("rerun-child-2**63", "runs.rerun", {"run_id": "r1", "task": "x", "child": HUGE}, "child"),
    (
        "acquire-nan-ttl",
        "capacity.acquire",
        {"session_id": "s", "limit": 1, "run_id": "r", "ttl_s": float("nan")},
        "ttl_s",
    ),
]

LONG_RUN_IDS = [
    ("show", {}),
    ("watch", {"wait_s": 0}),
    ("stop", {}),
    ("resume", {}),
    ("rerun", {"task": "again"}),
    ("append", {"steps": [step()]}),
    ("intercom", {"text": "hello"}),
]

LONG_PATHS = [
    ("launch-cwd-256-byte-component", launch_body(cwd=f"/tmp/{LONG_COMPONENT}"), "cwd"),
    (
        "launch-item-cwd-256-byte-component",
        launch_body(item_cwd=LONG_COMPONENT),
        "items.0.cwd",
    ),
    ("launch-cwd-with-nul", launch_body(cwd="/tmp/\x00x"), "cwd"),
    ("launch-cwd-longer-than-path_max", launch_body(cwd="/a" * 2100), "cwd"),
]


def assert_refused_once(
    peer: RawPeer, type_: str, body: dict[str, Any], field: str | None
) -> BadRequest:
    reply = peer.request_once(Envelope(type=type_, body=body))
    err = error_of(reply)
    assert isinstance(err, BadRequest), f"{type_}: {err.code}: {err.message}"
    if field is not None:
        assert err.details.get("field") == field, err.message
        assert field in err.message
    return err


def assert_no_restarts(node: NodeProcess) -> None:
    restarts = {a.name: a.restarts for a in node.status().actors}
    assert set(restarts.values()) == {0}, f"an owner crashed and restarted: {restarts}"


@pytest.mark.parametrize(
    ("type_", "body", "field"),
    [c[1:] for c in OUT_OF_RANGE],
    ids=[c[0] for c in OUT_OF_RANGE],
)
def test_issue12_integers_outside_sqlite_range_are_a_bad_request_naming_the_field(
    type_: str,
    body: dict[str, Any],
    field: str,
    served: NodeProcess,
    raw_dealer: Callable[[str], RawPeer],
) -> None:
    assert_refused_once(raw_dealer(served.address), type_, body, field)
    assert_no_restarts(served)


@pytest.mark.parametrize(("verb", "extra"), LONG_RUN_IDS, ids=[c[0] for c in LONG_RUN_IDS])
def test_issue12_a_50000_char_run_id_is_a_bad_request_not_like_pattern_too_complex(
    verb: str,
    extra: dict[str, Any],
    served: NodeProcess,
    raw_dealer: Callable[[str], RawPeer],
) -> None:
    err = assert_refused_once(
        raw_dealer(served.address), f"runs.{verb}", {"run_id": LONG_RUN_ID, **extra}, "run_id"
    )
    assert "LIKE" not in err.message
    assert_no_restarts(served)


@pytest.mark.parametrize(
    ("body", "field"), [c[1:] for c in LONG_PATHS], ids=[c[0] for c in LONG_PATHS]
)
def test_issue12_a_launch_cwd_the_kernel_refuses_is_answered_exactly_once_with_a_typed_error(
    body: dict[str, Any],
    field: str,
    served: NodeProcess,
    raw_dealer: Callable[[str], RawPeer],
) -> None:
    assert_refused_once(raw_dealer(served.address), "runs.launch", body, field)
    assert_no_restarts(served)


def test_issue12_a_cwd_too_long_only_once_joined_is_refused_as_unusable_exactly_once(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    """Each path fits on its own; joined they pass PATH_MAX. The owner's own check (not the
    schema) must answer it, typed and once: this is the path that used to answer twice."""
    body = launch_body(cwd="/tmp/" + "/".join(["d" * 200] * 10), item_cwd="/".join(["e"] * 2000))
    err = assert_refused_once(raw_dealer(served.address), "runs.launch", body, None)
    assert err.code == "cwd_missing", err.message
    assert_no_restarts(served)


def test_issue12_the_node_keeps_serving_after_every_hostile_frame_in_a_row(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    """More than three crashes in five seconds used to stop the node: send them all at once."""
    peer = raw_dealer(served.address)
    for _, type_, body, field in OUT_OF_RANGE:
        assert_refused_once(peer, type_, body, field)
    for verb, extra in LONG_RUN_IDS:
        assert_refused_once(peer, f"runs.{verb}", {"run_id": LONG_RUN_ID, **extra}, "run_id")
    for _, body, field in LONG_PATHS:
        assert_refused_once(peer, "runs.launch", body, field)
    assert served.alive()
    assert_no_restarts(served)


# -- reply amplification ------------------------------------------------------------------------


def nested_limit(depth: int, width: int) -> list[Any]:
    value: list[Any] = [b""] * width
    for _ in range(depth):
        value = [value]
    return value


def raw_frame(type_: str, body: dict[str, Any], frame_id: str = "amp-1") -> bytes:
    packed: bytes = msgpack.packb(
        {"v": PROTOCOL_VERSION, "id": frame_id, "type": type_, "body": body}, use_bin_type=True
    )
    return packed


AMPLIFIERS = [
    # the reported one: 240 nested lists around 5,000 empty byte strings (10 KB)
    ("240-deep-lists-around-5000-bytes", {"root_run_id": "r", "limit": nested_limit(240, 5000)}),
    # within the codec's depth limit, wide: one error, not one per element
    ("shallow-but-wide-limit", {"root_run_id": "r", "limit": nested_limit(3, 9000)}),
    ("a-long-string-limit", {"root_run_id": "r", "limit": "x" * 60_000}),
    ("a-map-of-many-bad-keys", {"root_run_id": "r", "limit": {f"k{i}": [i] for i in range(5000)}}),
]


@pytest.mark.parametrize("body", [c[1] for c in AMPLIFIERS], ids=[c[0] for c in AMPLIFIERS])
def test_issue12_reply_amplification_error_replies_stay_small_and_rss_stays_flat(
    body: dict[str, Any], served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    peer = raw_dealer(served.address)
    frame = raw_frame("fanout.create", body)
    before = served.rss()
    for _ in range(5):
        peer.send_frames(frame)
        reply = peer.recv_env(timeout=10)
        assert reply is not None
        assert reply.corr == "amp-1"
        encoded = len(msgpack.packb(reply.body, use_bin_type=True))
        assert encoded < 4096, f"a {len(frame)}-byte request got a {encoded}-byte error reply"
        assert isinstance(error_of(reply), BadRequest)
    assert peer.ping().type == REPLY
    # Five frames each used to cost hundreds of MiB; a few MiB is noise (allocator, caches).
    assert served.rss() - before < 32 << 20, f"RSS grew by {(served.rss() - before) >> 20} MiB"
    assert_no_restarts(served)


def test_issue12_a_schema_error_lists_at_most_ten_fields_and_counts_them_all(
    served: NodeProcess, raw_dealer: Callable[[str], RawPeer]
) -> None:
    env = {f"V{i}": 0 for i in range(300)}  # 300 values of the wrong type
    body = launch_body()
    body["env"] = env
    err = assert_refused_once(raw_dealer(served.address), "runs.launch", body, None)
    assert len(err.details["errors"]) == 10
    assert err.details["error_count"] == 300
    assert all(len(e["loc"]) <= 160 and len(e["msg"]) <= 160 for e in err.details["errors"])


def test_issue12_client_runs_list_limit_0_raises_bad_request_not_validation_error(
    served: NodeProcess,
) -> None:
    client = served.client()
    with pytest.raises(BadRequest) as info:
        client.runs.list(limit=0)
    assert info.value.details.get("field") == "limit"


ACQUIRE = {"session_id": "lax", "run_id": "r"}

# (case id, request type, body, the field the error must name)
OTHER_TYPES = [
    *(
        (f"acquire-limit-{name}", "capacity.acquire", {**ACQUIRE, "limit": limit}, "limit")
        for name, limit in (("true", True), ("string", "5"), ("float", 5.0))
    ),
    ("list-limit-true", "runs.list", {"limit": True}, "limit"),
    ("launch-background-no", "runs.launch", {**launch_body(), "background": "no"}, "background"),
    ("launch-background-1", "runs.launch", {**launch_body(), "background": 1}, "background"),
]


@pytest.mark.parametrize(
    ("type_", "body", "field"), [c[1:] for c in OTHER_TYPES], ids=[c[0] for c in OTHER_TYPES]
)
def test_a_value_of_another_type_is_refused_naming_its_field_never_converted(
    type_: str,
    body: dict[str, Any],
    field: str,
    served: NodeProcess,
    raw_dealer: Callable[[str], RawPeer],
) -> None:
    """pydantic's lax mode made `True` a limit of 1, "5" a limit of 5 and "no" a foreground
    launch: a request that meant something else than its sender wrote, accepted."""
    client = served.client()
    runs = len(client.runs.list(limit=1000))
    assert_refused_once(raw_dealer(served.address), type_, body, field)
    assert client.capacity.snapshot("lax").used == 0
    assert len(client.runs.list(limit=1000)) == runs  # nothing launched
    assert_no_restarts(served)
