"""The pid record (`node.pid`) names a live node only while that very process runs, and reading
it costs a client two small reads of /proc, not psutil (runtime/client/paths.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from subagents_node.client.paths import PID_NAME, read_pid_file
from tests.support.nodes import REPO, NodeProcess


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
