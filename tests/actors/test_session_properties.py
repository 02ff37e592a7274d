"""INV-SPN-1 as a hypothesis state machine against a reference model of R-SPN-1..6.

Random interleavings of open, preflight, reserve, grant (every authority, depth, sign) and run
state changes on one session; after every step the owner's snapshot must equal the model's,
`used` never exceeds `limit`, total grants never exceed the configured cap, and the history
holds at most 20 entries.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from subagents_node import Client, Node
from subagents_node.messages.errors import GrantRejected, SpawnBudgetExceeded
from subagents_node.messages.session import GRANT_HISTORY_MAX, RunState
from tests.support.nodes import short_dir

RUNS = ("r0", "r1", "r2")
STATES: tuple[RunState, ...] = (
    "queued",
    "running",
    "paused",
    "complete",
    "failed",
    "stopped",
    "rejected",
)


class SpawnBudgetModel:
    """The spec's rules, written independently of the actor."""

    def __init__(self, configured: int | None) -> None:
        self.configured = configured
        self.used = 0
        self.granted = 0
        self.grants = 0
        self.runs: dict[str, str] = {}

    @property
    def limit(self) -> int | None:
        return None if self.configured is None else self.configured + self.granted

    def fits(self, requested: int) -> bool:
        limit = self.limit
        return requested <= 0 or limit is None or requested <= limit - self.used

    def active(self) -> int:
        return sum(1 for state in self.runs.values() if state in ("queued", "running"))

    def grant_refusal(self, additional: int, depth: int, authority: str) -> str | None:
        if depth != 0:
            return "not_root"
        if self.active():
            return "children_active"
        if additional <= 0:
            return "not_positive"
        if self.configured is None:
            return "no_cap"
        if additional > self.configured - self.granted:
            return "over_allowance"
        if authority == "forbid":
            return "forbidden"
        return None


class SessionBudgetMachine(RuleBasedStateMachine):
    client: Client

    def __init__(self) -> None:
        super().__init__()
        self.sid = f"p-{uuid.uuid4().hex}"
        self.model = SpawnBudgetModel(None)

    @initialize(configured=st.none() | st.integers(min_value=0, max_value=40))
    def open_session(self, configured: int | None) -> None:
        result = self.client.session.open(self.sid, configured)
        assert result.created
        self.model = SpawnBudgetModel(configured or None)

    @rule(configured=st.none() | st.integers(min_value=0, max_value=40))
    def reopen_keeps_the_first_limit(self, configured: int | None) -> None:
        result = self.client.session.open(self.sid, configured)
        assert not result.created
        assert result.limit_differs == ((configured or None) != self.model.configured)

    @rule(requested=st.integers(min_value=0, max_value=15))
    def preflight(self, requested: int) -> None:
        if self.model.fits(requested):
            self.client.session.preflight(self.sid, requested)
        else:
            with pytest.raises(SpawnBudgetExceeded):
                self.client.session.preflight(self.sid, requested)

    @rule(requested=st.integers(min_value=0, max_value=15))
    def reserve(self, requested: int) -> None:
        if not self.model.fits(requested):
            with pytest.raises(SpawnBudgetExceeded) as info:
                self.client.session.reserve(self.sid, requested)
            assert info.value.used + info.value.remaining == info.value.limit
            return
        result = self.client.session.reserve(self.sid, requested)
        counted = 0 if self.model.configured is None else requested
        assert result.counted == counted
        self.model.used += counted

    @rule(
        additional=st.integers(min_value=-3, max_value=12),
        depth=st.sampled_from([0, 0, 0, 1]),
        authority=st.sampled_from(["auto", "confirm", "forbid"]),
    )
    def grant(self, additional: int, depth: int, authority: str) -> None:
        refusal = self.model.grant_refusal(additional, depth, authority)
        if refusal is not None:
            with pytest.raises(GrantRejected) as info:
                self.client.session.grant(
                    self.sid,
                    additional,
                    depth=depth,
                    authority=authority,  # type: ignore[arg-type]
                    yes=True,
                )
            assert info.value.reason == refusal
            return
        result = self.client.session.grant(
            self.sid,
            additional,
            depth=depth,
            authority=authority,  # type: ignore[arg-type]
            confirm=lambda preview: True,
        )
        assert result.applied
        self.model.granted += additional
        self.model.grants += 1

    @rule(run=st.sampled_from(RUNS), state=st.sampled_from(STATES))
    def track_run(self, run: str, state: RunState) -> None:
        if state in ("complete", "failed", "stopped", "rejected"):
            self.model.runs.pop(run, None)
        else:
            self.model.runs[run] = state
        assert self.client.session.track_run(self.sid, run, state) == self.model.active()

    @invariant()
    def snapshot_matches_the_model_and_inv_spn_1_holds(self) -> None:
        snap = self.client.session.snapshot(self.sid)
        model = self.model
        assert (snap.used, snap.limit, snap.configured) == (
            model.used,
            model.limit,
            model.configured,
        )
        assert snap.granted == model.granted
        if snap.limit is not None:
            assert snap.configured is not None
            assert snap.used <= snap.limit
            assert snap.granted <= snap.configured
            assert snap.remaining == snap.limit - snap.used
        assert len(snap.history) == min(model.grants, GRANT_HISTORY_MAX)
        assert sum(entry.amount for entry in snap.history) <= snap.granted
        for before, after in zip(snap.history, snap.history[1:], strict=False):
            assert after.previous_limit == before.limit


@pytest.fixture(scope="module")
def property_client() -> Iterator[Client]:
    state = str(short_dir())
    try:
        with Node.embedded(state_dir=state) as node:
            yield node.client()
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_inv_spn_1_random_interleavings_keep_the_budget_invariants(
    property_client: Client,
) -> None:
    SessionBudgetMachine.client = property_client
    run_state_machine_as_test(
        SessionBudgetMachine,
        settings=settings(
            max_examples=120,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
