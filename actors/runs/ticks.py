"""The run supervisor's internal messages: what it tells itself, and what its calls are for.

Owns two families of small frozen types (records: actors/records.py): the keys that name a call
to another owner (the answer comes back as an `Answer` with that key, and `match` on the key
routes it: no string parsing), and the ticks delivered through the supervisor's inbox (answers,
child events, timers), so they run serialized with requests. It must never hold state or
behaviour: types only.
"""

from __future__ import annotations

from typing import TypeAlias

from subagents_node.actors.inbox import Tick
from subagents_node.actors.owner import Outcome
from subagents_node.actors.records import Record, init_fields
from subagents_node.messages.errors import SubagentsError

# -- call keys: what the answer to a call to another owner is for ----------------------------


class LaunchKey(Record):
    """The admission pipeline of run `run_id` (a launch, resume or rerun)."""

    __slots__ = ("run_id",)
    run_id: str

    def __init__(self, run_id: str) -> None:
        init_fields(self, run_id=run_id)


class AppendKey(Record):
    """An append pipeline on run `run_id`; `token` tells concurrent appends apart."""

    __slots__ = ("run_id", "token")
    run_id: str
    token: str

    def __init__(self, run_id: str, token: str) -> None:
        init_fields(self, run_id=run_id, token=token)


class Settle(Record):
    """The budget read of a run that is ending; its answer settles the run."""

    __slots__ = ("run_id",)
    run_id: str

    def __init__(self, run_id: str) -> None:
        init_fields(self, run_id=run_id)


class Outbound(Record):
    """Row `seq` of the outbox, sent to owner `target` (runs/outbox.py): a report that must not
    be lost, resent until its owner answers."""

    __slots__ = ("seq", "target")
    target: str
    seq: int

    def __init__(self, target: str, seq: int) -> None:
        init_fields(self, target=target, seq=seq)


class Expand(Record):
    """The one batch claim of dynamic step `group` of run `run_id` (R-FAN-21)."""

    __slots__ = ("group", "run_id")
    run_id: str
    group: int

    def __init__(self, run_id: str, group: int) -> None:
        init_fields(self, run_id=run_id, group=group)


CallKey: TypeAlias = LaunchKey | AppendKey | Settle | Outbound | Expand


# -- ticks ------------------------------------------------------------------------------------


class Answer(Tick):
    """Another owner answered the call named by `key` (what the pipelines deliver)."""

    __slots__ = ("key", "outcome")
    key: CallKey
    outcome: Outcome

    def __init__(self, key: CallKey, outcome: Outcome) -> None:
        init_fields(self, key=key, outcome=outcome)


class ShimGone(Tick):
    """The shim of `child_id` exited (seen by the one thread that watches every shim)."""

    __slots__ = ("child_id",)
    child_id: str

    def __init__(self, child_id: str) -> None:
        init_fields(self, child_id=child_id)


class KillEscaped(Tick):
    """`why` "grace": a stop's grace is over for the processes a dead shim of `child_id` left:
    SIGKILL; "deadline": the child's deadline came, which its dead shim kept: stop them as
    timed out; "overdue": a stop's grace (and a margin) is over and its live shim has not
    ended the tree (a child froze it, SIGSTOP): SIGKILL the shim, its death ends the rest;
    "stopped": the tree of a shim with no template parent ended and the shim has not
    reported: SIGCONT it if it is stopped (strays.py)."""

    __slots__ = ("child_id", "why")
    child_id: str
    why: str

    def __init__(self, child_id: str, why: str = "grace") -> None:
        init_fields(self, child_id=child_id, why=why)


class ShimNotLaunched(Tick):
    """No shim could be forked for `child_id` (told after the commit that ordered it)."""

    __slots__ = ("child_id", "error")
    child_id: str
    error: str

    def __init__(self, child_id: str, error: str) -> None:
        init_fields(self, child_id=child_id, error=error)


class Advance(Tick):
    """Run `run_id` may have children to start or be done: steps were appended, or a child
    could not start. Told after the commit that records the change, so the run moves on from
    durable state."""

    __slots__ = ("run_id",)
    run_id: str

    def __init__(self, run_id: str) -> None:
        init_fields(self, run_id=run_id)


class RunDeadline(Tick):
    """Run `run_id`'s own deadline passed."""

    __slots__ = ("run_id",)
    run_id: str

    def __init__(self, run_id: str) -> None:
        init_fields(self, run_id=run_id)


class Superseded(Tick):
    """Run `run_id` was superseded by a rerun (R-MISC-2): told after the commit that links
    them, so the source's children are stopped only once the link is durable."""

    __slots__ = ("run_id",)
    run_id: str

    def __init__(self, run_id: str) -> None:
        init_fields(self, run_id=run_id)


class OutboxRetry(Tick):
    """The outbox's retry delay for owner `target` passed: send its oldest row again."""

    __slots__ = ("target",)
    target: str

    def __init__(self, target: str) -> None:
        init_fields(self, target=target)


class StopReleasedAgain(Tick):
    """A full disk undid a forgotten worker's stop (`runs.stop_released`, with `reason`): the
    supervisor does it again itself, since its node asks it again only when the supervisor
    becomes ready (a restart), and a full disk is none. Only the latest (`serial`) acts: one
    the owner runs again after its own full-disk failure is stale by then."""

    __slots__ = ("reason", "serial")
    reason: str
    serial: int

    def __init__(self, reason: str, serial: int) -> None:
        init_fields(self, reason=reason, serial=serial)


class TakeUp(Tick):
    """A full disk undid a group (OwnerActor.group_undone): the launches in `keys` waited for
    an after-commit send that was dropped, and the runs in `run_ids` had their settlement
    undone. Each is taken up again from what the store holds."""

    __slots__ = ("error", "keys", "run_ids")
    keys: tuple[CallKey, ...]
    run_ids: tuple[str, ...]
    error: SubagentsError

    def __init__(
        self, keys: tuple[CallKey, ...], run_ids: tuple[str, ...], error: SubagentsError
    ) -> None:
        init_fields(self, keys=keys, run_ids=run_ids, error=error)
