"""The shape of a client argument that takes many things: a list, never one thing.

Python iterates a string character by character, a pydantic model field by field and a dict
key by key, so `claim(budget, "tasks[0]")` used to claim eight paths, `settle(run_id)` to wait
for one run per character (each a prefix that may match another run) and
`snapshots(descriptor)` to read its fields; None or a number failed deep inside with a
TypeError. `listed` turns such an argument into a list, or refuses it with a one-line
BadRequest naming the argument, before anything is sent or built.

It owns that check only; it must never do I/O nor import the node or the actors.
"""

from __future__ import annotations

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
