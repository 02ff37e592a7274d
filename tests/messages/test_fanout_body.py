"""A claim's body carries its descriptor's dump made once per descriptor object
(`FanoutDescriptor.fields`, `ClaimPaths.to_body`): it must be the body the generic dump makes,
and the cache must never show in a descriptor's equality, hash, copies or pickles."""

from __future__ import annotations

import copy
import pickle

import pytest

from subagents_node.messages.base import Message
from subagents_node.messages.fanout import ClaimPaths, FanoutDescriptor, extend


def _descriptor(**extra: object) -> FanoutDescriptor:
    return FanoutDescriptor.model_validate(
        {"root_run_id": "r1", "budget_id": "r1-abc", "limit": 64, **extra}
    )


@pytest.mark.parametrize("claim_id", [None, "6f1c2d"])
@pytest.mark.parametrize("extra", [{}, {"parent_path": " tasks[1] ", "node": "ipc:///tmp/n.sock"}])
def test_a_claims_body_is_the_generic_dump_key_for_key(
    claim_id: str | None, extra: dict[str, object]
) -> None:
    descriptor = _descriptor(**extra)
    for _ in range(2):  # the second one from the cached dump
        request = ClaimPaths(descriptor=descriptor, paths=["a", "b/c"], claim_id=claim_id)
        body = request.to_body()
        assert body == Message.to_body(request)
        assert list(body) == list(Message.to_body(request))
        assert ("claim_id" in body) is (claim_id is not None)  # added later: absent when None


def test_a_body_is_a_copy_the_caller_may_change() -> None:
    descriptor = _descriptor()
    first = ClaimPaths(descriptor=descriptor, paths=["a"]).to_body()
    first["descriptor"]["limit"] = 1
    first["paths"].append("b")
    again = ClaimPaths(descriptor=descriptor, paths=["a"]).to_body()
    assert again["descriptor"]["limit"] == 64 and again["paths"] == ["a"]


def test_the_cached_dump_never_shows_in_equality_copies_or_pickles() -> None:
    cached, fresh = _descriptor(), _descriptor()
    cached.fields()
    assert cached == fresh and hash(cached) == hash(fresh)
    assert pickle.loads(pickle.dumps(cached)) == fresh
    assert copy.deepcopy(cached) == fresh and copy.copy(cached) == fresh
    assert cached.model_copy(update={"limit": 7}).fields()["limit"] == 7
    assert extend(cached, "tasks[2]").fields()["parent_path"] == "tasks[2]"
    assert cached.__pydantic_private__ in (None, {})
