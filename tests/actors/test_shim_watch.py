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


def test_a_forged_announcement_of_a_process_not_the_templates_child_is_ignored() -> None:
    """A line on a template's announce pipe (which a child of the node's user can open through
    the node's /proc/PID/fd) named any live process as a child's shim: that process was
    watched, and its exit reported the child's shim gone (a child not yet claimed by its shim
    was then given up as never started). A live process announced there must be a child of
    that template now; the test process stands in for the template."""
    import json
    import os
    import signal
    import subprocess
    import threading

    from subagents_node.actors.child.procfs import identity_of
    from subagents_node.actors.child.shims import ShimWatch
    from tests.support.runs import wait_until

    gone: list[str] = []
    seen = threading.Event()

    def on_gone(key: str) -> None:
        gone.append(key)
        seen.set()

    watch = ShimWatch(on_gone)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    watch.listen(read_end, os.getpid())
    shim = subprocess.Popen(["sleep", "60"])  # the template's (our) child: a shim
    other = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None
        stranger = int(other.stdout.readline())  # sh's child, not ours
        shim_id, stranger_id = identity_of(shim.pid), identity_of(stranger)
        assert shim_id is not None and stranger_id is not None
        watch.expect("forged")
        watch.expect("real")
        watch.flush()
        lines = [["forged", *stranger_id], ["real", *shim_id]]
        os.write(write_end, "".join(json.dumps(line) + "\n" for line in lines).encode())
        # Both lines read (one write, one read): a stranger killed before would be "gone".
        wait_until(lambda: watch.watched >= 1, 10.0, "the announcements to be read")
        os.kill(stranger, signal.SIGKILL)
        other.wait(timeout=10)
        shim.kill()
        shim.wait(timeout=10)
        assert seen.wait(10), "the real shim's exit was not seen"
    finally:
        watch.close()  # its thread has handled whatever it saw before the check below
        os.close(write_end)
        for proc in (shim, other):
            proc.kill()
            proc.wait()
        if other.stdout is not None:
            other.stdout.close()
    assert gone == ["real"], gone
