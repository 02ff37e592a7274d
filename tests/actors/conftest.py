"""Fixtures shared by the child-shim tests (tests/actors/test_child*.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.actors.test_child import Harness


@pytest.fixture
def shim_harness() -> Iterator[Harness]:
    """A shim template, a ROUTER standing in for the run supervisor, and a scratch dir; every
    shim it started is killed afterwards."""
    h = Harness()
    try:
        yield h
    finally:
        h.close()
