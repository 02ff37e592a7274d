"""The rebind message (actors/child/rebind.py): a live shim told to end its tree with another
process watches that one from then on, and ends the tree (`ended_by: node_gone`) once it dies.

The test sits in the supervisor's seat (tests/actors/test_child.py's harness) and plays both
processes a shim can be bound to with `sleep` processes of its own. Real shims forked from a
real template, real children; every wait is on a pidfd or a condition, with a deadline.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.actors.child import rebind, shimtemplate
from subagents_node.actors.child.procfs import ProcessIdentity, identity_of
from subagents_node.actors.child.records import SHIM_RECORD
from subagents_node.actors.child.shims import signal_shim
from subagents_node.messages.runs import ChildReport, ChildSpec
from tests.actors.test_child import Harness, exit_record, wait_gone
from tests.support.runs import process_gone, wait_until
from tests.support.sleepers import watched_by


@pytest.fixture
def command() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for a foreground command a shim can be bound to."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _identity(proc: subprocess.Popen[bytes]) -> ProcessIdentity:
    found = identity_of(proc.pid)
    assert found is not None
    return found


def _start(
    harness: Harness, ends_with: ProcessIdentity | None = None
) -> tuple[ChildSpec, ChildReport]:
    spec = harness.spec("c1", ["sleep", "600"])
    Path(spec.stdout_path).parent.mkdir(parents=True, exist_ok=True)
    harness.template.order_raw(shimtemplate.order_of(spec, harness.address, ends_with=ends_with))
    return spec, harness.until("started")


def _tell(spec: ChildSpec, started: ChildReport, to: ProcessIdentity) -> None:
    """What the adopting supervisor does (actors/runs/rebinding.py): the file, then the signal."""
    rebind.write_binding(spec.records, to)
    assert signal_shim(ProcessIdentity(started.shim_pid, started.shim_start), rebind.REBIND_SIGNAL)


def _assert_ended_with_node_gone(spec: ChildSpec, started: ChildReport) -> None:
    wait_gone(started.shim_pid)  # no node to report to: the record says it all
    record = exit_record(spec)
    assert (record["tree_ended"], record["ended_by"]) == (True, "node_gone"), record
    assert started.pid is not None and process_gone(started.pid)


def test_an_unbound_shim_told_to_rebind_ends_its_tree_when_that_process_dies(
    shim_harness: Harness, command: subprocess.Popen[bytes]
) -> None:
    spec, started = _start(shim_harness)
    assert rebind.shim_of(spec.records) == (
        ProcessIdentity(started.shim_pid, started.shim_start),
        rebind.SHIM_VERSION,
    )
    assert watched_by(started.shim_pid) == set()  # it outlives its node

    _tell(spec, started, _identity(command))
    wait_until(lambda: watched_by(started.shim_pid) == {command.pid}, what="the rebind")
    command.kill()

    _assert_ended_with_node_gone(spec, started)


def test_a_bound_shim_rebound_watches_only_the_new_process_and_ignores_a_file_it_cannot_read(
    shim_harness: Harness, command: subprocess.Popen[bytes]
) -> None:
    """The process it was bound to no longer ends its tree (its pidfd is closed); a `bind.json`
    that does not parse changes nothing (the shim keeps its binding, and lives)."""
    first = subprocess.Popen(["sleep", "600"])
    try:
        spec, started = _start(shim_harness, ends_with=_identity(first))
        assert watched_by(started.shim_pid) == {first.pid}
        (Path(spec.records) / rebind.BIND_RECORD).write_text("{not json")
        shim = ProcessIdentity(started.shim_pid, started.shim_start)
        assert signal_shim(shim, rebind.REBIND_SIGNAL)

        _tell(spec, started, _identity(command))
        wait_until(lambda: watched_by(started.shim_pid) == {command.pid}, what="the rebind")
    finally:
        first.kill()
        first.wait()
    command.kill()

    _assert_ended_with_node_gone(spec, started)


def test_a_shim_rebound_to_a_process_gone_already_ends_its_tree_at_once(
    shim_harness: Harness,
) -> None:
    gone = subprocess.Popen(["sleep", "600"])
    identity = _identity(gone)
    gone.kill()
    gone.wait()
    spec, started = _start(shim_harness)

    _tell(spec, started, identity)

    _assert_ended_with_node_gone(spec, started)


def test_a_rebind_written_before_the_shim_set_its_handler_is_read_as_it_starts(
    shim_harness: Harness, command: subprocess.Popen[bytes]
) -> None:
    """A supervisor may adopt a shim that has claimed its child but not yet set its handlers:
    the signal is then ignored (its default), but the file was written first."""
    spec = shim_harness.spec("c1", ["sleep", "600"])
    Path(spec.records).mkdir(parents=True)
    rebind.write_binding(spec.records, _identity(command))
    shim_harness.start(spec)
    started = shim_harness.until("started")
    assert watched_by(started.shim_pid) == {command.pid}
    command.kill()

    _assert_ended_with_node_gone(spec, started)


@pytest.mark.parametrize(
    "text",
    ['{"ends_with": [true, 0]}', '{"ends_with": [12, "0"]}', "[" * 100_000, '{"ends_with": 7}'],
    ids=["bool-pid", "text-start", "deep", "not-a-pair"],
)
def test_a_bind_record_that_names_no_process_is_ignored(tmp_path: Path, text: str) -> None:
    """Read by the shim: one it cannot read keeps the binding it has, and never raises."""
    (tmp_path / rebind.BIND_RECORD).write_text(text)
    assert rebind.read_binding(str(tmp_path)) is None


def test_a_fifo_in_place_of_a_shims_claim_reads_as_no_claim_at_once(tmp_path: Path) -> None:
    """The supervisor reads the claim on its loop (which shims to rebind): a blocking open()
    of a FIFO a child put there used to wedge it for good."""
    os.mkfifo(tmp_path / SHIM_RECORD)
    found: list[object] = []
    reader = threading.Thread(target=lambda: found.append(rebind.shim_of(str(tmp_path))))
    reader.daemon = True
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading the claim blocked on the FIFO"
    assert found == [None]
