"""A node whose descriptors are numbered past 1024 (select()'s FD_SETSIZE).

The node lifts its soft descriptor limit to 65,536 (runtime/cli/serve.py) so 1,000 children do
not meet the common 1024; with that many open (a pidfd per shim, a connection per client), a
descriptor the node opens next is numbered past 1024. The owner supervisor's thread waited on
the owners' pidfds with select(), which raises ValueError there: it then spun, and never saw an
owner die, so a killed owner was never restarted (with the descriptors open before the node
starts, not even its owners' starts were seen). In a process of its own (the limit and the
descriptors it holds must not reach pytest).
"""

from __future__ import annotations

import textwrap

import pytest

from tests.support.descriptors import run_python

SCRIPT = textwrap.dedent(
    """
    import os, resource, signal, sys, tempfile, time
    from subagents_node.node.node import Node

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        print("skip: hard limit", hard)
        raise SystemExit(0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    hog = [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in range(1100)]
    with tempfile.TemporaryDirectory(prefix="sa-fd-", dir="/tmp") as state:
        with Node.embedded(state) as node:
            client = node.client("zmq")
            before = {a.name: a.pid for a in client.status().actors}
            if before["fanout"] is None:  # its start was never seen either
                print("restarted: False; status:", before)
                sys.exit(0)
            os.kill(before["fanout"], signal.SIGKILL)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                pid, state = {a.name: (a.pid, a.state) for a in client.status().actors}["fanout"]
                if pid not in (None, before["fanout"]) and state == "running":
                    print("restarted:", True)
                    break
                time.sleep(0.05)
            else:
                print("restarted:", False)
            client.close()
    """
)


def test_a_killed_owner_is_restarted_when_the_nodes_descriptors_are_numbered_past_1024() -> None:
    done = run_python(SCRIPT, timeout=90)
    if done.stdout.startswith("skip:"):
        pytest.skip(done.stdout.strip())
    assert "restarted: True" in done.stdout, done.stdout + done.stderr[-2000:]
