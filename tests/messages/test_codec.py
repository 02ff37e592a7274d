"""The wire codec (DESIGN §4): envelope round trip, every decode failure as a typed BadRequest,
`peek_id` for correlating the error of a frame that failed, and boundary validation of bodies."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from subagents_node.messages.base import parse_result
from subagents_node.messages.codec import (
    MAX_FRAME_BYTES,
    decode,
    decode_reply,
    encode,
    encode_answer,
    encode_request,
    peek_id,
    request_frame,
)
from subagents_node.messages.envelope import ERROR, PROTOCOL_VERSION, REPLY, Envelope
from subagents_node.messages.errors import (
    BadRequest,
    FrameTooLarge,
    MalformedFrame,
    SubagentsError,
    UnknownMessageType,
    UnsupportedProtocol,
)
from subagents_node.messages.node import DebugSleep, Ping, Pong
from subagents_node.messages.protocol import REQUEST_TYPES, parse_request


def frame(**fields: Any) -> bytes:
    """A raw msgpack map: a valid ping header overridden/extended by `fields` (None deletes)."""
    raw: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": "m1", "type": "node.ping", "body": {}}
    for key, value in fields.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    packed: bytes = msgpack.packb(raw, use_bin_type=True)
    return packed


# -- round trip ---------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
short = st.text(max_size=40)


def test_encode_then_decode_keeps_every_header_field_and_the_body() -> None:
    env = Envelope(
        type="debug.sleep", body={"ms": 5}, target="fanout", corr="c-1", sender="client-7"
    )
    back = decode(encode(env))
    assert back == env


@given(
    type_=short.filter(bool),
    target=short,
    sender=short,
    corr=st.none() | short,
    body=st.dictionaries(st.text(max_size=8), values, max_size=6),
    host=short,
)
def test_round_trip_of_any_well_formed_envelope_is_identity(
    type_: str, target: str, sender: str, corr: str | None, body: dict[str, Any], host: str
) -> None:
    env = Envelope(type=type_, body=body, target=target, corr=corr, sender=sender, host=host)
    assert decode(encode(env)) == env


def test_the_host_header_is_on_the_wire_only_when_a_home_is_asked_to_carry_the_request() -> None:
    plain = msgpack.unpackb(encode(Envelope(type="runs.list", body={})))
    assert "host" not in plain  # a single node's frames are as they were
    carried = Envelope(type="runs.list", body={}, host="w1")
    assert msgpack.unpackb(encode(carried))["host"] == "w1"
    with pytest.raises(MalformedFrame) as bad:
        decode(frame(host=7))
    assert bad.value.details["reason"] == "host"


def test_a_reply_is_correlated_to_the_request_id_and_addressed_to_its_sender() -> None:
    request = Envelope(type="node.ping", body={}, sender="client-1")
    reply = decode(encode(request.reply(REPLY, {"ok": True}, sender="node-1")))
    assert (reply.type, reply.corr, reply.target, reply.sender) == (
        REPLY,
        request.id,
        "client-1",
        "node-1",
    )


@pytest.mark.parametrize(
    "outcome",
    [Pong(node_id="n", version="1", pid=7, uptime_s=0.5), BadRequest("b", reason="schema")],
    ids=["result", "error"],
)
def test_an_answer_frame_is_the_reply_envelope_encoded_header_for_header(outcome: Any) -> None:
    request = Envelope(type="node.ping", body={}, sender="client-1", host="worker-1")
    answer = msgpack.unpackb(encode_answer(request, outcome, "node-1"))
    body = outcome.to_wire() if isinstance(outcome, SubagentsError) else outcome.model_dump()
    kind = ERROR if isinstance(outcome, SubagentsError) else REPLY
    expected = msgpack.unpackb(encode(request.reply(kind, body, "node-1")))
    assert list(answer) == list(expected)  # the same keys in the same order
    assert len(answer.pop("id")) == len(expected.pop("id")) == 24
    assert answer == expected


def test_message_ids_are_unique_and_short() -> None:
    ids = {Envelope(type="node.ping", body={}).id for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 24 for i in ids)


# -- each decode failure --------------------------------------------------------------------------


def test_frame_at_the_cap_is_accepted_and_one_byte_over_is_frame_too_large() -> None:
    small = encode(Envelope(type="node.ping", body={"pad": ""}))
    pad = "x" * (200 - len(small))
    at_cap = encode(Envelope(type="node.ping", body={"pad": pad}))
    assert decode(at_cap, max_bytes=len(at_cap)).body["pad"] == pad
    with pytest.raises(FrameTooLarge) as info:
        decode(at_cap, max_bytes=len(at_cap) - 1)
    assert info.value.details == {"size": len(at_cap), "limit": len(at_cap) - 1}
    assert info.value.code == "frame_too_large"


def test_default_cap_is_one_mebibyte() -> None:
    big = b"\x00" * (MAX_FRAME_BYTES + 1)
    with pytest.raises(FrameTooLarge):
        decode(big)


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xc1", b"\x92\x01", frame()[:-2], frame() + b"\x01"],
    ids=["empty", "never-used-byte", "truncated-array", "truncated-map", "trailing-bytes"],
)
def test_bytes_that_are_not_one_msgpack_value_are_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode(raw)
    assert info.value.details["reason"] == "msgpack"


def test_a_map_with_non_string_keys_is_malformed() -> None:
    raw = msgpack.packb({1: "x", "v": 1}, use_bin_type=True)
    with pytest.raises(MalformedFrame) as info:
        decode(raw)
    assert info.value.details["reason"] == "msgpack"


@pytest.mark.parametrize("value", [[1, 2], 7, "node.ping", None, b"raw"])
def test_msgpack_that_is_not_a_map_is_malformed(value: Any) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode(msgpack.packb(value, use_bin_type=True))
    assert info.value.details["reason"] == "not_a_map"


@pytest.mark.parametrize(
    ("version", "got"),
    [
        (2, 2),
        (0, 0),
        ("1", "1"),
        (None, None),
        (True, True),
        (1.0, None),
        ([1], None),
        ("v" * 100_000, None),
    ],
    ids=["newer", "zero", "string", "missing", "bool", "float", "list", "huge string"],
)
def test_any_protocol_version_but_the_int_1_is_unsupported(version: Any, got: Any) -> None:
    with pytest.raises(UnsupportedProtocol) as info:
        decode(frame(v=version))
    assert info.value.details == {"got": got, "supported": PROTOCOL_VERSION}
    assert len(info.value.message) < 120  # an error never echoes a big value back whole


@pytest.mark.parametrize("key", ["type", "id", "sender", "target"])
@pytest.mark.parametrize("bad", [7, ["x"], "x" * 257], ids=["int", "list", "too-long"])
def test_header_fields_must_be_short_strings(key: str, bad: Any) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode(frame(**{key: bad}))
    assert info.value.details["reason"] == key


@pytest.mark.parametrize(
    "fields", [{"type": None}, {"id": None}, {"type": ""}, {"id": ""}], ids=str
)
def test_type_and_id_are_required_and_non_empty(fields: dict[str, Any]) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode(frame(**fields))
    assert info.value.details["reason"] == "header"


def test_corr_must_be_a_string_or_nil() -> None:
    assert decode(frame(corr="abc")).corr == "abc"
    with pytest.raises(MalformedFrame) as info:
        decode(frame(corr=12))
    assert info.value.details["reason"] == "corr"


@pytest.mark.parametrize("body", [[1], "text", 3])
def test_body_must_be_a_map(body: Any) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode(frame(body=body))
    assert info.value.details["reason"] == "body"


def test_missing_optional_fields_take_their_defaults() -> None:
    env = decode(frame(body=None))
    assert (env.body, env.target, env.sender, env.corr) == ({}, "", "", None)


@given(st.binary(max_size=300))
def test_decoding_arbitrary_bytes_raises_nothing_but_bad_request(raw: bytes) -> None:
    with contextlib.suppress(BadRequest):
        decode(raw)


@given(st.dictionaries(st.text(max_size=6), values, max_size=6))
def test_decoding_arbitrary_maps_raises_nothing_but_bad_request(raw: dict[str, Any]) -> None:
    with contextlib.suppress(BadRequest):
        decode(msgpack.packb(raw, use_bin_type=True))


def _outcome(function: Any, argument: Any) -> Any:
    try:
        return ("ok", function(argument))
    except BadRequest as err:
        return (type(err), err.message, err.details)


@given(st.dictionaries(st.sampled_from(["v", "id", "type", "corr", "sender", "body"]), values))
def test_a_clients_reply_decoder_accepts_and_refuses_exactly_what_decode_does(
    raw: dict[str, Any],
) -> None:
    """decode_reply (the sync client's, without an Envelope) runs decode's checks unchanged."""
    frame_ = msgpack.packb({"v": PROTOCOL_VERSION, "id": "r1", "type": REPLY, **raw})
    full, light = _outcome(decode, frame_), _outcome(decode_reply, frame_)
    if full[0] == "ok":
        env = full[1]
        assert light == ("ok", (env.corr, env.type, env.body))
    else:
        assert light == full


def test_a_request_frame_built_from_parts_is_the_frame_of_its_envelope() -> None:
    for host in ("", "w1"):
        env = Envelope(type="node.ping", body={"a": [1]}, target="fanout", sender="c", host=host)
        parts = (env.type, env.body, env.id, env.sender, env.target, env.host)
        assert request_frame(*parts) == encode_request(env)
    for body in ({"n": 1 << 70}, {"s": {1, 2}}, {"x": "y" * MAX_FRAME_BYTES}):
        env = Envelope(type="node.ping", body=body)
        parts = (env.type, env.body, env.id, env.sender, env.target, env.host)
        from_parts = _outcome(lambda p: request_frame(*p), parts)
        assert from_parts == _outcome(encode_request, env)


# -- peek_id --------------------------------------------------------------------------------------


def test_peek_id_finds_the_id_of_a_frame_that_fails_later_checks() -> None:
    assert peek_id(frame(v=99, id="abc")) == "abc"
    assert peek_id(frame(id="abc", body=[1])) == "abc"


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",
        msgpack.packb([1, "id"]),
        frame(id=5),
        frame(id=""),
        frame(id="x" * 65),
        frame(id=None),
    ],
    ids=["garbage", "not-a-map", "int-id", "empty-id", "long-id", "no-id"],
)
def test_peek_id_is_none_when_there_is_no_usable_id(raw: bytes) -> None:
    assert peek_id(raw) is None


# -- errors on the wire -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "err",
    [
        MalformedFrame("m", reason="msgpack"),
        FrameTooLarge("f", size=10, limit=5),
        UnsupportedProtocol("u", got=2, supported=1),
        UnknownMessageType("t", type="x.y"),
        BadRequest("b", reason="schema"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_reply_rebuilds_the_exact_error_class_with_its_details(
    err: SubagentsError,
) -> None:
    env = Envelope(type="node.ping", body={}).reply(ERROR, err.to_wire())
    back = SubagentsError.from_wire(decode(encode(env)).body)
    assert type(back) is type(err)
    assert (back.message, back.details) == (err.message, err.details)


def test_error_codes_are_unique_across_the_tree() -> None:
    seen: dict[str, type[SubagentsError]] = {}
    stack: list[type[SubagentsError]] = [SubagentsError]
    while stack:
        cls = stack.pop()
        assert seen.setdefault(cls.code, cls) is cls, f"{cls} reuses code {cls.code!r}"
        stack.extend(cls.__subclasses__())


# -- body validation at the boundary ------------------------------------------------------------


def test_every_request_type_parses_from_its_own_body() -> None:
    assert parse_request("node.ping", {}) == Ping()
    assert parse_request("debug.sleep", {"ms": 3}) == DebugSleep(ms=3)
    assert {"node.ping", "node.status", "node.shutdown", "debug.raise", "debug.sleep"} <= set(
        REQUEST_TYPES
    )


def test_unknown_message_type_is_refused_by_name() -> None:
    with pytest.raises(UnknownMessageType) as info:
        parse_request("node.nope", {})
    assert info.value.details == {"type": "node.nope"}


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"ms": -1}, "ms"),
        ({"ms": 10_001}, "ms"),
        ({"ms": "x"}, "ms"),
        ({}, "ms"),
        ({"ms": 1, "x": 2}, "x"),
    ],
    ids=["negative", "too-long", "not-int", "missing", "extra-field"],
)
def test_schema_violations_are_bad_requests_naming_the_field(
    body: dict[str, Any], loc: str
) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request("debug.sleep", body)
    assert info.value.details["reason"] == "schema"
    assert info.value.details["errors"][0]["loc"].split(".")[-1] == loc
    assert loc in info.value.message


def test_a_reply_body_that_does_not_fit_the_declared_result_is_refused() -> None:
    pong = {"node_id": "n", "version": "0", "pid": 1, "uptime_s": 0.0}
    assert parse_result(Ping(), pong) == Pong(**pong)
    with pytest.raises(BadRequest) as info:
        parse_result(Ping(), {"ok": True})
    assert info.value.details["reason"] == "reply"


# -- issue 12: bounded decoding -----------------------------------------------------------------


def _nested_body(levels: int) -> dict[str, Any]:
    """A body whose containers nest exactly `levels` deep (the body map is level 1)."""
    value: Any = []
    for _ in range(levels - 2):
        value = [value]
    return {"x": value} if levels > 1 else {}


def _frame(body: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(
        {"v": PROTOCOL_VERSION, "id": "d", "type": "node.ping", "body": body}, use_bin_type=True
    )
    return packed


def test_issue12_a_body_at_the_depth_cap_decodes_and_one_level_more_is_refused() -> None:
    from subagents_node.messages.domains import MAX_BODY_DEPTH

    assert decode(_frame(_nested_body(MAX_BODY_DEPTH))).body["x"]
    with pytest.raises(MalformedFrame) as info:
        decode(_frame(_nested_body(MAX_BODY_DEPTH + 1)))
    assert info.value.details["reason"] == "depth"


def test_issue12_msgpack_refuses_a_list_past_the_wire_item_cap_before_building_it() -> None:
    from subagents_node.messages.domains import MAX_WIRE_ITEMS

    assert len(decode(_frame({"x": [None] * MAX_WIRE_ITEMS})).body["x"]) == MAX_WIRE_ITEMS
    with pytest.raises(MalformedFrame) as info:
        decode(_frame({"x": [None] * (MAX_WIRE_ITEMS + 1)}))
    assert info.value.details["reason"] == "msgpack"


def test_issue12_a_schema_error_names_the_field_without_the_union_tag_and_is_bounded() -> None:
    body = {
        "handle": {
            "session_id": "s",
            "slot": 2**63,
            "token": "t",
            "run_id": "r",
            "generation": 1,
            "kind": "runner",
        }
    }
    with pytest.raises(BadRequest) as info:
        parse_request("capacity.rollback", body)
    assert info.value.details["field"] == "handle.slot"
    assert info.value.message.startswith("invalid capacity.rollback request: handle.slot:")
