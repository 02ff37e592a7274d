"""How a client reads a reply from a newer node (messages/tolerant.py, messages/base.py
`validated_reply` and `parse_reply`): unknown fields are dropped wherever the models' type
hints lead, every other fault is the strict model's error, and owners stay strict."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import Field, ValidationError

from subagents_node.messages.base import (
    Message,
    parse_reply,
    parse_result,
    validated,
    validated_reply,
)
from subagents_node.messages.errors import BadRequest
from subagents_node.messages.node import NodeStatus, Ping, Pong
from subagents_node.messages.tolerant import known_fields


class Leaf(Message):
    n: int


class Other(Message):
    label: str


class Tree(Message):
    leaf: Leaf
    maybe: Leaf | None = None
    leaves: list[Leaf] = []
    # msgpack gives a list: strict models take one as a tuple only when the field says so.
    pair: Annotated[tuple[Leaf, Other] | None, Field(strict=False)] = None
    many: Annotated[tuple[Leaf, ...], Field(strict=False)] = ()
    by_name: dict[str, Leaf] = {}
    either: Leaf | Other | None = None
    bounded: Annotated[list[Leaf], Field(max_length=3)] = []
    free: dict[str, Any] = {}


EVERY_SHAPE: dict[str, Any] = {
    "leaf": {"n": 1},
    "maybe": {"n": 2},
    "leaves": [{"n": 3}],
    "pair": [{"n": 4}, {"label": "x"}],
    "many": [{"n": 5}, {"n": 6}],
    "by_name": {"a": {"n": 7}},
    "either": {"label": "y"},
    "bounded": [{"n": 8}],
    "free": {"anything": {"goes": 1}},
}


def with_unknown(value: Any, model_map: bool = True) -> Any:
    """`value` with a field no model knows in every map that is a model's (not in `by_name`, a
    map of models by key, itself, and nothing inside `free`)."""
    if isinstance(value, dict):
        inner = {
            k: v if k == "free" else with_unknown(v, model_map=k != "by_name")
            for k, v in value.items()
        }
        return {**inner, "later": {"x": [1]}} if model_map else inner
    if isinstance(value, list):
        return [with_unknown(v) for v in value]
    return value


def test_unknown_fields_are_dropped_at_every_level_and_shape_the_hints_describe() -> None:
    sent = with_unknown(EVERY_SHAPE)
    with pytest.raises(ValidationError):
        validated(Tree, sent)
    assert validated_reply(Tree, sent) == validated(Tree, EVERY_SHAPE)
    kept = known_fields(Tree, sent)
    assert "later" not in kept and "later" not in kept["pair"][1]
    assert "later" not in kept["by_name"]["a"]
    assert kept["free"] == {"anything": {"goes": 1}}  # a free-form map keeps what it holds


def test_a_union_of_models_keeps_what_any_member_knows_and_the_model_picks_the_member() -> None:
    assert validated_reply(Tree, {"leaf": {"n": 1}, "either": {"n": 9, "z": 0}}).either == Leaf(n=9)


def test_other_faults_are_the_strict_models_errors_even_beside_unknown_fields() -> None:
    with pytest.raises(ValidationError) as bad:
        validated_reply(Tree, {"leaf": {"n": "nine", "later": 1}, "later": 2})
    assert [(e["loc"], e["type"]) for e in bad.value.errors()] == [(("leaf", "n"), "int_type")]
    with pytest.raises(ValidationError):
        validated_reply(Tree, ["not", "a", "map"])


def test_a_client_reads_a_newer_reply_and_an_owner_still_refuses_it() -> None:
    pong = {"node_id": "n", "version": "0", "pid": 1, "uptime_s": 0.0}
    newer = {**pong, "load": 0.5}
    assert parse_reply(Ping(), newer) == Pong(**pong)
    with pytest.raises(BadRequest) as strict:
        parse_result(Ping(), newer)
    assert strict.value.details["field"] == "load"


def test_a_reply_malformed_otherwise_is_the_same_bad_request_on_a_client() -> None:
    with pytest.raises(BadRequest) as today:
        parse_result(NodeStatus(), {"node_id": "n"})
    with pytest.raises(BadRequest) as tolerant:
        parse_reply(NodeStatus(), {"node_id": "n", "later": 1})
    assert tolerant.value.message == today.value.message
    assert tolerant.value.details == today.value.details
    assert today.value.details["reason"] == "reply"
