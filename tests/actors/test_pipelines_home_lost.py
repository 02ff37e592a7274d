"""What an owner's pipeline sends again (actors/pipelines.py `unanswered`).

A request lost with a worker's home (`home_unreachable_in_flight`: the home became unreachable
with it in flight, outcome unknown) was briefly sent again at once, as one whose owner
restarted is: while the home is unreachable the resend is refused "was not sent (nothing was
applied)", and that refusal became the answer, e.g. a launch's on a worker whose capacity
acquire was in flight when the home was killed, although the first acquire may have taken a
slot on the home. It is not sent again: its caller gets the outcome-unknown answer itself.
"""

from __future__ import annotations

from subagents_node.actors.pipelines import unanswered
from subagents_node.messages.errors import OwnerUnavailable


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
