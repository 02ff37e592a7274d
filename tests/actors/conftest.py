"""Fixtures shared by the actor tests: the child-shim harness (tests/actors/test_child*.py), and
one embedded node per module with its fan-out API (tests/actors/test_fanout*.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from subagents_node.client.fanout import FanoutAPI
from subagents_node.node.node import Node
from tests.actors.test_child import Harness
from tests.support.nodes import new_state_dir


@pytest.fixture
def shim_harness() -> Iterator[Harness]:
    """A shim template, a ROUTER standing in for the run supervisor, and a scratch dir; every
    shim it started is killed afterwards."""
    h = Harness()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(scope="module")
def shared() -> Iterator[Node]:
    """One embedded node for the module; every test makes its own budgets."""
    state = new_state_dir()
    try:
        with Node.embedded(state_dir=state) as running:
            yield running
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def fanout(shared: Node) -> FanoutAPI:
    return shared.client().fanout
