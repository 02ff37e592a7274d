"""The template's announcement of each fork (actors/child/template.py `_announce_fork`), made of
bytes with as few objects as it can: it must say what `announce` (json) says of the same fork,
the identity procfs reads for the shim, or the supervisor would take a live shim for gone."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from subagents_node.actors.child import procfs
from subagents_node.actors.child.template import _announce_fork, _start_time


def test_the_start_time_the_template_announces_is_the_one_procfs_reads() -> None:
    with subprocess.Popen(["sleep", "30"]) as proc:
        try:
            announced = json.loads(_start_time(proc.pid))
            assert announced == procfs.start_time_of(proc.pid)
        finally:
            proc.kill()


def test_a_process_gone_before_its_announcement_is_announced_with_start_zero() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert _start_time(proc.pid) == b"0.0"
    assert _start_time(os.getpid()) == repr(procfs.start_time_of(os.getpid())).encode()


def test_the_announcement_of_a_fork_reads_as_announce_writes_it(
    capfd: pytest.CaptureFixture[str],
) -> None:
    order = json.dumps({"child_id": "c0ffee123456-7", "run_id": "c0ffee123456"}).encode()
    with subprocess.Popen(["sleep", "30"]) as proc:
        try:
            _announce_fork(order, proc.pid)
            line = capfd.readouterr().out
            start = procfs.start_time_of(proc.pid)
        finally:
            proc.kill()
    assert line == json.dumps(["c0ffee123456-7", proc.pid, start]) + "\n"
