"""The run supervisor's internal messages: what it tells itself, and what its calls are for.

Owns two families of small frozen types: the keys that name a call to another owner (the answer
comes back as an `Answer` with that key, and `match` on the key routes it: no string parsing),
and the ticks delivered through the supervisor's inbox (answers, child events, timers), so they
run serialized with requests. It must never hold state or behaviour: types only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from subagents_node.actors.owner import Outcome, Tick

# -- call keys: what the answer to a call to another owner is for ----------------------------


@dataclass(frozen=True, slots=True)
class LaunchKey:
    """The admission pipeline of run `run_id` (a launch, resume or rerun)."""

    run_id: str


@dataclass(frozen=True, slots=True)
class AppendKey:
    """An append pipeline on run `run_id`; `token` tells concurrent appends apart."""

    run_id: str
    token: str


@dataclass(frozen=True, slots=True)
class Settle:
    """The budget read of a run that is ending; its answer settles the run."""

    run_id: str


@dataclass(frozen=True, slots=True)
class Outbound:
    """Row `seq` of the outbox, sent to owner `target` (runs/outbox.py): a report that must not
    be lost, resent until its owner answers."""

    target: str
    seq: int


@dataclass(frozen=True, slots=True)
class Expand:
    """The one batch claim of dynamic step `group` of run `run_id` (R-FAN-21)."""

    run_id: str
    group: int


CallKey: TypeAlias = LaunchKey | AppendKey | Settle | Outbound | Expand


# -- ticks ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer(Tick):
    """Another owner answered the call named by `key` (what the pipelines deliver)."""

    key: CallKey
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class ShimGone(Tick):
    """The shim of `child_id` exited (seen by the one thread that watches every shim)."""

    child_id: str


@dataclass(frozen=True, slots=True)
class KillEscaped(Tick):
    """A stop's grace is over for the processes a dead shim of `child_id` left: SIGKILL."""

    child_id: str


@dataclass(frozen=True, slots=True)
class ShimNotLaunched(Tick):
    """No shim could be forked for `child_id` (told after the commit that ordered it)."""

    child_id: str
    error: str


@dataclass(frozen=True, slots=True)
class Advance(Tick):
    """Run `run_id` may have children to start or be done: steps were appended, or a child
    could not start. Told after the commit that records the change, so the run moves on from
    durable state."""

    run_id: str


@dataclass(frozen=True, slots=True)
class RunDeadline(Tick):
    """Run `run_id`'s own deadline passed."""

    run_id: str


@dataclass(frozen=True, slots=True)
class Superseded(Tick):
    """Run `run_id` was superseded by a rerun (R-MISC-2): told after the commit that links
    them, so the source's children are stopped only once the link is durable."""

    run_id: str


@dataclass(frozen=True, slots=True)
class OutboxRetry(Tick):
    """The outbox's retry delay for owner `target` passed: send its oldest row again."""

    target: str
