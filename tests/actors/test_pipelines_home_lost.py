"""What an owner's pipeline sends again (actors/pipelines.py `unanswered`).

A request lost with a worker's home (`home_unreachable_in_flight`: the home became unreachable
with it in flight, outcome unknown) was briefly sent again at once, as one whose owner
restarted is: while the home is unreachable the resend is refused "was not sent (nothing was
applied)", and that refusal became the answer, e.g. a launch's on a worker whose capacity
acquire was in flight when the home was killed, although the first acquire may have taken a
slot on the home. It is not sent again: its caller gets the outcome-unknown answer itself.
"""

from __future__ import annotations

from subagents_node.actors.pipelines import lost_then_refused, unanswered
from subagents_node.messages.capacity import Acquire, Snapshot
from subagents_node.messages.errors import (
    Busy,
    CapacityExhausted,
    MembershipRefused,
    OwnerUnavailable,
)


def test_a_request_lost_with_the_home_is_not_sent_again_but_one_lost_with_its_owner_is() -> None:
    lost_with_home = OwnerUnavailable(
        "capacity ... its outcome is unknown",
        owner="capacity",
        state="unknown",
        reason="home_unreachable_in_flight",
        outcome="unknown",
    )
    not_sent = OwnerUnavailable(
        "not sent", owner="capacity", state="unreachable", reason="home_unreachable"
    )
    owner_restarted = OwnerUnavailable(
        "capacity restarted", owner="capacity", state="unknown", reason="timeout"
    )
    assert not unanswered(lost_with_home)
    assert not unanswered(not_sent)
    assert unanswered(owner_restarted)


def test_a_resend_refused_without_a_verdict_leaves_the_first_sends_outcome_unknown() -> None:
    """A request sent again after it went unanswered, and then refused "not sent" (a worker's
    home unreachable by then): the first send may still be applied, so its caller hears that
    the outcome is unknown, not that nothing was applied (tests/node/
    test_multihost_lost_acquire.py shows the slot such an acquire took). An owner's own verdict
    on the resend (a capacity refusal) stands as it is."""
    acquire = Acquire(session_id="s", limit=1, run_id="r", acquire_id="a1")
    not_sent = OwnerUnavailable(
        "not sent", owner="capacity", state="unreachable", reason="home_unreachable"
    )
    unknown = lost_then_refused(acquire, not_sent)
    assert isinstance(unknown, OwnerUnavailable)
    assert unknown.details["outcome"] == "unknown"
    assert "not sent" in unknown.message and "outcome is unknown" in unknown.message
    for refusal in (Busy("full", target="capacity"), MembershipRefused("fenced", name="w1")):
        assert lost_then_refused(acquire, refusal).details["outcome"] == "unknown"
    verdict = CapacityExhausted.of(1, 1)
    assert lost_then_refused(acquire, verdict) is verdict
    # A read changes nothing: its refusal stands as it is.
    assert lost_then_refused(Snapshot(session_id="s"), not_sent) is not_sent
