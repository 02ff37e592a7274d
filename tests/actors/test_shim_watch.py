"""The supervisor's watch of its shims (actors/child/shims.py ShimWatch): a shim is reported
gone only when it is. Out of file descriptors (EMFILE), `pidfd_open` fails for a shim that is
alive; that once settled a healthy run `failed` ("the shim died before its tree ended"). Real
processes, a real descriptor limit, in a process of its own (the limit must not reach pytest).
"""

from __future__ import annotations

import textwrap

from tests.support.descriptors import run_python

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, threading
    from subagents_node.actors.child.procfs import identity_of
    from subagents_node.actors.child.shims import ShimWatch
    from tests.support.descriptors import exhaust_descriptors

    gone = threading.Event()
    watch = ShimWatch(lambda key: gone.set())
    shim = subprocess.Popen(["sleep", "60"])
    identity = identity_of(shim.pid)
    hog = exhaust_descriptors()
    watch.watch("shim-1", identity)
    watch.flush()
    # Alive but unwatchable: never reported gone.
    print("gone while alive:", gone.wait(2.5))
    for fd in hog:
        os.close(fd)
    shim.kill()
    shim.wait()
    # Descriptors back: the watch is taken again, and the real exit is seen.
    print("gone after exit:", gone.wait(10))
    watch.close()
    """
)


def test_a_shim_is_not_reported_gone_when_only_descriptors_ran_out() -> None:
    done = run_python(SCRIPT)
    assert done.returncode == 0, done.stderr
    assert "gone while alive: False" in done.stdout, done.stdout + done.stderr
    assert "gone after exit: True" in done.stdout, done.stdout + done.stderr


HIGH_FD_SCRIPT = textwrap.dedent(
    """
    import os, resource, subprocess
    from subagents_node.actors.child.procfs import identity_of
    from subagents_node.actors.child.shims import wait_exits

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        print("skip: hard limit", hard)
        raise SystemExit(0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    hog = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    shim = subprocess.Popen(["sleep", "0.3"])
    wait_exits([identity_of(shim.pid)], 10)
    print("exited:", shim.poll() is not None or shim.wait(0) == 0)
    """
)


def test_waiting_for_shims_works_with_descriptors_numbered_past_1024() -> None:
    """A node lifts its descriptor limit for 1,000 children (cli/serve.py), so a pidfd the
    supervisor opens at stop can be numbered past select()'s FD_SETSIZE: select raised
    ValueError ("filedescriptor out of range") and the stop's wait for its shims failed."""
    done = run_python(HIGH_FD_SCRIPT)
    if done.stdout.startswith("skip:"):
        import pytest

        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stderr
    assert "exited: True" in done.stdout, done.stdout + done.stderr
