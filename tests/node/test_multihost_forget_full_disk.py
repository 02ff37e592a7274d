"""A worker forgotten while cut off stops its slot-holding runs (R-CAP-1) even if its disk is
full when it learns it (DESIGN §5: a full disk is no crash; the owner serves writes again as
soon as space returns).

It used to be that the run supervisor answered the stop (`runs.stop_released`) `store_full`,
having changed nothing, and nobody asked it again: the node asks again only when its run
supervisor becomes ready (a restart), and a full disk is none. Once space returned, the runs
whose slots the home had released ran on past their sessions' limits until the supervisor
happened to restart. Now the supervisor does the undone stop again itself, as it does every
timer's work a full disk undid.

A real home and worker on loopback; the worker's state dir is a tmpfs the test fills (root).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.support import tmpfs
from tests.support.fleet import Fleet, fleet
from tests.support.nodes import NodeProcess, new_state_dir, run_cli
from tests.support.runs import process_gone, stop_process, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs state dir needs root"),
]


@pytest.fixture
def crew() -> Iterator[Fleet]:
    with fleet((), heartbeat=(0.2, 1.5)) as started:
        yield started


def test_r_cap_1_a_forgotten_workers_stop_undone_by_a_full_disk_is_done_once_space_returns(
    crew: Fleet,
) -> None:
    directory = new_state_dir()
    with tmpfs.mounted(directory, "size=16m,mode=0700"):
        assert run_cli("keys", "generate", state_dir=directory).returncode == 0
        key = crew.public_key(directory)
        allowed = run_cli("keys", "allow", "--name", "w1", "--", key, state_dir=crew.home.state_dir)
        assert allowed.returncode == 0, allowed.stderr
        w1 = crew.workers["w1"] = NodeProcess(directory, crew.worker_args("w1"))
        child = 0
        try:
            w1.start()
            # node.log's next pages reserved: what the node says on the full disk is kept.
            subprocess.run(["fallocate", "-n", "-l", "1M", str(w1.log_path)], check=True)
            session = f"fd-{uuid.uuid4().hex[:8]}"
            code, out, err = crew.run_background(w1, session, "seconds=120", limit=1)
            assert code == 0, err
            run_id = out.strip().splitlines()[0]
            child = wait_until(
                lambda: next(
                    (c.pid for c in crew.client(w1).runs.show(run_id).children if c.pid), None
                ),
                what="its child's pid",
            )
            wait_until(lambda: crew.nodes()["w1"].state == "up", what="w1 up")
            stop_process(w1.pid)  # cut off
            try:
                wait_until(lambda: crew.nodes()["w1"].state == "unreachable", what="w1 silent")
                code, out, err = crew.cli(crew.home, "nodes", "forget", "w1", "--reason", "cut off")
                assert code == 0 and f"released 1 slot: {run_id}" in out, (out, err)
                filler = tmpfs.fill(directory / "filler")
            finally:
                os.kill(w1.pid, signal.SIGCONT)
            # The stop met the full disk: refused, nothing changed.
            wait_until(lambda: "not stopped yet" in w1.log(), what="the stop refused")
            assert "full" in w1.log(), w1.log()
            assert crew.client(w1).runs.show(run_id).state == "running"
            assert not process_gone(child)

            filler.unlink()  # space returns: nobody asks the stop again, and none is needed
            view = wait_until(
                lambda: (v := crew.client(w1).runs.show(run_id)).state != "running" and v,
                what="the forgotten worker's run to end once space returned",
            )
            assert view.state == "stopped" and "forgotten by its home" in view.error, view
            assert "cut off" in view.error, view.error
            wait_until(lambda: process_gone(child), what="its child to be gone")
            statuses = crew.client(w1).status().actors
            assert all(a.restarts == 0 for a in statuses), statuses  # no restart did it
        finally:
            if child and not process_gone(child):  # failed: no child outlives the test
                os.kill(child, signal.SIGKILL)
                wait_until(lambda: process_gone(child), what="its child killed")
            crew.close_client(w1)
            w1.cleanup()
