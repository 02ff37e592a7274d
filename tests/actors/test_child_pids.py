"""A shim template that cannot fork (pid exhaustion: EAGAIN from a pids controller's limit or
RLIMIT_NPROC).

The template died of the fork's BlockingIOError: the order was lost with it, no shim ever
reported the child, the launch waited for the child's start until its caller timed out, and
the run stayed `running` for good with its slot held. The template now reports the child
`not_started` itself, with the one-line cause, and lives on for the next order.

The limit is a cgroup v1 pids controller the test makes with pids.max=1 and moves the
template into (root only, and only where that controller is mounted; skipped otherwise); the
template is moved back and the cgroup removed in `finally`.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.actors.test_child import Harness

PIDS_ROOT = Path("/sys/fs/cgroup/pids")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="moving a process to a cgroup needs root")


def test_a_shim_the_template_cannot_fork_is_reported_not_started_and_the_template_lives_on(
    shim_harness: Harness,
) -> None:
    if not (PIDS_ROOT / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 pids controller mounted here")
    shim_harness.start(shim_harness.spec("c0", ["/bin/true"]))  # the template is up
    assert shim_harness.until("tree_ended").exit_code == 0
    template = shim_harness.template.pid
    assert template is not None
    group = PIDS_ROOT / f"sa-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "pids.max").write_text("1")
        (group / "cgroup.procs").write_text(str(template))  # it alone: any fork fails

        shim_harness.start(shim_harness.spec("c1", ["/bin/true"]))
        report = shim_harness.report()
        assert (report.kind, report.child_id, report.tree_ended) == ("not_started", "c1", True)
        assert report.error is not None and "Resource temporarily unavailable" in report.error
        assert "\n" not in report.error
    finally:
        (PIDS_ROOT / "cgroup.procs").write_text(str(template))
        group.rmdir()

    shim_harness.start(shim_harness.spec("c2", ["/bin/true"]))  # the same template forks again
    assert shim_harness.until("tree_ended").exit_code == 0
    assert shim_harness.template.pid == template
