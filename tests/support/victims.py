"""A file outside the state dir for the tests that plant a symlink to it where the node keeps
a file of its own (tests/actors/runs/test_run_dir_files.py, tests/node/test_state_dir_files.py):
whatever the node does, the file must still hold PRECIOUS, with its mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nodes import short_dir

PRECIOUS = b"precious data, not the node's\n"


@pytest.fixture
def victim() -> Iterator[Path]:
    """A file outside the state dir that a planted symlink names (mode 0644)."""
    directory = short_dir("sa-victim-")
    path = directory / "victim"
    path.write_bytes(PRECIOUS)
    path.chmod(0o644)
    yield path
    path.unlink(missing_ok=True)
    directory.rmdir()
