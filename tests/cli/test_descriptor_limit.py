"""A low hard limit on open files is named where an operator looks: `doctor` warns, and a node
started under it says so in node.log (DESIGN §4; `runtime/cli/descriptors.py`).

Under `ulimit -n 256` (hard), 300 `runs.watch` long polls made libzmq abort the run supervisor
("Too many open files") until it was marked failed; nothing said why the limit mattered. The
commands run as real processes with their hard limit lowered (any user may lower it).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
from pathlib import Path

import zmq

from subagents_node.client.paths import LOG_NAME
from subagents_node.node.ownerspecs import owner_endpoint
from tests.support.nodes import NodeProcess, new_state_dir, run_cli
from tests.support.runs import wait_until

LOW = 256


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW, LOW))


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_low_limit,
        check=False,
    )


def test_doctor_warns_of_a_low_hard_limit_on_open_files_and_says_how_to_raise_it(
    tmp_path: Path,
) -> None:
    done = _cli(tmp_path / "state", "doctor")
    warning = next(line for line in done.stdout.splitlines() if "open files" in line)
    assert warning.startswith("[warn] open files:"), done.stdout
    assert f"is {LOW}, below 4096" in warning and "too many open files" in warning
    assert "LimitNOFILE=65536" in done.stdout  # the fix line


def test_doctor_says_nothing_of_a_high_enough_limit(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    done = run_cli("doctor", state_dir=tmp_path / "state")
    assert ("open files" in done.stdout) == (hard != resource.RLIM_INFINITY and hard < 4096)


def test_a_node_started_under_a_low_hard_limit_warns_in_its_log(state_dir: Path) -> None:
    started = _cli(state_dir, "start", "--detach")
    try:
        assert started.returncode == 0, started.stderr
        log = (state_dir / LOG_NAME).read_text()
        assert f"the hard limit on open files (ulimit -Hn) is {LOW}, below 4096" in log
        assert "ulimit -Hn 65536" in log
    finally:
        run_cli("stop", state_dir=state_dir)


def test_an_owner_aborted_out_of_descriptors_is_reported_and_does_not_take_the_node() -> None:
    """libzmq asserts on EMFILE in an ipc accept() and aborts the owner (nothing can catch
    it): its status reason said only "killed by SIGABRT"; it names the likely cause and the
    limit. Once it was marked failed, its stand-in, bound in the node's process, met the same
    peers and libzmq aborted the whole node."""
    node = NodeProcess(new_state_dir(), prefix=("prlimit", f"--nofile={LOW}:{LOW}", "--"))
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    peers: list[zmq.Socket[bytes]] = []

    def failed() -> str:
        [owner] = [a for a in node.status().actors if a.name == "supervisor"]
        return owner.reason if owner.state == "failed" else ""

    try:
        node.start()
        endpoint = owner_endpoint(node.state_dir, "supervisor")
        for _ in range(LOW + 44):  # more connections than the owner has descriptors
            peer = zctx.socket(zmq.DEALER)
            peer.setsockopt(zmq.LINGER, 0)
            peer.connect(endpoint)
            peers.append(peer)
        # The peers stay connected: they reconnect to each restart, which aborts again.
        reason = wait_until(failed, timeout=30, what="the supervisor marked failed")
        assert "SIGABRT (most likely too many open files" in reason, reason
        assert f"the limit on open files is {LOW}" in reason, reason
        # No stand-in listens for it in the node's own process, where the same peers would
        # have made libzmq abort the node itself.
        assert node.alive() and node.status().actors
        assert "no stand-in for supervisor: it ran out of open files" in node.log()
    finally:
        for peer in peers:
            peer.close(linger=0)
        zctx.term()
        node.cleanup()
        shutil.rmtree(node.state_dir, ignore_errors=True)
