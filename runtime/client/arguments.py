"""The shape of client arguments that Python would take for something else: a list that is one
thing, and a callback that is a coroutine function.

Python iterates a string character by character, a pydantic model field by field and a dict
key by key, so `claim(budget, "tasks[0]")` used to claim eight paths, `settle(run_id)` to wait
for one run per character (each a prefix that may match another run) and
`snapshots(descriptor)` to read its fields; None or a number failed deep inside with a
TypeError. `listed` turns such an argument into a list, or refuses it with a one-line
BadRequest naming the argument, before anything is sent or built.

A callback the client calls (`on_event`, `on_gap`, `on_end`, a grant's `confirm`) is called,
never awaited, by the asyncio client too: an `async def` one returned a coroutine nobody ran,
so a wait's events were lost, and a grant's `confirm` answered with a coroutine, which is true:
the grant was applied without asking anyone (R-SPN-6). `plain_callback` refuses one up front,
`decision` refuses any answer of a `confirm` but True or False.

It owns that check only; it must never do I/O nor import the node or the actors.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from typing import TypeVar

from pydantic import BaseModel

from subagents_node.messages.errors import BadRequest

T = TypeVar("T")

#: Things Python would iterate as something else than a list of them (or as one of them).
_SINGLE = (str, bytes, os.PathLike, BaseModel, Mapping)


def listed(value: Iterable[T], field: str, what: str) -> list[T]:
    """`value` as a list, else BadRequest(reason argument, field `field`): a single string,
    path, model or mapping (`write [value]`), or anything not iterable (None, a number)."""
    if isinstance(value, _SINGLE):
        shown = repr(value)
        hint = f": write [{shown}]" if len(shown) <= 80 else ""
        raise BadRequest(
            f"{field} must be a list of {what}, not a single {type(value).__name__}{hint}",
            reason="argument",
            field=field,
        )
    if not isinstance(value, Iterable):
        raise BadRequest(
            f"{field} must be a list of {what}, not {type(value).__name__}",
            reason="argument",
            field=field,
        )
    return list(value)


def plain_callback(callback: object, field: str) -> None:
    """None or a plain callable, else BadRequest naming `field`: an `async def` function would
    be called and its coroutine never awaited."""
    if callback is None:
        return
    if not callable(callback) or inspect.iscoroutinefunction(callback):
        kind = "an async function" if callable(callback) else type(callback).__name__
        raise BadRequest(
            f"{field} must be a plain function (called, never awaited, by both clients), "
            f"not {kind}",
            reason="argument",
            field=field,
        )


def decision(answer: object, field: str) -> bool:
    """A callback's yes or no: True or False only (a coroutine, a string such as "n" or None is
    no answer), else BadRequest naming `field`."""
    if isinstance(answer, bool):
        return answer
    if inspect.iscoroutine(answer):
        answer.close()  # never awaited: no warning about it, nothing run
    raise BadRequest(
        f"{field} must return True or False, not {type(answer).__name__}; nothing was applied",
        reason="argument",
        field=field,
    )
