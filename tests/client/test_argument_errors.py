"""A bad argument to the client is a one-line BadRequest naming it, before anything is sent:
never pydantic's ValidationError, msgpack's OverflowError, float's ValueError or an
AttributeError from deep inside, and never a request that means something else (a string
read as one path per character). Sync and asyncio clients alike (they share the plans).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from subagents_node.client.channel import encode_frame
from subagents_node.client.client import Client, connect
from subagents_node.messages.envelope import Envelope
from subagents_node.messages.errors import BadRequest

NAN = float("nan")
INF = float("inf")


#: No node is ever there: each argument is refused before anything looks for one.
NOWHERE = "ipc:///tmp/no-node-here/node.sock"


@pytest.fixture
def client() -> Iterator[Client]:
    with connect(NOWHERE) as client:
        yield client


def _refused(call: Callable[[], Any], field: str) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        call()
    assert info.value.details.get("field") == field, info.value.details
    assert "\n" not in info.value.message
    return info.value


@pytest.mark.parametrize("limit", [2**64, 2**63, -(2**64)])
def test_an_integer_no_wire_can_carry_is_refused_naming_its_field(
    limit: int, client: Client
) -> None:
    _refused(lambda: client.fanout.create(root_run_id="x", limit=limit), "limit")


def test_a_frame_with_an_integer_past_64_bits_is_refused_naming_where_it_is() -> None:
    # What a request that escaped its schema would carry: the seam says where, not msgpack.
    env = Envelope(type="fanout.create", body={"root_run_id": "x", "limit": [1, {"n": 2**70}]})
    _refused(lambda: encode_frame(env), "limit.1.n")
