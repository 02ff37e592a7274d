"""The home's record of which worker placed which run (runtime/node/placed.py), on a real
members.db: what a worker's key may follow, and how the record stays bounded. A forgotten
worker's placements go with it (whoever joins under its name next is no heir), a worker that
only restarted keeps them, a revoked key's name loses them, a run its host answers
`run_not_found` for is dropped, and each worker keeps at most its newest `limit` rows. The
fleet tests (test_multihost_placed.py) check the same rule through real nodes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from subagents_node.actors.outcomes import Outcome
from subagents_node.client.keys import Keypair
from subagents_node.messages.base import Request
from subagents_node.messages.errors import BadRequest, StoreError
from subagents_node.messages.members import MemberForget, MemberJoin, MemberLeave
from subagents_node.messages.supervisor import AgentPlan, Launch, Show, Stop, TaskItem, Watch
from subagents_node.node.home import HomeService
from subagents_node.node.members import DB_NAME, Members
from subagents_node.node.placed import PlacedRuns


def _members(state_dir: Path) -> Members:
    return Members(state_dir, "home-node", heartbeat_s=1.0, timeout_s=3.0)


def _nothing_submitted(request: Request, target: str, reply: object) -> None:
    raise AssertionError(f"no owner is asked here ({request.type} to {target})")


def _keys(*names: str) -> dict[str, str]:
    """An allow-list: each name with a key of its own."""
    return {name: Keypair.generate().public for name in names}


def _home(state_dir: Path, allowed: dict[str, str] | None = None) -> HomeService:
    names = _keys("w1", "w2") if allowed is None else allowed
    return HomeService(
        state_dir, "home-node", 1.0, 3.0, _nothing_submitted, list, allowed=lambda: names
    )


def _join(home: HomeService, name: str, instance: str = "i1") -> None:
    answers: list[Outcome] = []
    home.serve(MemberJoin(name=name, instance=instance), name, answers.append)
    assert len(answers) == 1 and not isinstance(answers[0], Exception), answers


def _nested_launch() -> Launch:
    return Launch(
        session_id="s-placed",
        mode="single",
        background=True,
        items=[TaskItem(agent=AgentPlan(name="t", command=["true"]), task="x")],
        cwd="/",
        depth=1,
        inherited_fanout="descriptor",
    )


def _placed(home: HomeService, worker: str, host: str, run_id: str) -> None:
    """What the gateway does with a worker's launch carried to `host` and answered."""
    settle = home.settler(_nested_launch(), worker, host)
    assert settle is not None
    assert settle("reply", {"run": {"run_id": run_id}}) is None


def _may_follow(home: HomeService, worker: str, host: str, run_id: str) -> bool:
    try:
        home.admit(Show(run_id=run_id), worker, host)
    except BadRequest as err:
        assert err.details["reason"] == "not_placed_by_you"
        return False
    return True


def test_a_worker_follows_only_what_it_placed_on_that_host_by_its_full_id(
    state_dir: Path,
) -> None:
    home = _home(state_dir)
    for name in ("w1", "w2"):
        _join(home, name)
    _placed(home, "w1", "w2", "aaaaaaaaaaaa")
    run_id = "aaaaaaaaaaaa"
    for request in (Show(run_id=run_id), Watch(run_id=run_id), Stop(run_id=run_id)):
        assert home.admit(request, "w1", "w2") == request
    assert not _may_follow(home, "w2", "w2", "aaaaaaaaaaaa")  # another worker's
    assert not _may_follow(home, "w1", "home", "aaaaaaaaaaaa")  # the same id on another host
    assert not _may_follow(home, "w1", "w2", "aaaaaa")  # a prefix
    home.close()


def test_placements_survive_a_home_restart_and_a_worker_that_only_restarted_keeps_them(
    state_dir: Path,
) -> None:
    home = _home(state_dir)
    _join(home, "w1")
    _placed(home, "w1", "home", "bbbbbbbbbbbb")
    home.close()
    again = _home(state_dir)  # a new process of the home: members.db is all it has
    _join(again, "w1", instance="i2")  # the worker restarted and joined again
    assert _may_follow(again, "w1", "home", "bbbbbbbbbbbb")
    again.close()


def test_a_forgotten_worker_loses_its_placements_and_rejoining_under_its_name_inherits_none(
    state_dir: Path,
) -> None:
    members = _members(state_dir)
    members.join(MemberJoin(name="w1", instance="i1"), "w1")
    members.join(MemberJoin(name="w2", instance="i1"), "w2")
    members.placed.record("w1", "w2", "cccccccccccc")
    members.placed.record("w2", "w1", "dddddddddddd")
    # Only a worker that is gone may be forgotten: this one stopped cleanly.
    members.leave(MemberLeave(name="w1", instance="i1", generation=1), "w1")
    members.forget(MemberForget(name="w1", reason="host lost"))
    assert not members.placed.placed_by("w1", "w2", "cccccccccccc")
    assert members.placed.placed_by("w2", "w1", "dddddddddddd")  # others keep theirs
    members.join(MemberJoin(name="w1", instance="new-machine"), "w1")
    assert members.placed.count("w1") == 0
    members.close()


def test_a_revoked_keys_name_loses_its_placements_when_the_home_tells_its_owners(
    state_dir: Path,
) -> None:
    allowed = _keys("w1", "w2")
    home = _home(state_dir, allowed)
    for name in ("w1", "w2"):
        _join(home, name)
    _placed(home, "w1", "w2", "eeeeeeeeeeee")
    _placed(home, "w2", "w1", "ffffffffffff")
    del allowed["w1"]  # `keys revoke w1`, after which the node tells its owners
    home.tell_owners()
    assert not _may_follow(home, "w1", "w2", "eeeeeeeeeeee")
    assert _may_follow(home, "w2", "w1", "ffffffffffff")
    home.close()


def test_a_run_its_host_no_longer_has_is_dropped_from_the_record(state_dir: Path) -> None:
    home = _home(state_dir)
    _join(home, "w1")
    _placed(home, "w1", "w2", "gggggggggggg")
    settle = home.settler(Show(run_id="gggggggggggg"), "w1", "w2")
    assert settle is not None
    assert settle("error", {"code": "unavailable", "message": "", "details": {}}) is None
    assert _may_follow(home, "w1", "w2", "gggggggggggg")  # a host not answering: kept
    assert settle("error", {"code": "run_not_found", "message": "", "details": {}}) is None
    assert not _may_follow(home, "w1", "w2", "gggggggggggg")
    home.close()


def test_each_worker_keeps_at_most_its_newest_placements(state_dir: Path) -> None:
    members = _members(state_dir)
    placed = PlacedRuns(sqlite3.connect(state_dir / DB_NAME, isolation_level=None), limit=3)
    placed.record("w2", "home", "other")
    for n in range(5):
        placed.record("w1", "w2", f"run{n}")
    assert placed.count("w1") == 3
    assert [placed.placed_by("w1", "w2", f"run{n}") for n in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert placed.placed_by("w2", "home", "other")  # another worker's rows are not its cap
    members.close()


def test_a_launch_whose_run_cannot_be_recorded_is_answered_with_a_store_error_naming_it(
    state_dir: Path,
) -> None:
    """The worker is not told of a run it could never follow; the home's log and the error
    name the run, for the operator to stop."""
    home = _home(state_dir)
    _join(home, "w1")
    blocker = sqlite3.connect(state_dir / DB_NAME, isolation_level=None, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds members.db: the insert fails
    try:
        settle = home.settler(_nested_launch(), "w1", "w2")
        assert settle is not None
        refused = settle("reply", {"run": {"run_id": "hhhhhhhhhhhh"}})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert isinstance(refused, StoreError)
    assert refused.details["run_id"] == "hhhhhhhhhhhh" and "hhhhhhhhhhhh" in refused.message
    assert not _may_follow(home, "w1", "w2", "hhhhhhhhhhhh")
    home.close()


@pytest.mark.parametrize("principal", ["w1", "operator"])
def test_only_a_members_launch_is_recorded(state_dir: Path, principal: str) -> None:
    """An allowed key that is no member (an operator's remote client) is the operator: its
    requests are not the worker rule's, and nothing is recorded for it."""
    home = _home(state_dir, _keys("w1", "operator"))
    _join(home, "w1")
    settle = home.settler(_nested_launch(), principal, "w2")
    assert (settle is not None) == (principal == "w1")
    home.close()
