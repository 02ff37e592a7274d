"""A child shim whose record directory is on a full disk (DESIGN §5: a full disk is no crash).

The shim writes its exit record before each report that tells of it. On a full disk that
write failed with ENOSPC and the shim died of it: no report left, the supervisor saw the shim
gone with no record, and a child that exited 0 was settled `failed` ("the process ended while
the node was not its parent"). The report alone, once acknowledged, makes the end durable in
the node's store: the shim must send it anyway, write the record once space is back, and never
give up while the record is owed.

The disk is a small tmpfs the test mounts (root only; skipped otherwise) and unmounts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.actors.child import records, shimtemplate
from tests.actors.test_child import PY, Harness, exit_record, wait_gone
from tests.support import tmpfs
from tests.support.runs import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def tiny_disk(shim_harness: Harness) -> Iterator[Path]:
    disk = shim_harness.dir / "disk"
    disk.mkdir()
    try:
        with tmpfs.mounted(disk, "size=256k,mode=0700"):
            yield disk
    finally:
        shutil.rmtree(disk, ignore_errors=True)


def fill(disk: Path) -> Path:
    return tmpfs.fill(disk / "filler")


def test_a_child_that_ends_while_the_disk_is_full_is_reported_with_its_exit_status(
    shim_harness: Harness, tiny_disk: Path
) -> None:
    release = shim_harness.dir / "release.fifo"
    os.mkfifo(release)
    spec = shim_harness.spec(
        "c1",
        [PY, "-c", "import sys; open(sys.argv[1]).read(); sys.exit(4)", str(release)],
        record_dir=str(tiny_disk / "c1"),
    )
    # A shim that has sent all it knows gives up quickly: it must not while its record is owed.
    order = {**shimtemplate.order_of(spec, shim_harness.address), "give_up_s": 0.1}
    shim_harness.template.order_raw(order)
    try:
        started = shim_harness.until("started")
        filler = fill(tiny_disk)
        release.write_text("go")  # the child exits 4; the shim cannot write its record

        ended = shim_harness.report(ack=False)
        assert (ended.kind, ended.exit_code, ended.tree_ended) == ("tree_ended", 4, True)
        assert not (Path(spec.records) / records.EXIT_RECORD).exists()
        assert not [p for p in os.listdir(spec.records) if p.endswith(".tmp")]  # no empty temp file

        filler.unlink()  # space is back: the next resend writes the record first
        again = shim_harness.report(ack=False)
        assert (again.kind, again.exit_code) == ("tree_ended", 4)
        wait_until(lambda: exit_record(spec)["tree_ended"], what="the exit record written")
        assert exit_record(spec)["exit_code"] == 4
        wait_gone(started.shim_pid)  # its record on disk, the shim gives up as it did before

    finally:  # a child still waiting for its release (the test failed early) is let go
        with contextlib.suppress(OSError):
            os.close(os.open(release, os.O_WRONLY | os.O_NONBLOCK))


def test_a_shim_that_cannot_write_its_claim_on_a_full_disk_reports_not_started(
    shim_harness: Harness, tiny_disk: Path
) -> None:
    """No claim, no child (the claim fences a recovering node): the node hears why at once
    instead of finding the shim dead with nothing said."""
    fill(tiny_disk)
    spec = shim_harness.spec(
        "c1", [PY, "-c", "open('started', 'w')"], record_dir=str(tiny_disk / "c1")
    )
    shim_harness.start(spec)
    report = shim_harness.report()
    assert report.kind == "not_started" and report.tree_ended
    assert report.error is not None and "No space left on device" in report.error
    assert "\n" not in report.error
    assert not (shim_harness.dir / "started").exists()
    wait_gone(report.shim_pid)
