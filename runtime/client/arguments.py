"""The shape of client arguments that Python would take for something else: a list that is one
thing, a callback that is a coroutine function, and a value of another type where the client
needs a path, keys or a request.

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

`state_dir`, `credentials` (of `connect` and `AsyncClient`) and the `request` and `result` of
`ask` were used as they came: `connect(state_dir=5)` was a TypeError from pathlib, credentials
given as a string an AttributeError at the first call, `ask("node.ping", Pong)` an
AttributeError from the transport. `state_dir_argument`, `credentials_argument` and
`request_argument` refuse them in one line, before a socket or a context is made.

It owns those checks only; it must never do I/O nor import the node or the actors.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from typing import TypeVar

from pydantic import BaseModel

from subagents_node.client.keys import ClientCredentials
from subagents_node.messages.base import Message, Request
from subagents_node.messages.errors import BadRequest

T = TypeVar("T")

#: Things Python would iterate as something else than a list of them (or as one of them).
_SINGLE = (str, bytes, os.PathLike, BaseModel, Mapping)


def listed(value: Iterable[T], field: str, what: str) -> list[T]:
    """`value` as a list, else BadRequest(reason argument, field `field`): a single string,
    path, model or mapping (`write [value]`), or anything not iterable (None, a number)."""
    if type(value) is list:  # the common case, and none of those: no ABC's check per call
        return list(value)
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


def state_dir_argument(value: object) -> str | os.PathLike[str] | None:
    """A state dir as the caller gave it: None, a str or an os.PathLike of one; else
    BadRequest naming `state_dir`."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):
        return value
    raise BadRequest(
        f"state_dir must be a path (a str or a pathlib.Path), not {type(value).__name__}",
        reason="argument",
        field="state_dir",
    )


def credentials_argument(value: object) -> ClientCredentials | None:
    """None or a ClientCredentials, else BadRequest naming `credentials`."""
    if value is None or isinstance(value, ClientCredentials):
        return value
    raise BadRequest(
        "credentials must be a subagents_node.client.keys.ClientCredentials, not "
        f"{type(value).__name__}",
        reason="argument",
        field="credentials",
    )


def request_argument(request: object, result: object) -> None:
    """What `ask` sends and what it expects back: a request model (e.g. `Ping()`) and a
    message class (e.g. `Pong`); else BadRequest naming `request` or `result`."""
    if not isinstance(request, Request):
        raise BadRequest(
            f"ask takes a request model (e.g. subagents_node.messages.node.Ping()), not "
            f"{type(request).__name__}",
            reason="argument",
            field="request",
        )
    if not (isinstance(result, type) and issubclass(result, Message)):
        shown = result.__name__ if isinstance(result, type) else type(result).__name__
        raise BadRequest(
            f"ask takes the result's message class (e.g. Pong), not {shown}",
            reason="argument",
            field="result",
        )
