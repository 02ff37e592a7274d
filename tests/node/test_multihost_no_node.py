"""A command on a home's or a worker's state dir with no node running names the start that
serves that dir again (runtime/client/fleetrole.py; DESIGN §1 "Multi-host").

It said "no node is running ...; start one with `subagents-node start`", and that plain start
is refused on such a dir (`config_invalid`, reason `fleet_role`: it would cut the workers off,
or stop the worker's runs): the advice led to a second error. It now names `start --home
--listen ...` on a home's dir and `start --join ... --name NAME` on a worker's, from the
address book the stopped node left. A dir that was neither keeps the plain advice.

Real nodes on loopback, started and stopped through the real CLI. Nothing is mocked.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support.fleet import fleet
from tests.support.nodes import new_state_dir, run_cli

pytestmark = pytest.mark.slow


def test_no_node_on_a_homes_or_a_workers_dir_names_the_start_in_its_role() -> None:
    with fleet(("w1",)) as crew:
        w1 = crew.workers["w1"]
        for node in (w1, crew.home):
            stopped = node.stop()
            assert stopped.returncode == 0, stopped.stderr

        home_said = run_cli("runs", state_dir=crew.home.state_dir)
        assert home_said.returncode == 3, home_said.stderr
        assert f"`subagents-node start --home --listen {crew.endpoint}`" in home_said.stderr
        assert "start one with `subagents-node start`" not in home_said.stderr

        worker_said = run_cli("runs", state_dir=w1.state_dir)
        assert worker_said.returncode == 3, worker_said.stderr
        start = f"`subagents-node start --join {crew.endpoint} --home-key KEY --name w1`"
        assert start in worker_said.stderr, worker_said.stderr

        # What it names serves the dir again: the worker's start is that very command (the
        # home's key given for KEY), once its home is back.
        assert w1.args == ("--join", crew.endpoint, "--home-key", crew.home_key, "--name", "w1")
        crew.home.start()
        w1.start()
        cluster = w1.status().cluster
        assert cluster is not None and cluster.role == "worker"

    alone = new_state_dir()
    try:
        said = run_cli("runs", state_dir=alone)
        assert said.returncode == 3 and "start one with `subagents-node start`" in said.stderr
    finally:
        shutil.rmtree(alone, ignore_errors=True)
