"""What waits in an owner's inbox: a request with its reply (`Job`), a timer or an answer
(`Tick`), the loop that holds them (`Mailbox`), and the mark of a reply sent later (`DEFERRED`).

Owns these shapes only; the rules for handling them are actors/owner.py's. It must never hold
state or import an owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from subagents_node.actors.outcomes import ReplyFn
from subagents_node.actors.records import Record
from subagents_node.messages.base import Request


@dataclass(frozen=True, slots=True)
class Job:
    """A validated request and where its outcome goes (a socket reply or an in-process future)."""

    request: Request
    reply: ReplyFn


class Tick(Record):
    """A timer callback or an answer delivered through the inbox, so it runs serialized with
    requests.

    Each owner subclasses it (a frozen record: actors/records.py) next to the code that handles
    it, one class per thing that happened, and its `on_tick` matches on the class, so mypy
    checks every field a handler reads.
    """

    __slots__ = ()


class Mailbox(Protocol):
    """Where an owner's messages wait when it is hosted by a loop rather than a pykka thread."""

    def post(self, message: Job | Tick) -> None:
        """Queue a message; called from any thread (it wakes the loop)."""

    def empty(self) -> bool:
        """True when nothing waits: the moment an owner commits its group."""


class _Deferred:
    """Returned by a handler whose reply is sent later with `OwnerActor.reply_later`."""

    __slots__ = ()


DEFERRED: Any = _Deferred()
