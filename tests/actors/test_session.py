"""SessionActor: the session spawn budget with grants (SPEC §6, R-SPN-1..6, INV-SPN-1).

Unit tests go through an embedded node and the in-process client; the last tests use a real
node process over its ipc socket (typed errors across the wire, durability across kill -9).
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from subagents_node import Client, Node, connect
from subagents_node.messages.errors import BadRequest, GrantRejected, SpawnBudgetExceeded
from subagents_node.messages.session import GRANT_HISTORY_MAX, GrantResult
from tests.support.nodes import short_dir

if TYPE_CHECKING:
    from tests.support.nodes import NodeProcess


@pytest.fixture(scope="module")
def session_node() -> Iterator[Node]:
    state = str(short_dir())
    try:
        with Node.embedded(state_dir=state) as node:
            yield node
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def client(session_node: Node) -> Client:
    return session_node.client()


@pytest.fixture
def sid() -> str:
    """A fresh session id per test: budgets of different sessions never interact."""
    return f"s-{uuid.uuid4().hex[:10]}"


def _state(client: Client, sid: str) -> tuple[object, ...]:
    status = client.session.status(sid)
    return (status.snapshot, status.active, [(r.run_id, r.state) for r in status.runs])


# -- R-SPN-1: per-session state, fixed configured limit ----------------------------------------


def test_r_spn_1_first_open_fixes_configured_limit_and_a_second_open_keeps_it(
    client: Client, sid: str
) -> None:
    first = client.session.open(sid, configured_limit=5)
    assert first.created and not first.limit_differs
    again = client.session.open(sid, configured_limit=9)
    assert not again.created
    assert again.limit_differs
    assert again.requested_limit == 9
    assert "configured limit 5" in again.note and "9 is ignored" in again.note
    assert again.snapshot.configured == 5 and again.snapshot.limit == 5
    same = client.session.open(sid, configured_limit=5)
    assert not same.created and not same.limit_differs


@pytest.mark.parametrize("limit", [None, 0])
def test_r_spn_1_r_cfg_4_open_without_cap_or_with_zero_is_unlimited(
    client: Client, sid: str, limit: int | None
) -> None:
    snap = client.session.open(sid, configured_limit=limit).snapshot
    assert snap.opened and snap.unlimited and snap.configured is None


def test_r_spn_1_each_session_id_has_its_own_budget(client: Client, sid: str) -> None:
    other = sid + "-other"
    client.session.open(sid, 3)
    client.session.open(other, 3)
    client.session.reserve(sid, 3)
    assert client.session.snapshot(sid).remaining == 0
    assert client.session.snapshot(other).remaining == 3


# -- R-SPN-2: snapshot and text ------------------------------------------------------------------


def test_r_spn_2_capped_snapshot_reports_limit_remaining_and_allowance(
    client: Client, sid: str
) -> None:
    client.session.open(sid, 10)
    client.session.reserve(sid, 4)
    client.session.grant(sid, 3, authority="auto")
    snap = client.session.snapshot(sid)
    assert (snap.used, snap.limit, snap.granted, snap.remaining) == (4, 13, 3, 9)
    assert (snap.grant_remaining, snap.configured, len(snap.history)) == (7, 10, 1)
    assert snap.text() == (
        "Spawn budget: 4/13 used, 9 remaining (configured 10; granted 3; grant allowance 7)"
    )


def test_r_spn_2_unlimited_snapshot_has_null_limits_and_text_unlimited(
    client: Client, sid: str
) -> None:
    client.session.open(sid, None)
    snap = client.session.snapshot(sid)
    assert (snap.limit, snap.remaining, snap.grant_remaining, snap.configured) == (
        None,
        None,
        None,
        None,
    )
    assert snap.granted == 0 and snap.used == 0 and snap.history == []
    assert snap.text() == "Spawn budget: unlimited"


def test_r_spn_2_a_never_opened_session_reads_unlimited_with_nothing_used(
    client: Client, sid: str
) -> None:
    snap = client.session.snapshot(sid)
    assert not snap.opened and snap.unlimited and snap.used == 0
    assert client.session.reserve(sid, 1000).counted == 0
    assert client.session.snapshot(sid) == snap


# -- R-SPN-4 / R-SPN-5: preflight and reserve ------------------------------------------------------


def test_r_spn_4_preflight_passes_for_zero_requested_and_for_unlimited_sessions(
    client: Client, sid: str
) -> None:
    client.session.open(sid, 2)
    client.session.reserve(sid, 2)
    assert client.session.preflight(sid, 0).remaining == 0
    client.session.open(sid + "-u", None)
    assert client.session.preflight(sid + "-u", 10**6).unlimited


def test_r_spn_4_request_equal_to_remaining_fits(client: Client, sid: str) -> None:
    client.session.open(sid, 5)
    client.session.reserve(sid, 2)
    assert client.session.preflight(sid, 3).remaining == 3
    assert client.session.reserve(sid, 3).snapshot.remaining == 0


def test_r_spn_4_refusal_has_the_spec_message_and_details_and_changes_nothing(
    client: Client, sid: str
) -> None:
    client.session.open(sid, 5)
    client.session.reserve(sid, 3)
    before = _state(client, sid)
    for call in (client.session.preflight, client.session.reserve):
        with pytest.raises(SpawnBudgetExceeded) as info:
            call(sid, 3)
        err = info.value
        assert err.message == (
            "Subagent spawn limit reached for this session (3/5 used, 3 requested). 2 remaining; "
            "the declared run cannot fit, so no children were started. Grant budget explicitly "
            "from the root interactive session or start a new session."
        )
        assert (err.used, err.limit, err.requested, err.remaining) == (3, 5, 3, 2)
        assert _state(client, sid) == before


def test_r_spn_5_reserve_counts_only_when_a_cap_exists(client: Client, sid: str) -> None:
    client.session.open(sid, 10)
    result = client.session.reserve(sid, 4)
    assert result.counted == 4 and result.snapshot.used == 4
    assert client.session.reserve(sid, 0).counted == 0
    unlimited = sid + "-u"
    client.session.open(unlimited, None)
    for _ in range(3):
        assert client.session.reserve(unlimited, 7).counted == 0
    assert client.session.snapshot(unlimited).used == 0


def test_r_spn_5_a_reservation_sent_again_with_its_id_counts_once_even_when_it_filled_up(
    client: Client, sid: str
) -> None:
    """A launch sent again after its node was lost (the owner had counted it) carries the same
    reservation id: it counted twice, and in a session its first attempt filled it was refused
    (R-SPN-4). Now it is found: counted once, not refused, nothing refunded."""
    client.session.open(sid, 3)
    launch = uuid.uuid4().hex
    first = client.session.reserve(sid, 3, reservation_id=launch)
    assert (first.counted, first.repeated, first.snapshot.used) == (3, False, 3)
    assert client.session.preflight(sid, 3, reservation_id=launch).used == 3
    again = client.session.reserve(sid, 3, reservation_id=launch)
    assert (again.counted, again.repeated, again.snapshot.used) == (0, True, 3)
    with pytest.raises(SpawnBudgetExceeded):
        client.session.reserve(sid, 1, reservation_id=uuid.uuid4().hex)
    assert client.session.snapshot(sid).used == 3


def test_r_spn_5_a_reservation_id_used_again_for_another_reservation_is_refused_and_changes_nothing(
    client: Client, sid: str
) -> None:
    client.session.open(sid, 10)
    other = sid + "-b"
    client.session.open(other, 10)
    launch = uuid.uuid4().hex
    client.session.reserve(sid, 2, reservation_id=launch)
    before = (_state(client, sid), _state(client, other))
    for session, requested in ((sid, 3), (other, 2)):
        for call in (client.session.preflight, client.session.reserve):
            with pytest.raises(BadRequest) as info:
                call(session, requested, reservation_id=launch)
            assert info.value.details["reason"] == "reservation_id"
    assert (_state(client, sid), _state(client, other)) == before


def test_r_spn_5_a_refused_or_uncounted_reservation_leaves_its_id_unused(
    client: Client, sid: str
) -> None:
    """Only a counted reservation is kept: one refused (R-SPN-4) or made while the session was
    unlimited counted nothing, so the id counts when it fits."""
    client.session.open(sid, 2)
    launch = uuid.uuid4().hex
    with pytest.raises(SpawnBudgetExceeded):
        client.session.reserve(sid, 3, reservation_id=launch)
    assert client.session.reserve(sid, 2, reservation_id=launch).counted == 2
    unlimited, free = sid + "-u", uuid.uuid4().hex
    client.session.open(unlimited, None)
    assert client.session.reserve(unlimited, 4, reservation_id=free).counted == 0
    roomy = sid + "-r"
    client.session.open(roomy, 5)
    assert client.session.reserve(roomy, 4, reservation_id=free).counted == 4


@pytest.mark.parametrize("requested", [-1, 1.5, "2", True, None, 2**31])
def test_r_spn_4_bad_requested_is_a_schema_error_and_changes_nothing(
    client: Client, sid: str, requested: object
) -> None:
    client.session.open(sid, 5)
    before = _state(client, sid)
    for call in (client.session.preflight, client.session.reserve):
        with pytest.raises(BadRequest) as info:
            call(sid, requested)  # type: ignore[arg-type]
        assert info.value.details["reason"] == "schema"
    assert _state(client, sid) == before


def test_session_ids_must_be_non_empty(client: Client) -> None:
    with pytest.raises(BadRequest):
        client.session.open("", 3)


# -- R-SPN-6: grants ---------------------------------------------------------------------------


def _capped_with_usage(client: Client, sid: str, configured: int = 10, used: int = 4) -> None:
    client.session.open(sid, configured)
    client.session.reserve(sid, used)


def test_r_spn_6_grant_raises_limit_keeps_usage_and_records_history(
    client: Client, sid: str
) -> None:
    _capped_with_usage(client, sid)
    result = client.session.grant(sid, 6, authority="auto")
    assert result.applied and result.outcome == "granted"
    assert result.entry is not None
    assert (result.entry.previous_limit, result.entry.limit, result.entry.amount) == (10, 16, 6)
    assert result.entry.session_id == sid and result.entry.granted_at > 0
    snap = result.snapshot
    assert (snap.used, snap.limit, snap.granted, snap.grant_remaining) == (4, 16, 6, 4)
    assert snap.history == [result.entry]


def test_r_spn_6_a_grant_of_one_spawn_says_one_spawn(client: Client, sid: str) -> None:
    """`grant 1` printed "Granted 1 more spawns" (and asked "Grant 1 more spawns?")."""
    _capped_with_usage(client, sid)
    asked: list[str] = []

    def confirm(preview: GrantResult) -> bool:
        asked.append(preview.text().splitlines()[0])
        return True

    one = client.session.grant(sid, 1, confirm=confirm)
    assert asked == ["Grant 1 more spawn? Confirmation required."]
    assert one.text().splitlines()[0] == "Granted 1 more spawn (limit 10 -> 11)."
    two = client.session.grant(sid, 2, authority="auto")
    assert two.text().splitlines()[0] == "Granted 2 more spawns (limit 11 -> 13)."


def test_r_spn_6_total_grants_never_exceed_the_configured_cap(client: Client, sid: str) -> None:
    _capped_with_usage(client, sid, configured=5, used=0)
    client.session.grant(sid, 5, authority="auto")
    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, 1, authority="auto")
    assert info.value.reason == "over_allowance"
    assert info.value.message == (
        "Spawn budget grant rejected: 1 requested but only 0 of the original configured limit "
        "remains grantable."
    )
    snap = client.session.snapshot(sid)
    assert snap.granted == 5 and snap.limit == 10


def test_r_spn_6_no_grant_takes_the_limit_past_the_stored_domain(client: Client, sid: str) -> None:
    """A grant within the allowance but past 2**31-1 would store a limit (and then a usage)
    the owner itself reads back as a corrupt record, quarantining the session for good."""
    top = 2**31 - 1
    _capped_with_usage(client, sid, configured=top, used=0)
    assert client.session.snapshot(sid).grant_remaining == 0
    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, 1, authority="auto")
    assert info.value.reason == "over_allowance"
    client.session.reserve(sid, top)
    with pytest.raises(SpawnBudgetExceeded):
        client.session.reserve(sid, 1)
    snap = client.session.snapshot(sid)
    assert (snap.used, snap.limit, snap.granted) == (top, top, 0)
    assert not [q for a in client.status().actors for q in a.quarantined if sid in q.key]


def test_r_spn_6_history_keeps_only_the_last_20_entries(client: Client, sid: str) -> None:
    _capped_with_usage(client, sid, configured=100, used=0)
    for _ in range(GRANT_HISTORY_MAX + 5):
        client.session.grant(sid, 1, authority="auto")
    history = client.session.snapshot(sid).history
    assert len(history) == GRANT_HISTORY_MAX
    assert [h.previous_limit for h in history] == list(range(105, 125))
    assert history[-1].limit == 125


REFUSALS: list[tuple[str, dict[str, object], str]] = [
    (
        "not_root",
        {"additional": 2, "depth": 1},
        "Action 'grant-spawn-budget' is available only from the root interactive parent session.",
    ),
    ("not_positive", {"additional": 0}, "the additional budget must be a positive integer"),
    ("not_positive", {"additional": -1}, "(got -1)"),
    (
        "over_allowance",
        {"additional": 7},
        "Spawn budget grant rejected: 7 requested but only 6 of the original configured limit "
        "remains grantable.",
    ),
    ("forbidden", {"additional": 2, "authority": "forbid"}, "policy is 'forbid'"),
]


@pytest.mark.parametrize(("reason", "args", "text"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_r_spn_6_each_refusal_is_typed_with_its_reason_and_changes_nothing(
    client: Client, sid: str, reason: str, args: dict[str, object], text: str
) -> None:
    _capped_with_usage(client, sid, configured=10, used=4)
    client.session.grant(sid, 4, authority="auto")
    before = _state(client, sid)
    kwargs = {"authority": "auto", **args}
    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, **kwargs)  # type: ignore[arg-type]
    assert info.value.reason == reason
    assert text in info.value.message
    assert _state(client, sid) == before


def test_r_spn_6_grant_on_a_never_opened_session_is_refused(client: Client, sid: str) -> None:
    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, 1, authority="auto")
    assert info.value.reason == "unknown_session"
    assert not client.session.snapshot(sid).opened


def test_r_spn_6_grant_without_a_configured_cap_is_refused(client: Client, sid: str) -> None:
    client.session.open(sid, None)
    before = _state(client, sid)
    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, 3, authority="auto")
    assert info.value.reason == "no_cap"
    assert info.value.message == (
        "The current session has no configured spawn cap, so it does not need a budget grant."
    )
    assert _state(client, sid) == before


@pytest.mark.parametrize("state", ["queued", "running"])
def test_r_spn_6_grant_is_refused_while_a_child_is_queued_or_running(
    client: Client, sid: str, state: str
) -> None:
    _capped_with_usage(client, sid)
    assert client.session.track_run(sid, "run-1", state) == 1  # type: ignore[arg-type]
    before = _state(client, sid)
    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, 2, authority="auto")
    assert info.value.reason == "children_active"
    assert info.value.message.startswith(
        "Spawn budget grants are rejected while current-session children are queued or running."
    )
    assert info.value.details["active"] == 1
    assert _state(client, sid) == before


def test_r_spn_6_the_root_rule_is_checked_before_the_others(client: Client, sid: str) -> None:
    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, -5, depth=2, authority="forbid")
    assert info.value.reason == "not_root"


@pytest.mark.parametrize("additional", [1.5, "2", None, True])
def test_r_spn_6_non_integer_additional_is_a_schema_error(
    client: Client, sid: str, additional: object
) -> None:
    _capped_with_usage(client, sid)
    before = _state(client, sid)
    with pytest.raises(BadRequest):
        client.session.grant(sid, additional, authority="auto")  # type: ignore[arg-type]
    assert _state(client, sid) == before


def test_r_spn_6_paused_and_finished_runs_do_not_block_grants(client: Client, sid: str) -> None:
    _capped_with_usage(client, sid)
    assert client.session.track_run(sid, "a", "running") == 1
    assert client.session.track_run(sid, "b", "queued") == 2
    assert client.session.track_run(sid, "a", "paused") == 1
    assert client.session.track_run(sid, "b", "complete") == 0
    status = client.session.status(sid)
    assert [(r.run_id, r.state) for r in status.runs] == [("a", "paused")]
    assert client.session.grant(sid, 1, authority="auto").applied
    for terminal in ("failed", "stopped", "rejected"):
        client.session.track_run(sid, "a", "running")
        assert client.session.track_run(sid, "a", terminal) == 0
    assert client.session.status(sid).runs == []


def test_r_spn_6_a_replayed_track_run_changes_nothing(client: Client, sid: str) -> None:
    """The run supervisor's outbox resends a track_run whose answer it did not see."""
    _capped_with_usage(client, sid)
    assert client.session.track_run(sid, "a", "running") == 1
    before = client.session.status(sid)
    assert client.session.track_run(sid, "a", "running") == 1
    assert client.session.status(sid) == before  # updated_at too: the state did not change
    assert client.session.track_run(sid, "a", "complete") == 0
    after = client.session.status(sid)
    assert client.session.track_run(sid, "a", "complete") == 0
    assert client.session.status(sid) == after


def test_r_spn_6_confirm_authority_previews_without_changing_anything(
    client: Client, sid: str
) -> None:
    _capped_with_usage(client, sid)
    before = _state(client, sid)
    preview = client.session.grant(sid, 2)
    assert not preview.applied and preview.outcome == "confirmation_required"
    assert (preview.basis.used, preview.basis.granted) == (4, 0)
    assert _state(client, sid) == before
    applied = client.session.grant(sid, 2, yes=True, expected=preview.basis)
    assert applied.applied and applied.snapshot.limit == 12


def test_r_spn_6_a_confirmed_grant_is_applied_and_a_declined_one_adds_nothing(
    client: Client, sid: str
) -> None:
    _capped_with_usage(client, sid)
    seen: list[GrantResult] = []

    def decline(preview: GrantResult) -> bool:
        seen.append(preview)
        return False

    before = _state(client, sid)
    cancelled = client.session.grant(sid, 3, confirm=decline)
    assert cancelled.outcome == "cancelled" and not cancelled.applied
    assert seen and seen[0].snapshot.limit == 10
    assert _state(client, sid) == before
    granted = client.session.grant(sid, 3, confirm=lambda preview: True)
    assert granted.applied and granted.snapshot.limit == 13


def test_r_spn_6_a_grant_is_not_applied_when_usage_changed_after_confirmation(
    client: Client, sid: str
) -> None:
    _capped_with_usage(client, sid)

    def confirm_while_a_launch_reserves(preview: GrantResult) -> bool:
        client.session.reserve(sid, 1)
        return True

    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, 2, confirm=confirm_while_a_launch_reserves)
    assert info.value.reason == "changed"
    snap = client.session.snapshot(sid)
    assert snap.granted == 0 and snap.used == 5


def test_r_spn_6_a_grant_is_not_applied_when_a_child_started_after_confirmation(
    client: Client, sid: str
) -> None:
    _capped_with_usage(client, sid)

    def confirm_while_a_child_starts(preview: GrantResult) -> bool:
        client.session.track_run(sid, "late", "queued")
        return True

    with pytest.raises(GrantRejected) as info:
        client.session.grant(sid, 2, confirm=confirm_while_a_child_starts)
    assert info.value.reason == "children_active"
    assert client.session.snapshot(sid).granted == 0


def test_r_spn_6_yes_applies_a_grant_under_confirm_authority(client: Client, sid: str) -> None:
    _capped_with_usage(client, sid)
    assert client.session.grant(sid, 1, yes=True).applied


def test_r_spn_6_a_node_configured_to_forbid_grants_refuses_every_grant(sid: str) -> None:
    state = str(short_dir())
    try:
        with Node.embedded(state_dir=state, settings={"grant_authority": "forbid"}) as node:
            own = node.client()
            _capped_with_usage(own, sid)
            for authority in ("auto", "confirm"):
                with pytest.raises(GrantRejected) as info:
                    own.session.grant(sid, 1, authority=authority, yes=True)  # type: ignore[arg-type]
                assert info.value.reason == "forbidden"
            assert own.session.snapshot(sid).granted == 0
    finally:
        shutil.rmtree(state, ignore_errors=True)


# -- INV-SPN-1 under concurrency (real sockets) ----------------------------------------------------


def test_inv_spn_1_concurrent_reserves_never_push_used_above_limit(
    session_node: Node, sid: str
) -> None:
    limit, threads, per_thread = 50, 8, 10
    session_node.client().session.open(sid, limit)
    accepted: list[int] = []
    refused: list[int] = []
    lock = threading.Lock()

    def launcher() -> None:
        with connect(session_node.address) as own:
            for _ in range(per_thread):
                try:
                    own.session.reserve(sid, 1)
                    outcome = accepted
                except SpawnBudgetExceeded:
                    outcome = refused
                with lock:
                    outcome.append(1)

    workers = [threading.Thread(target=launcher) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert len(accepted) == limit and len(refused) == threads * per_thread - limit
    assert session_node.client().session.snapshot(sid).used == limit


# -- durability: a real node process -------------------------------------------------------------


def test_r_spn_acknowledged_budget_survives_kill_9_of_a_real_node_process(
    start_node: Callable[..., NodeProcess],
) -> None:
    first = start_node()
    remote = first.client()
    remote.session.open("durable", 6)
    remote.session.reserve("durable", 4)
    remote.session.grant("durable", 2, yes=True)
    remote.session.track_run("durable", "r1", "running")
    with pytest.raises(SpawnBudgetExceeded) as info:
        remote.session.reserve("durable", 5)
    assert (info.value.used, info.value.limit, info.value.remaining) == (4, 8, 4)
    before = remote.session.status("durable")
    first.kill()
    second = start_node(state_dir=first.state_dir)
    after = second.client().session.status("durable")
    assert after.snapshot == before.snapshot
    assert after.runs == before.runs
    with pytest.raises(GrantRejected) as refused:
        second.client().session.grant("durable", 1, authority="auto")
    assert refused.value.reason == "children_active"
