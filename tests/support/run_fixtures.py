"""Fixtures shared by the run tests: script agents, a gate, and the node they run on.

A test module takes the ones it wants by importing them by name (pytest finds fixtures among a
module's names), each as `from run_fixtures import NAME as NAME` so that linters read the import
as deliberate. Both node fixtures are named `node` and override conftest's detached
fault-injection node in the modules that import one: `embedded_run_node` is an embedded node on
the test's state dir, `detached_run_node` a real detached node process on it. Whatever a failed
test left running is stopped before an embedded node stops. It never mocks ZeroMQ, SQLite or
processes, and holds no state between tests.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.node.node import Node
from tests.support.manage import embedded
from tests.support.nodes import NodeProcess, new_state_dir
from tests.support.runs import Gate, script_agents


@pytest.fixture
def agents() -> Iterator[Path]:
    """A directory of the `echo`, `fail` and `gate` script agents, removed afterwards."""
    directory = new_state_dir()
    yield script_agents(directory / "agents")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def gate(state_dir: Path) -> Iterator[Gate]:
    opened = Gate(state_dir)
    yield opened
    opened.close()


@pytest.fixture(name="node")
def embedded_run_node(state_dir: Path) -> Iterator[Node]:
    """An embedded node on the test's state dir; active runs are stopped before it stops."""
    with embedded(state_dir) as started:
        yield started


@pytest.fixture(name="node")
def detached_run_node(start_node: Callable[..., NodeProcess], state_dir: Path) -> NodeProcess:
    """A detached node process on the test's state dir (no fault injection)."""
    return start_node(state_dir=state_dir)


@pytest.fixture
def client(node: Node) -> Client:
    """The in-process client of the embedded `node`."""
    return node.client()
