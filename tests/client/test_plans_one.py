"""A plan of one request (`plans.one`) is a small `One`, not a generator: `Client.perform` sends
its request straight away, and everything that drives plans (`yield from` in a larger plan,
`perform`, `perform_async`) sees the generator protocol it saw before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from subagents_node.client.plans import Ask, One, Plan, one, perform, perform_async
from subagents_node.messages.errors import NodeTimeout
from subagents_node.messages.node import Ping, Pong

PONG = Pong(node_id="n", version="v", pid=1, uptime_s=0.0)


def test_a_plan_of_one_request_yields_its_ask_and_returns_its_answer() -> None:
    plan = one(Ping(), Pong, 2.5)
    assert isinstance(plan, One)
    ask = next(plan)
    assert ask == Ask(ask.request, Pong, 2.5) and ask.request.type == "node.ping"
    with pytest.raises(StopIteration) as done:
        plan.send(PONG)
    assert done.value.value is PONG
    with pytest.raises(StopIteration):  # exhausted, as a generator is
        next(plan)


def test_yield_from_one_inside_a_larger_plan_passes_answers_and_errors_through() -> None:
    def two() -> Plan[tuple[Any, str]]:
        first = yield from one(Ping(), Pong)
        try:
            yield from one(Ping(), Pong)
        except NodeTimeout as err:
            return first, err.message
        return first, "no error"

    answers: list[Any] = [PONG, NodeTimeout("late", address="ipc:///x")]

    def ask(step: Ask[Any]) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert perform(two(), ask) == (PONG, "late")


def test_an_error_of_its_request_is_raised_by_perform_and_perform_async() -> None:
    def failing(step: Ask[Any]) -> Any:
        raise NodeTimeout("no answer", address="ipc:///x")

    with pytest.raises(NodeTimeout, match="no answer"):
        perform(one(Ping(), Pong), failing)

    async def failing_async(step: Ask[Any]) -> Any:
        raise NodeTimeout("no answer either", address="ipc:///x")

    with pytest.raises(NodeTimeout, match="no answer either"):
        asyncio.run(perform_async(one(Ping(), Pong), failing_async))


def test_a_closed_plan_of_one_request_asks_nothing_more() -> None:
    plan = one(Ping(), Pong)
    plan.close()
    with pytest.raises(StopIteration):
        next(plan)
