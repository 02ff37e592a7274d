"""Plans: each client operation written once, carried out by the sync or the asyncio client.

An operation of the client API (a claim, a confirmed grant, a wait that follows a run's events)
is a generator that yields the requests it needs, one `Ask` at a time, receives each typed
result (or has the typed error raised at its `yield`), and returns what the caller gets. The
same plan is performed by `Client.perform` (blocking) and `AsyncClient.perform` (awaiting), so
the two APIs share one definition of every request, its validation and its interpretation.

This module owns that protocol only; it must never do I/O itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, Generic, NamedTuple, NoReturn, TypeAlias, TypeVar

from subagents_node.messages.base import Message, Request, validate_request

R = TypeVar("R", bound=Message)
T = TypeVar("T")
Q = TypeVar("Q", bound=Request)


class Ask(NamedTuple, Generic[R]):
    """One request of a plan, the result type it must answer with, and its own timeout
    (None: the client's). A named tuple: one is made per request, at half the cost of a
    frozen dataclass."""

    request: Request
    result: type[R]
    timeout: float | None = None


#: A plan yields Asks, is sent each result, and returns the operation's value.
Plan: TypeAlias = Generator[Ask[Any], Any, T]


def build(request_class: type[Q], /, **fields: Any) -> Q:
    """Validate a request the way the gateway does, so a bad argument is a typed BadRequest
    before anything is sent."""
    request = validate_request(request_class, fields)
    assert isinstance(request, request_class)
    return request


class One(Generator[Ask[Any], Any, R]):
    """The plan of a single request (`one`): it yields its Ask and returns the answer it is
    sent. Not a generator function's generator: a client sees one by its type and sends its
    request straight away (`Client.perform`), which is most of what its API does, with none
    of a generator's frames; `yield from` and `perform` drive it as they drive any plan."""

    __slots__ = ("_step", "ask")

    def __init__(self, request: Request, result: type[R], timeout: float | None = None) -> None:
        self.ask: Ask[R] = Ask(request, result, timeout)
        self._step = 0  # 0: not started, 1: asked, 2: done

    def send(self, value: Any) -> Ask[Any]:
        step, self._step = self._step, 2
        if step == 0:
            if value is not None:
                raise TypeError("can't send non-None value to a just-started plan")
            self._step = 1
            return self.ask
        if step == 1:
            raise StopIteration(value)
        raise StopIteration

    def throw(
        self,
        typ: Any,
        val: Any = None,
        tb: TracebackType | None = None,
    ) -> NoReturn:
        # A plan of one request lets its request's error through, as `yield` in a generator
        # with no handler would (the generator form raised it from its only `yield`).
        self._step = 2
        if isinstance(typ, BaseException):
            raise typ
        raise typ if val is None else val

    def close(self) -> None:
        self._step = 2


def one(request: Request, result: type[R], timeout: float | None = None) -> Plan[R]:
    """The plan of a single request."""
    return One(request, result, timeout)


def perform(plan: Plan[T], ask: Callable[[Ask[Any]], Message]) -> T:
    """Carry out `plan`, blocking on each request."""
    try:
        step = next(plan)
        while True:
            try:
                answer = ask(step)
            except Exception as err:  # the plan decides what its requests' errors mean
                step = plan.throw(err)
            else:
                step = plan.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        plan.close()


async def perform_async(plan: Plan[T], ask: Callable[[Ask[Any]], Awaitable[Message]]) -> T:
    """Carry out `plan`, awaiting each request. A cancelled await closes the plan."""
    try:
        step = next(plan)
        while True:
            try:
                answer = await ask(step)
            except Exception as err:
                step = plan.throw(err)
            else:
                step = plan.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        plan.close()
