"""`fanout.snapshots`: many budgets read in one request (the views of many runs, R-FAN-26).

Through an embedded node's real fan-out owner: each reading is what `fanout.snapshot` would
answer for its descriptor, in the request's order; a budget that cannot be read is a refusal in
its own reading only (R-FAN-3's wording); a batch beyond its bound is a `BadRequest` before
anything is sent, and the client splits a longer list into batches by itself.
"""

from __future__ import annotations

import pytest

from subagents_node.client.fanout import FanoutAPI
from subagents_node.client.plans import build
from subagents_node.messages.errors import BadRequest, FanoutBudgetUnavailable
from subagents_node.messages.fanout import (
    MAX_READINGS,
    BudgetReading,
    FanoutDescriptor,
    FanoutSnapshot,
    ReadSnapshots,
)


def test_r_fan_26_one_request_reads_every_budget_in_order_and_a_bad_one_spoils_only_its_own(
    fanout: FanoutAPI,
) -> None:
    busy, idle = fanout.create("r1", 5), fanout.create("r2", 3)
    fanout.claim(busy, ["a", "b"])
    ghost = busy.model_copy(update={"budget_id": "r1-00000000000000000000000000000000"})
    forged = FanoutDescriptor.model_validate({**idle.model_dump(), "limit": 300})

    readings = fanout.snapshots([busy, ghost, idle, forged, busy])

    with pytest.raises(FanoutBudgetUnavailable) as unknown:
        fanout.snapshot(ghost)
    assert readings == [
        BudgetReading(snapshot=FanoutSnapshot.of(2, 5)),
        BudgetReading(code="fanout_budget_unavailable", error=unknown.value.message),
        BudgetReading(snapshot=FanoutSnapshot.of(0, 3)),
        BudgetReading(
            code="fanout_descriptor_mismatch",
            error="Run fan-out budget descriptor does not match its manifest.",
        ),
        BudgetReading(snapshot=FanoutSnapshot.of(2, 5)),
    ]
    assert fanout.snapshots([]) == []


def test_r_fan_26_a_batch_beyond_its_bound_is_refused_and_the_client_splits_a_longer_list(
    fanout: FanoutAPI,
) -> None:
    budget = fanout.create("r1", 4)
    fanout.claim(budget, ["a"])
    with pytest.raises(BadRequest):
        build(ReadSnapshots, descriptors=[budget] * (MAX_READINGS + 1))

    readings = fanout.snapshots([budget] * (MAX_READINGS + 1))

    assert readings == [BudgetReading(snapshot=FanoutSnapshot.of(1, 4))] * (MAX_READINGS + 1)
    assert fanout.snapshot(budget).used == 1
