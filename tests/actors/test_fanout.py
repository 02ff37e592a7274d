"""The fan-out budget owner, rule by rule (SPEC §5 R-FAN-*), through an embedded node.

Fast: one in-process node for the module, a fresh budget per test. Expiry driven by a hand-moved
clock lives in test_fanout_properties.py; real processes in test_fanout_processes.py.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from subagents_node.client.fanout import FanoutAPI
from subagents_node.client.paths import owner_db
from subagents_node.messages.base import Message
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.constants import ENV_FANOUT
from subagents_node.messages.envelope import ERROR, Envelope
from subagents_node.messages.errors import (
    BadRequest,
    Busy,
    FanoutBudgetUnavailable,
    FanoutDescriptorInvalid,
    FanoutDescriptorMismatch,
    FanoutError,
    FanoutLimitExceeded,
    FanoutLimitInvalid,
    FanoutReservationCommitted,
    FanoutReservationExpired,
    FanoutReservationUnknown,
    FrameTooLarge,
    NodeTimeout,
    SubagentsError,
)
from subagents_node.messages.fanout import (
    MAX_PATHS,
    ClaimPaths,
    FanoutDescriptor,
    FanoutRejection,
    FanoutSnapshot,
    ReservationGrant,
    ReservePaths,
    decode_descriptor,
    encode_descriptor,
    extend,
    qualify,
)
from subagents_node.messages.node import DebugSleep
from subagents_node.node.node import Node


def stored(node: Node, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """Read the owner's tables from outside (a separate read-only connection)."""
    with sqlite3.connect(f"file:{owner_db(node.state_dir, 'fanout')}?mode=ro", uri=True) as conn:
        return [tuple(row) for row in conn.execute(sql, args)]


# -- R-FAN-1 / R-FAN-2: the descriptor and creation -------------------------------------------


def test_r_fan_1_create_returns_a_version_1_descriptor_naming_its_budget_and_owner(
    shared: Node, fanout: FanoutAPI
) -> None:
    desc = fanout.create(root_run_id="r1", limit=64)
    assert (desc.version, desc.root_run_id, desc.limit, desc.parent_path) == (1, "r1", 64, "")
    assert desc.budget_id.startswith("r1-")
    assert desc.node == shared.address
    assert fanout.snapshot(desc) == FanoutSnapshot(used=0, limit=64, remaining=64)


@pytest.mark.parametrize("limit", [0, -1, 1.5, 2.0, "3", True, None, [3]])
def test_r_fan_2_create_refuses_a_limit_that_is_not_a_positive_integer(
    shared: Node, fanout: FanoutAPI, limit: object
) -> None:
    budgets = stored(shared, "SELECT COUNT(*) FROM fanout_budgets")
    with pytest.raises(FanoutLimitInvalid) as caught:
        fanout.create(root_run_id="r1", limit=limit)  # type: ignore[arg-type]
    assert caught.value.message == "Run fan-out limit must be a positive integer."
    assert stored(shared, "SELECT COUNT(*) FROM fanout_budgets") == budgets


def test_r_fan_2_a_limit_too_large_to_store_is_refused_with_the_same_wording(
    fanout: FanoutAPI,
) -> None:
    with pytest.raises(FanoutLimitInvalid, match=r"^Run fan-out limit must be a positive integer"):
        fanout.create(root_run_id="r1", limit=2**31)


def test_r_fan_2_budget_ids_are_fresh_sanitized_and_never_reused(fanout: FanoutAPI) -> None:
    root = "run/with spaces:" + "x" * 200
    first, second = fanout.create(root, 3), fanout.create(root, 3)
    assert first.budget_id != second.budget_id
    prefix, _, suffix = first.budget_id.rpartition("-")
    assert prefix == ("run_with_spaces_" + "x" * 200)[:120]
    assert len(suffix) == 32
    fanout.claim(first, ["a"])
    assert fanout.snapshot(second).used == 0


# -- R-FAN-3: validation against the manifest -------------------------------------------------


def test_r_fan_3_validate_answers_the_descriptor_normalized(fanout: FanoutAPI) -> None:
    desc = fanout.create("r1", 5)
    child = FanoutDescriptor.model_validate({**desc.model_dump(), "parent_path": "  single  "})
    assert child.parent_path == "single"
    assert fanout.validate(child) == child
    assert fanout.validate(encode_descriptor(child)) == child


def test_r_fan_3_an_unknown_budget_is_unavailable_and_changes_nothing(fanout: FanoutAPI) -> None:
    desc = fanout.create("r1", 5)
    ghost = desc.model_copy(update={"budget_id": "r1-00000000000000000000000000000000"})
    with pytest.raises(FanoutBudgetUnavailable) as caught:
        fanout.claim(ghost, ["a"])
    assert caught.value.message == (
        "Run fan-out budget directory is unavailable: unknown budget "
        "r1-00000000000000000000000000000000"
    )
    assert caught.value.budget_id == ghost.budget_id
    with pytest.raises(FanoutBudgetUnavailable):
        fanout.validate(ghost)
    assert fanout.snapshot(desc).used == 0


@pytest.mark.parametrize(
    ("change", "mismatched"),
    [
        ({"limit": 500}, ["limit"]),
        ({"limit": 1}, ["limit"]),
        ({"root_run_id": "other"}, ["root_run_id"]),
        ({"root_run_id": "other", "limit": 6}, ["root_run_id", "limit"]),
    ],
)
def test_r_fan_3_inv_fan_8_a_descriptor_that_differs_from_its_manifest_is_refused(
    fanout: FanoutAPI, change: dict[str, object], mismatched: list[str]
) -> None:
    desc = fanout.create("r1", 5)
    fanout.claim(desc, ["a", "b", "c", "d"])
    forged = FanoutDescriptor.model_validate({**desc.model_dump(), **change})
    before = fanout.snapshot(desc)
    for attempt in (
        lambda: fanout.validate(forged),
        lambda: fanout.claim(forged, ["e", "f"]),
        lambda: fanout.reserve(forged, ["e"], ttl_s=60),
        lambda: fanout.snapshot(forged),
    ):
        with pytest.raises(FanoutDescriptorMismatch) as caught:
            attempt()
        assert caught.value.message == "Run fan-out budget descriptor does not match its manifest."
        assert caught.value.mismatched == mismatched
    assert fanout.snapshot(desc) == before


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _b64json(value: object) -> str:
    return _b64(json.dumps(value).encode())


GOOD = {"version": 1, "root_run_id": "r", "budget_id": "b", "limit": 3}


@pytest.mark.parametrize(
    ("encoded", "message"),
    [
        ("", "Run fan-out budget descriptor is missing or invalid."),
        ("   ", "Run fan-out budget descriptor is missing or invalid."),
        ("not base64!", "Run fan-out budget descriptor is missing or invalid."),
        ("eyJ=", "Run fan-out budget descriptor is missing or invalid."),
        ("a", "Run fan-out budget descriptor is missing or invalid."),
        (_b64(b"\xff\xfe"), "Run fan-out budget descriptor is missing or invalid."),
        (_b64(b"{not json"), "Run fan-out budget descriptor is missing or invalid."),
        (_b64json([1, 2]), "Run fan-out budget descriptor is missing or invalid."),
        (_b64json("text"), "Run fan-out budget descriptor is missing or invalid."),
        (_b64json({**GOOD, "version": 2}), "Run fan-out budget descriptor is invalid."),
        (_b64json({**GOOD, "version": True}), "Run fan-out budget descriptor is invalid."),
        (_b64json({k: v for k, v in GOOD.items() if k != "version"}), "... is invalid."),
        (_b64json({**GOOD, "root_run_id": ""}), "Run fan-out budget descriptor is invalid."),
        (_b64json({**GOOD, "budget_id": ""}), "Run fan-out budget descriptor is invalid."),
        (_b64json({**GOOD, "limit": 0}), "Run fan-out budget descriptor is invalid."),
        (_b64json({**GOOD, "limit": 2.0}), "Run fan-out budget descriptor is invalid."),
        (_b64json({**GOOD, "limit": "3"}), "Run fan-out budget descriptor is invalid."),
        (_b64json({**GOOD, "parent_path": 7}), "Run fan-out budget descriptor is invalid."),
        (_b64json({**GOOD, "directory": "/tmp"}), "Run fan-out budget descriptor is invalid."),
    ],
)
def test_r_fan_3_a_malformed_encoded_descriptor_is_invalid_and_changes_nothing(
    fanout: FanoutAPI, encoded: str, message: str
) -> None:
    desc = fanout.create("r1", 5)
    before = fanout.snapshot(desc)
    with pytest.raises(FanoutDescriptorInvalid) as caught:
        fanout.claim(encoded, ["a"])
    expected = message.replace("...", "Run fan-out budget descriptor")
    assert caught.value.message == expected
    assert caught.value.reason
    assert fanout.snapshot(desc) == before


# -- R-FAN-4 / R-FAN-5: the environment ------------------------------------------------------


def test_r_fan_4_encoding_is_unpadded_base64url_of_sorted_utf8_json(fanout: FanoutAPI) -> None:
    desc = extend(fanout.create("räun", 7), "tasks[0]")
    encoded = encode_descriptor(desc)
    assert "=" not in encoded and "+" not in encoded and "/" not in encoded
    raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
    fields = json.loads(raw)
    assert list(fields) == sorted(fields)
    assert fields == {**desc.model_dump(), "parent_path": "tasks[0]"}
    assert "räun" in raw  # UTF-8, not \\u escapes
    bare = encode_descriptor(desc.model_copy(update={"parent_path": "", "node": ""}))
    assert set(json.loads(base64.urlsafe_b64decode(bare + "==="))) == {
        "version",
        "root_run_id",
        "budget_id",
        "limit",
    }
    assert decode_descriptor(encoded) == desc


def test_r_fan_4_from_env_is_none_when_unset_and_the_validated_descriptor_when_set(
    fanout: FanoutAPI,
) -> None:
    desc = extend(fanout.create("r1", 4), "single")
    assert fanout.from_env({}) is None
    assert fanout.from_env({ENV_FANOUT: "  "}) is None
    assert fanout.from_env({ENV_FANOUT: encode_descriptor(desc)}) == desc


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("%%%", FanoutDescriptorInvalid),
        (_b64json({**GOOD, "budget_id": "r1-gone"}), FanoutBudgetUnavailable),
    ],
)
def test_r_fan_5_an_invalid_inherited_value_is_refused_with_the_inherited_wording(
    fanout: FanoutAPI, value: str, error: type[SubagentsError]
) -> None:
    with pytest.raises(error) as caught:
        fanout.from_env({ENV_FANOUT: value})
    assert caught.value.message.startswith("Invalid inherited run fan-out budget: Run fan-out ")


def test_r_fan_5_an_inherited_descriptor_that_raises_its_limit_is_refused(
    fanout: FanoutAPI,
) -> None:
    desc = fanout.create("r1", 4)
    forged = encode_descriptor(desc.model_copy(update={"limit": 400}))
    with pytest.raises(FanoutDescriptorMismatch, match=r"^Invalid inherited run fan-out budget: "):
        fanout.from_env({ENV_FANOUT: forged})


# -- R-FAN-11 / R-FAN-12: qualification -------------------------------------------------------


@pytest.mark.parametrize(
    ("parent", "path", "qualified"),
    [
        ("", "tasks[0]", "tasks[0]"),
        ("   ", "tasks[0]", "tasks[0]"),
        ("workflow[scan]", "tasks[1]", "workflow[scan]/tasks[1]"),
        ("  workflow[scan]/r1 ", "tasks[2]", "workflow[scan]/r1/tasks[2]"),
    ],
)
def test_r_fan_11_qualify_prefixes_the_trimmed_parent_path(
    parent: str, path: str, qualified: str
) -> None:
    assert qualify(parent, path) == qualified


def test_r_fan_12_inv_fan_7_each_child_extends_the_parent_path_by_one_segment(
    fanout: FanoutAPI,
) -> None:
    root = fanout.create("r1", 10)
    nested = extend(extend(root, "workflow[scan]"), "r1")
    assert nested.parent_path == "workflow[scan]/r1"
    assert (nested.budget_id, nested.limit, nested.root_run_id) == (root.budget_id, 10, "r1")
    with pytest.raises(FanoutLimitExceeded) as caught:
        fanout.claim(nested, [f"tasks[{i}]" for i in range(11)])
    assert caught.value.rejection.path == "workflow[scan]/r1/tasks[10]"
    with pytest.raises(ValueError):
        extend(root, " ")


# -- R-FAN-13..17: admission ------------------------------------------------------------------


def test_r_fan_13_inv_fan_2_a_batch_is_admitted_all_or_nothing(fanout: FanoutAPI) -> None:
    desc = fanout.create("r1", 5)
    assert fanout.claim(desc, ["a", "b", "c"]).used == 3
    with pytest.raises(FanoutLimitExceeded):
        fanout.claim(desc, ["d", "e", "f"])
    assert fanout.snapshot(desc).used == 3
    assert fanout.claim(desc, ["d", "e"]) == FanoutSnapshot(used=5, limit=5, remaining=0)


def test_r_fan_13_an_empty_batch_claims_nothing_even_when_the_budget_is_full(
    fanout: FanoutAPI,
) -> None:
    desc = fanout.create("r1", 1)
    assert fanout.claim(desc, []) == FanoutSnapshot(used=0, limit=1, remaining=1)
    fanout.claim(desc, ["a"])
    assert fanout.claim(desc, []) == FanoutSnapshot(used=1, limit=1, remaining=0)
    assert fanout.reserve(desc, [], ttl_s=5).commit().used == 1


def test_r_fan_13_claims_are_stored_once_each_under_their_qualified_paths(
    shared: Node, fanout: FanoutAPI
) -> None:
    desc = extend(fanout.create("r1", 10), "chain[0]")
    fanout.claim(desc, ["tasks[0]", "tasks[1]"])
    fanout.claim(desc, ["tasks[0]"])  # R-FAN-11: labels, not keys: duplicates count
    rows = stored(
        shared,
        "SELECT seq, path, reservation_id FROM fanout_claims WHERE budget_id = ? ORDER BY seq",
        desc.budget_id,
    )
    assert rows == [
        (0, "chain[0]/tasks[0]", None),
        (1, "chain[0]/tasks[1]", None),
        (2, "chain[0]/tasks[0]", None),
    ]
    assert stored(
        shared, "SELECT used FROM fanout_budgets WHERE budget_id = ?", desc.budget_id
    ) == [(3,)]


def test_r_fan_13_a_refused_batch_leaves_the_count_and_the_sequence_where_they_were(
    shared: Node, fanout: FanoutAPI
) -> None:
    desc = fanout.create("r1", 3)
    fanout.claim(desc, ["a"])
    wrong_root = desc.model_copy(update={"root_run_id": "r2"})
    for refused, error in (
        (desc, FanoutLimitExceeded),  # 3 do not fit in the 2 left
        (wrong_root, FanoutDescriptorMismatch),
        (desc.model_copy(update={"limit": 4}), FanoutDescriptorMismatch),
    ):
        with pytest.raises(error):
            fanout.claim(refused, ["b", "c", "d"])
    counts = "SELECT used, next_seq FROM fanout_budgets WHERE budget_id = ?"
    assert stored(shared, counts, desc.budget_id) == [(1, 1)]
    assert fanout.claim(desc, ["b", "c"]) == FanoutSnapshot(used=3, limit=3, remaining=0)
    assert stored(
        shared,
        "SELECT seq, path FROM fanout_claims WHERE budget_id = ? ORDER BY seq",
        desc.budget_id,
    ) == [(0, "a"), (1, "b"), (2, "c")]


def test_r_fan_14_claim_answers_the_snapshot_taken_after_its_claims(fanout: FanoutAPI) -> None:
    desc = fanout.create("r1", 4)
    assert fanout.claim(desc, ["a"]) == FanoutSnapshot(used=1, limit=4, remaining=3)
    assert fanout.claim(desc, ["b", "c"]) == FanoutSnapshot(used=3, limit=4, remaining=1)


def test_r_fan_15_claims_are_permanent_across_a_node_restart(state_dir: Path) -> None:
    with Node.embedded(state_dir=state_dir) as first:
        api = first.client().fanout
        desc = api.create("r1", 3)
        api.claim(desc, ["a", "b"])
    with Node.embedded(state_dir=state_dir) as second:
        api = second.client().fanout
        assert api.snapshot(desc) == FanoutSnapshot(used=2, limit=3, remaining=1)
        with pytest.raises(FanoutLimitExceeded):
            api.claim(desc, ["c", "d"])


WORKFLOW_BATCH = ["workflow[a]", "workflow[b]", "workflow[c]"]


def test_r_fan_13_a_batch_sent_again_with_its_claim_id_is_charged_once_even_when_it_filled_up(
    shared: Node, fanout: FanoutAPI
) -> None:
    """A workflow host sends its admission again when its node was lost before answering:
    with the same claim id it claims nothing more and is not refused for the room its own
    first attempt took; a new batch still is (R-FAN-16), and nothing is refunded (R-FAN-15)."""
    desc = extend(fanout.create("r1", 3), "w")
    admission = uuid.uuid4().hex  # one per batch: ids are unique across every budget
    first = fanout.claim(desc, WORKFLOW_BATCH, claim_id=admission)
    assert first == FanoutSnapshot(used=3, limit=3, remaining=0)
    assert fanout.claim(desc, WORKFLOW_BATCH, claim_id=admission) == first
    with pytest.raises(FanoutLimitExceeded):
        fanout.claim(desc, ["workflow[d]"], claim_id=uuid.uuid4().hex)
    with pytest.raises(FanoutReservationCommitted):
        fanout.abort(admission)
    assert stored(
        shared, "SELECT path FROM fanout_claims WHERE budget_id = ? ORDER BY seq", desc.budget_id
    ) == [("w/workflow[a]",), ("w/workflow[b]",), ("w/workflow[c]",)]
    assert fanout.snapshot(desc).used == 3


def test_r_fan_13_a_claim_id_used_again_for_another_batch_is_refused_and_changes_nothing(
    fanout: FanoutAPI,
) -> None:
    desc = fanout.create("r1", 5)
    other = fanout.create("r2", 5)
    admission = uuid.uuid4().hex
    fanout.claim(desc, ["a", "b"], claim_id=admission)
    for budget, paths in ((desc, ["a"]), (desc, ["a", "c"]), (other, ["a", "b"])):
        with pytest.raises(BadRequest, match=f"claim id {admission} was used for another claim"):
            fanout.claim(budget, paths, claim_id=admission)
    assert (fanout.snapshot(desc).used, fanout.snapshot(other).used) == (2, 0)


def test_r_fan_13_a_refused_batch_leaves_its_claim_id_unused(fanout: FanoutAPI) -> None:
    desc = fanout.create("r1", 2)
    admission = uuid.uuid4().hex
    with pytest.raises(FanoutLimitExceeded):
        fanout.claim(desc, ["a", "b", "c"], claim_id=admission)
    assert fanout.claim(desc, ["a", "b"], claim_id=admission).used == 2


def test_r_fan_16_rejection_names_first_path_that_does_not_fit(fanout: FanoutAPI) -> None:
    desc = extend(fanout.create("r1", 5), "workflow[scan]")
    fanout.claim(desc, ["a", "b"])
    before = fanout.snapshot(desc)
    with pytest.raises(FanoutLimitExceeded) as caught:
        fanout.claim(desc, ["tasks[0]", "tasks[1]", "tasks[2]", "tasks[3]"])
    err = caught.value
    assert err.code == "RUN_FANOUT_LIMIT"
    assert err.details == {
        "code": "RUN_FANOUT_LIMIT",
        "path": "workflow[scan]/tasks[3]",
        "requested": 4,
        "used": 2,
        "limit": 5,
        "remaining": 3,
    }
    assert err.message == (
        "Run fan-out limit reached at workflow[scan]/tasks[3] (2/5 used; 4 requested, "
        "3 remaining). No children from this admission group were started. Start a new "
        "top-level run or raise max_subagent_spawns_per_run."
    )
    assert err.snapshot == before
    assert fanout.snapshot(desc) == before


def test_r_fan_16_the_rejection_is_the_same_typed_error_over_the_wire(shared: Node) -> None:
    api = shared.client("zmq").fanout
    desc = api.create("r1", 1)
    api.claim(encode_descriptor(desc), ["a"])
    with pytest.raises(FanoutLimitExceeded) as caught:
        api.claim(desc, ["b"])
    assert caught.value.rejection.path == "b"
    assert caught.value.rejection.remaining == 0


def test_r_fan_17_snapshot_reports_remaining_and_renders_its_text_form(
    fanout: FanoutAPI,
) -> None:
    desc = fanout.create("r1", 3)
    snap = fanout.claim(desc, ["a"])
    assert snap.text == "Run fan-out: 1/3 used, 2 remaining"
    assert FanoutSnapshot.of(5, 3).remaining == 0


def test_r_fan_13_requests_beyond_the_schema_bounds_are_refused_and_change_nothing(
    fanout: FanoutAPI,
) -> None:
    desc = fanout.create("r1", MAX_PATHS + 5)
    for paths in (["x" * 513], [""], ["p"] * (MAX_PATHS + 1)):
        with pytest.raises(BadRequest):
            fanout.claim(desc, paths)
    for ttl in (0, -1, 3601):
        with pytest.raises(BadRequest):
            fanout.reserve(desc, ["a"], ttl_s=ttl)
    with pytest.raises(BadRequest):
        fanout.create("", 3)
    assert fanout.snapshot(desc).used == 0
    # Each field may sit at its bound, but the frame as a whole has a limit too: refused
    # before anything is sent, with a typed error.
    with pytest.raises(FrameTooLarge):
        fanout.claim(desc, ["x" * 512] * MAX_PATHS)
    assert fanout.claim(desc, ["x" * 512] * 100).used == 100
    assert fanout.claim(desc, [f"p{i}" for i in range(MAX_PATHS - 100)]).used == MAX_PATHS


# -- R-FAN-18: an unreachable owner fails closed, never as a limit ----------------------------


def _occupy(node: Node, ms: int) -> threading.Event:
    """Keep the fanout owner busy for `ms`; the event is set when it is free again."""
    done = threading.Event()
    node.dispatcher.dispatch(DebugSleep(ms=ms), "fanout", lambda outcome: done.set())
    return done


def test_r_fan_18_an_owner_that_does_not_answer_fails_after_a_bounded_wait(
    embedded_node: Node,
) -> None:
    api = embedded_node.client().fanout
    desc = api.create("r1", 3)
    free = _occupy(embedded_node, 600)
    with pytest.raises(NodeTimeout):
        embedded_node.client(timeout=0.2).fanout.claim(desc, ["a"])
    assert free.wait(10)
    assert api.snapshot(desc).limit == 3


def test_r_fan_18_a_saturated_owner_refuses_with_busy_and_claims_nothing(
    state_dir: Path,
) -> None:
    with Node.embedded(state_dir=state_dir, faults=True, mailbox_limit=1) as node:
        api = node.client().fanout
        desc = api.create("r1", 3)
        free = _occupy(node, 400)
        outcomes: list[Message | SubagentsError] = []
        answered = threading.Semaphore(0)

        def keep(outcome: Message | SubagentsError) -> None:
            outcomes.append(outcome)
            answered.release()

        for path in ("a", "b"):
            node.dispatcher.dispatch(ClaimPaths(descriptor=desc, paths=[path]), "", keep)
        assert answered.acquire(timeout=10) and answered.acquire(timeout=10)
        refused = [o for o in outcomes if isinstance(o, Busy)]
        # The owner reads both while its mailbox holds one: the second is refused unqueued.
        assert refused and refused[0].details["target"] == "fanout"
        assert free.wait(10)
        assert api.snapshot(desc).used == 2 - len(refused)


# -- two-phase claims: reserve, commit, abort (R-FAN-14, SPEC §0.4, DESIGN §2) ---------------


def test_r_fan_14_reserved_claims_count_as_used_until_committed(fanout: FanoutAPI) -> None:
    desc = fanout.create("r1", 3)
    res = fanout.reserve(desc, ["chain[0]", "chain[1]"], ttl_s=60)
    assert res.snapshot == FanoutSnapshot(used=2, limit=3, remaining=1)
    assert fanout.snapshot(desc).used == 2
    with pytest.raises(FanoutLimitExceeded) as caught:
        fanout.claim(desc, ["x", "y"])
    assert caught.value.rejection.used == 2
    assert res.commit() == FanoutSnapshot(used=2, limit=3, remaining=1)
    assert res.commit().used == 2  # a retried commit is harmless
    with pytest.raises(FanoutReservationCommitted):
        res.abort()
    assert fanout.snapshot(desc).used == 2


def test_r_fan_14_abort_frees_exactly_the_reserved_claims(shared: Node, fanout: FanoutAPI) -> None:
    desc = fanout.create("r1", 5)
    fanout.claim(desc, ["a"])
    res = fanout.reserve(desc, ["b", "c", "d"], ttl_s=60)
    fanout.claim(desc, ["e"])
    assert res.abort() == FanoutSnapshot(used=2, limit=5, remaining=3)
    assert res.abort().used == 2  # aborting twice is harmless
    paths = stored(shared, "SELECT path FROM fanout_claims WHERE budget_id = ?", desc.budget_id)
    assert sorted(p for (p,) in paths) == ["a", "e"]


def test_r_fan_14_commit_after_abort_is_refused_and_changes_nothing(fanout: FanoutAPI) -> None:
    desc = fanout.create("r1", 5)
    res = fanout.reserve(desc, ["a"], ttl_s=60)
    res.abort()
    before = fanout.snapshot(desc)
    with pytest.raises(FanoutReservationExpired) as caught:
        res.commit()
    assert caught.value.state == "aborted"
    assert caught.value.snapshot == before
    assert fanout.snapshot(desc) == before


def test_r_fan_14_an_unknown_reservation_is_refused(fanout: FanoutAPI) -> None:
    for call in (fanout.commit, fanout.abort):
        with pytest.raises(FanoutReservationUnknown) as caught:
            call("no-such-reservation")
        assert caught.value.reservation_id == "no-such-reservation"


def test_r_fan_14_a_reservation_sent_again_under_its_callers_id_is_made_once(
    shared: Node, fanout: FanoutAPI
) -> None:
    """A reserve whose answer was lost with its owner is sent again (actors/pipelines.py) under
    the id its caller picked: it holds nothing more and answers the same grant, full budget or
    not; once it ended, or for other paths, the id reserves nothing (an append's reserve was
    not resendable, and a reservation whose answer was lost held its claims for its TTL)."""
    client = shared.client()
    desc = fanout.create("r1", 2)
    other = fanout.create("r2", 2)
    rid = uuid.uuid4().hex
    ask = ReservePaths(descriptor=desc, paths=["a", "b"], ttl_s=60, reservation_id=rid)
    assert ask.resendable_as_sent()
    assert not ReservePaths(descriptor=desc, paths=["a"], ttl_s=60).resendable_as_sent()
    first = client.ask(ask, ReservationGrant)
    assert (first.reservation_id, first.snapshot.used) == (rid, 2)
    again = client.ask(ask, ReservationGrant)
    assert (again.reservation_id, again.claims, again.expires_at) == (rid, 2, first.expires_at)
    for budget, paths in ((desc, ["a"]), (desc, ["a", "c"]), (other, ["a", "b"])):
        with pytest.raises(BadRequest, match=f"reservation id {rid} was used for another"):
            client.ask(
                ReservePaths(descriptor=budget, paths=paths, ttl_s=60, reservation_id=rid),
                ReservationGrant,
            )
    assert fanout.abort(rid).used == 0
    with pytest.raises(FanoutReservationExpired):
        client.ask(ask, ReservationGrant)
    assert (fanout.snapshot(desc).used, fanout.snapshot(other).used) == (0, 0)


def test_r_fan_14_a_reservation_block_commits_on_success_and_aborts_on_error(
    fanout: FanoutAPI,
) -> None:
    desc = fanout.create("r1", 5)
    with fanout.reserve(desc, ["a"], ttl_s=60):
        pass
    with (
        pytest.raises(RuntimeError, match="launch failed"),
        fanout.reserve(desc, ["b", "c"], ttl_s=60) as res,
    ):
        assert fanout.snapshot(desc).used == 3
        raise RuntimeError("launch failed")
    assert fanout.snapshot(desc).used == 1
    with pytest.raises(FanoutReservationExpired):
        res.commit()


def _subclasses(kind: type[FanoutError]) -> list[type[FanoutError]]:
    return [kind] + [k for sub in kind.__subclasses__() for k in _subclasses(sub)]


def test_r_fan_16_every_fanout_refusal_keeps_its_type_and_details_across_the_wire() -> None:
    kinds = _subclasses(FanoutError)
    assert len({k.code for k in kinds}) == len(kinds) == 10
    rejection = FanoutRejection(path="p", requested=2, used=1, limit=2, remaining=1)
    for kind in kinds:
        err = FanoutLimitExceeded.of(rejection) if kind is FanoutLimitExceeded else kind("m", x=1)
        frame = encode(Envelope(type=ERROR, body=err.to_wire()))
        again = SubagentsError.from_wire(decode(frame).body)
        assert type(again) is kind
        assert (again.message, again.details) == (err.message, err.details)
    wired = SubagentsError.from_wire(FanoutLimitExceeded.of(rejection).to_wire())
    assert isinstance(wired, FanoutLimitExceeded) and wired.rejection == rejection
