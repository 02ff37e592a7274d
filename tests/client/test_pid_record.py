"""The pid record (`node.pid`) names a live node only while that very process runs, and reading
it costs a client two small reads of /proc, not psutil (runtime/client/paths.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from subagents_node.client.paths import PID_NAME, process_create_time, read_pid_file
from tests.support.nodes import REPO, NodeProcess, new_state_dir, run_cli


def _write(state_dir: Path, record: object) -> None:
    (state_dir / PID_NAME).write_text(json.dumps(record))


def test_a_pid_record_names_a_live_node_only_while_that_very_process_runs(tmp_path: Path) -> None:
    from subagents_node.client.paths import process_create_time

    proc = subprocess.Popen(["sleep", "60"])
    try:
        created = psutil.Process(proc.pid).create_time()
        assert process_create_time(proc.pid) == created  # what older records hold, exactly
        record = {"pid": proc.pid, "create_time": created, "address": "ipc:///x/node.sock"}
        _write(tmp_path, record)
        assert read_pid_file(tmp_path) == record
        _write(tmp_path, {**record, "create_time": created + 0.01})  # the pid, reused
        assert read_pid_file(tmp_path) is None
        _write(tmp_path, record)
        proc.send_signal(signal.SIGKILL)  # not reaped (no wait): a zombie once it dies
        deadline = time.monotonic() + 10.0
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "SIGKILL did not end the process"
            os.sched_yield()
        assert read_pid_file(tmp_path) is None  # a node killed with -9, not yet reaped
    finally:
        proc.kill()
        proc.wait()
    assert read_pid_file(tmp_path) is None  # reaped: gone


@pytest.mark.parametrize(
    "record",
    [
        {"pid": 0, "create_time": 0.0},
        {"pid": -1, "create_time": 0.0},
        {"pid": "1; rm -rf /", "create_time": 0.0},
        {"pid": 2**70, "create_time": 0.0},
        {"pid": os.getpid()},
        {"create_time": 0.0},
        [1, 2],
        "node",
    ],
)
def test_a_pid_record_that_does_not_parse_names_no_node(tmp_path: Path, record: object) -> None:
    _write(tmp_path, record)
    assert read_pid_file(tmp_path) is None


@pytest.mark.parametrize(
    "text",
    [
        '{"pid": 1e400, "create_time": 1.0, "address": "ipc:///x/node.sock"}',
        '{"pid": Infinity, "create_time": 1.0, "address": "ipc:///x/node.sock"}',
        '{"pid": NaN, "create_time": 1.0, "address": "ipc:///x/node.sock"}',
        '{"pid": 1.0, "create_time": 1.0, "address": "ipc:///x/node.sock"}',
        '{"pid": true, "create_time": 1.0, "address": "ipc:///x/node.sock"}',
    ],
)
def test_a_pid_that_is_no_integer_names_no_node_and_stop_says_so_in_one_line(
    tmp_path: Path, text: str
) -> None:
    """`1e400` and `Infinity` parse as floats that `int()` cannot take: `stop` and a foreground
    `run` ended with an OverflowError traceback."""
    (tmp_path / PID_NAME).write_text(text)
    assert read_pid_file(tmp_path) is None
    done = run_cli("stop", state_dir=tmp_path, timeout=30)
    assert done.returncode == 3, done.stderr
    assert done.stderr == f"error: no node is running for {tmp_path}\n"


def test_a_record_of_a_live_process_with_no_address_names_no_node(tmp_path: Path) -> None:
    """`stop` read the pid and the start time, then failed on `record["address"]` with a
    KeyError traceback."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        _write(tmp_path, {"pid": proc.pid, "create_time": process_create_time(proc.pid)})
        assert read_pid_file(tmp_path) is None
        done = run_cli("stop", state_dir=tmp_path, timeout=30)
        assert (done.returncode, done.stderr) == (3, f"error: no node is running for {tmp_path}\n")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_fifo_in_place_of_the_pid_record_names_no_node_at_once() -> None:
    """Its open waited for a writer: `stop` hung for good, and a starting node with it."""
    state_dir = new_state_dir()
    fifo = state_dir / PID_NAME
    os.mkfifo(fifo)
    try:
        done = run_cli("stop", state_dir=state_dir, timeout=30)
        assert (done.returncode, done.stderr) == (3, f"error: no node is running for {state_dir}\n")
    finally:
        with contextlib.suppress(OSError):  # let a reader that did block go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        shutil.rmtree(state_dir, ignore_errors=True)


def test_stop_never_signals_a_live_process_a_copied_record_names_that_serves_no_node(
    tmp_path: Path,
) -> None:
    """A record that names another live process, with its true start time (copied from a
    node's, or forged), had `stop` wait 15 s, SIGTERM that process and print `node stopped`."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        created = process_create_time(proc.pid)
        address = f"ipc://{tmp_path}/node.sock"
        _write(tmp_path, {"pid": proc.pid, "create_time": created, "address": address})
        done = run_cli("stop", state_dir=tmp_path, timeout=60)
        assert done.returncode == 3, done.stderr
        assert done.stderr.startswith(f"error: no node answers for {tmp_path}, and the process")
        assert done.stderr.endswith("does not serve it: nothing was signalled\n")
        assert proc.poll() is None, "stop signalled a process that serves no node"
    finally:
        proc.kill()
        proc.wait()


def test_a_client_that_finds_its_node_through_the_pid_record_loads_no_psutil(
    node: NodeProcess,
) -> None:
    probe = (
        "import sys, subagents_node\n"
        "with subagents_node.connect() as client:\n"
        "    client.ping()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psutil'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env["SUBAGENTS_STATE_DIR"] = str(node.state_dir)
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
