"""`run --on NAME` refused by the worker for its working directory says it was the worker's
(DESIGN §1 "Multi-host": `--cwd` must exist on the worker).

The worker's refusal read "working directory does not exist: DIR", the very message a local
run gives, so a user on the home, where DIR may well exist, had nothing to tell which host
lacked it. It now ends "(on worker NAME)", in the foreground and in the background.

Real nodes on loopback, through the real CLI. Nothing is mocked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fleet import EXAMPLE_AGENTS, Fleet, fleet

pytestmark = pytest.mark.slow


@pytest.fixture
def crew() -> Iterator[Fleet]:
    with fleet(("w1",)) as started:
        yield started


@pytest.mark.parametrize("mode", ["--foreground", "--async"])
def test_a_cwd_the_worker_lacks_is_named_as_the_workers(crew: Fleet, mode: str) -> None:
    missing = crew.workers["w1"].state_dir / "not-on-w1"
    args = ("run", mode, "--on", "w1", "--cwd", str(missing), "--agents-dir", str(EXAMPLE_AGENTS))
    code, _, err = crew.cli(crew.home, *args, "sleeper", "seconds=0")
    assert code == 1, err
    assert err.strip() == f"error: working directory does not exist: {missing} (on worker w1)"
