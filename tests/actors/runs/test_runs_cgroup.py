"""cgroup v2 containment (issue 10 item 4): each child's tree in its own cgroup, where the node
may create them; the subreaper alone otherwise or when forced (DESIGN §1, R-CAP-21).

Real node processes (`start --detach`), shims, children and cgroups; every wait has a deadline
(a FIFO, a pidfd, a long-poll). Skipped, with the reason, where this process cannot make a
cgroup v2 cgroup and move a process into it.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from tests.actors.runs.test_runs_shims import shim_of, wait_gone
from tests.support.nodes import NodeProcess, new_state_dir, run_cli
from tests.support.runs import launch_context, read_fifo, wait_until, write_agent

#: A child that leaves a daemon behind by double fork + setsid(), then exits 0. With a GO FIFO,
#: the daemon waits for a line on it, then leaves a second daemon the same way (one its shim
#: never saw) and exits. Each daemon ignores SIGTERM (only a KILL ends it) and reports its pid
#: on the READY FIFO. Task: `READY [GO]`.
_ESCAPER = '''\
import os, signal, sys

ready, go = (sys.argv[1].split() + [""])[:2]

def daemon():
    """True in the daemon (double fork + setsid), False in the caller once it has gone."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return False
    os.setsid()
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return True

def say(line):
    with open(ready, "w") as fifo:
        fifo.write(line + "\\n")

if daemon():
    say(f"daemon {os.getpid()}")
    if go:
        with open(go) as fifo:
            fifo.read()
        if daemon():
            say(f"second {os.getpid()}")
            while True:
                signal.pause()
        os._exit(0)
    while True:
        signal.pause()
'''

#: A child that leaves a `setsid()` daemon (it ignores SIGTERM and reports its pid on READY),
#: then waits for a line on GO and exits 0. Task: `READY GO`.
_HOLDER = """\
import os, signal, sys
ready, go = sys.argv[1].split()
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(ready, "w") as fifo:
        fifo.write(f"daemon {os.getpid()}\\n")
    while True:
        signal.pause()
os.waitpid(pid, 0)
with open(go) as fifo:
    fifo.read()
"""


def cgroup_v2_writable() -> str:
    """Why this process cannot make and enter a cgroup v2 cgroup ('' when it can)."""
    mount = next(
        (
            line.split(" - ")[0].split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if " - cgroup2 " in line
        ),
        None,
    )
    if mount is None:
        return "no cgroup v2 mount"
    own = next(
        (x[3:] for x in Path("/proc/self/cgroup").read_text().splitlines() if x.startswith("0::")),
        None,
    )
    if own is None:
        return "this process has no cgroup v2 path"
    probe = Path(os.path.normpath(mount + own)) / f"sa-test-probe.{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as err:
        return f"cannot make a cgroup below {probe.parent}: {err.strerror}"
    probe.rmdir()
    return ""


NOT_WRITABLE = cgroup_v2_writable()
needs_cgroups = pytest.mark.skipif(
    bool(NOT_WRITABLE), reason=f"cgroup v2 is not writable here: {NOT_WRITABLE}"
)


@pytest.fixture
def escaper() -> Iterator[Path]:
    directory = new_state_dir()
    agents = directory / "agents"
    write_agent(
        agents,
        "escaper",
        "Leaves setsid() daemons behind.",
        '["{python}", "{agent_dir}/escaper.py", "{task}"]',
    )
    (agents / "escaper.py").write_text(_ESCAPER)
    write_agent(
        agents,
        "holder",
        "Leaves a setsid() daemon behind, then waits for a line before it exits.",
        '["{python}", "{agent_dir}/holder.py", "{task}"]',
    )
    (agents / "holder.py").write_text(_HOLDER)
    yield agents
    with suppress(OSError):
        for path in sorted(directory.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        directory.rmdir()


def cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return ""


def status_json(node: NodeProcess) -> dict[str, object]:
    done = run_cli("status", "--json", state_dir=node.state_dir)
    assert done.returncode == 0, done.stderr
    containment = json.loads(done.stdout)["containment"]
    assert isinstance(containment, dict)
    return containment


@needs_cgroups
def test_r_cap_21_in_its_cgroup_a_double_forked_setsid_daemon_holds_the_slot_until_stop_kills_it(
    start_node: Callable[..., NodeProcess], state_dir: Path, escaper: Path, tmp_path: Path
) -> None:
    """With cgroup containment the child is born in a cgroup of its own below the node's
    (`status` names it); the daemon its child left behind (double fork + setsid, ignoring
    SIGTERM) is in it and keeps the run running and the slot held; `stop` kills it; once the
    tree ended the child's cgroup is removed."""
    node = start_node(state_dir=state_dir)
    containment = status_json(node)
    assert containment["mode"] == "cgroup", containment
    base = Path(str(containment["path"]))
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    client = node.client()
    ctx = launch_context(escaper, max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("escaper", str(fifo), True, None))
    daemon = int(read_fifo(fifo).split()[1])
    child_pid = run.children[0].pid
    assert child_pid is not None
    wait_gone(child_pid)

    mount_own = base / run.children[0].child_id
    assert mount_own.is_dir()
    assert cgroup_of(daemon).endswith(f"/{base.name}/{run.children[0].child_id}")
    view = client.runs.show(run.run_id)
    assert view.state == "running" and view.children[0].state == "running"
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1

    client.runs.stop(run.run_id)
    wait_gone(daemon)  # it ignores SIGTERM: the KILL after the grace ended it
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "stopped" and done.children[0].proof_state == "observed"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    assert not mount_own.exists()  # removed once its tree ended


@needs_cgroups
def test_r_cap_21_after_its_shim_died_the_cgroup_holds_a_daemon_the_shim_never_saw(
    start_node: Callable[..., NodeProcess], state_dir: Path, escaper: Path, tmp_path: Path
) -> None:
    """DESIGN §1: a dead shim's tree is proven ended only when every process of it is gone.
    The shim recorded the daemon its child left, then was killed; the daemon leaves a second
    daemon (double fork + setsid, never reported by anyone) and exits. The recorded identities
    are all gone, but the child's cgroup is still populated: the run stays running and the
    slot held, and `stop` kills the second daemon through the cgroup (it ignores SIGTERM);
    the node removes the child's cgroup the dead shim left."""
    node = start_node(state_dir=state_dir)
    base = Path(str(status_json(node)["path"]))
    client = node.client()
    ctx = launch_context(escaper, max_active_async_runs_per_session=1)
    ready, go = tmp_path / "ready", tmp_path / "go"
    os.mkfifo(ready)
    os.mkfifo(go)
    run = client.runs.launch(ctx.single("escaper", f"{ready} {go}", True, None))
    daemon = int(read_fifo(ready).split()[1])
    child = run.children[0]
    record = Path(child.stdout_path).parent / f"child-{child.index}" / "exit.json"

    def exit_recorded() -> bool:
        with suppress(OSError, ValueError):
            return daemon in [p["pid"] for p in json.loads(record.read_text())["descendants"]]
        return False

    wait_until(exit_recorded, what="the shim to record the daemon it was left with")
    shim = shim_of(run)
    os.kill(shim, signal.SIGKILL)
    wait_gone(shim)
    wait_until(lambda: f"live on (pid {daemon}): waiting" in node.log(), what="the shim's death")
    with open(go, "w") as fifo:
        fifo.write("go\n")
    second = int(read_fifo(ready).split()[1])
    wait_gone(daemon)
    wait_until(
        lambda: (
            f"live on (pid {second}): waiting" in node.log()
            or client.runs.show(run.run_id).state != "running"
        ),
        what="the node to see the first daemon's end",
    )

    view = client.runs.show(run.run_id)
    assert view.state == "running" and view.children[0].state == "running"
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1
    os.kill(second, 0)  # alive, and what holds the slot
    assert cgroup_of(second).endswith(f"/{base.name}/{child.child_id}")

    client.runs.stop(run.run_id)
    wait_gone(second)
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "stopped" and done.children[0].proof_state == "observed"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    assert not (base / child.child_id).exists()


@needs_cgroups
def test_r_cap_21_a_shim_killed_before_its_child_exited_leaves_the_cgroup_as_the_tree(
    start_node: Callable[..., NodeProcess], state_dir: Path, escaper: Path, tmp_path: Path
) -> None:
    """The shim is killed while its child runs, so no exit record names the daemon the child
    left; then the child exits. The child's cgroup still holds the daemon: the run stays
    running with its slot held (it used to settle with the daemon alive and the slot freed),
    and `stop` kills the daemon through the cgroup (it ignores SIGTERM)."""
    node = start_node(state_dir=state_dir)
    base = Path(str(status_json(node)["path"]))
    client = node.client()
    ctx = launch_context(escaper, max_active_async_runs_per_session=1)
    ready, go = tmp_path / "ready", tmp_path / "go"
    os.mkfifo(ready)
    os.mkfifo(go)
    run = client.runs.launch(ctx.single("holder", f"{ready} {go}", True, None))
    daemon = int(read_fifo(ready).split()[1])
    try:
        child = run.children[0]
        assert child.pid is not None
        shim = shim_of(run)
        os.kill(shim, signal.SIGKILL)
        wait_gone(shim)
        wait_until(lambda: "live on (pid " in node.log(), what="the node to watch the child")
        with open(go, "w") as fifo:
            fifo.write("go\n")
        wait_gone(child.pid)
        wait_until(
            lambda: (
                f"live on (pid {daemon}): waiting" in node.log()
                or client.runs.show(run.run_id).state != "running"
            ),
            what="the node to see the child's end",
        )

        assert client.runs.show(run.run_id).state == "running"
        assert client.capacity.snapshot(ctx.session_id, 1).used == 1
        os.kill(daemon, 0)  # alive, and what holds the slot
        assert cgroup_of(daemon).endswith(f"/{base.name}/{child.child_id}")

        client.runs.stop(run.run_id)
        wait_gone(daemon)
        done = client.runs.wait(run.run_id, timeout=30)
        assert done.state == "stopped"
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)


@needs_cgroups
def test_status_and_doctor_name_the_cgroup_containment_in_use(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    node = start_node(state_dir=state_dir)
    containment = status_json(node)
    assert containment["mode"] == "cgroup" and Path(str(containment["path"])).is_dir()
    text = run_cli("status", state_dir=state_dir).stdout
    assert f"containment: cgroup v2 ({containment['path']})" in text
    doctor = run_cli("doctor", state_dir=state_dir).stdout
    assert f"[ok  ] containment: cgroup v2 ({containment['path']})" in doctor


def test_forced_subreaper_containment_makes_no_cgroup_and_still_holds_an_escaped_daemon(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    escaper: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`containment = subreaper` (SUBAGENTS_CONTAINMENT): no cgroup is made, status and doctor
    say why, and the shim's subreaper alone still holds the daemon's slot until `stop`."""
    monkeypatch.setenv("SUBAGENTS_CONTAINMENT", "subreaper")
    node = start_node(state_dir=state_dir)
    assert status_json(node) == {"mode": "subreaper", "path": "", "why": "containment = subreaper"}
    line = "containment: subreaper only (containment = subreaper)"
    assert line in run_cli("status", state_dir=state_dir).stdout
    assert f"[ok  ] {line}" in run_cli("doctor", state_dir=state_dir).stdout
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    client = node.client()
    ctx = launch_context(escaper, max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("escaper", str(fifo), True, None))
    daemon = int(read_fifo(fifo).split()[1])
    assert cgroup_of(daemon) == cgroup_of(os.getpid())  # the node's own, like the shim's
    child_pid = run.children[0].pid
    assert child_pid is not None
    wait_gone(child_pid)
    assert client.runs.show(run.run_id).state == "running"
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1

    client.runs.stop(run.run_id)
    wait_gone(daemon)
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "stopped" and done.children[0].proof_state == "observed"


@needs_cgroups
def test_a_node_starting_leaves_a_serving_nodes_cgroup_directory_alone(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    """Two nodes on one host, two state dirs: the second one's start sweeps what killed nodes
    left, and must not take the first one's directory (idle, so empty but for its mark) for
    one: the path the first node's `status` names stays there."""
    first = status_json(start_node(state_dir=state_dir))
    other = start_node()
    second = status_json(other)
    assert first["path"] != second["path"]
    assert Path(str(first["path"])).is_dir() and Path(str(second["path"])).is_dir()


@needs_cgroups
def test_a_killed_nodes_cgroup_directory_is_swept_by_the_next_node_to_start(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    """A node killed with -9 leaves its directory and its mark behind; the next node started
    on the host (any state dir) sees the mark's process gone and removes both. A clean stop
    leaves nothing."""
    killed = start_node(state_dir=state_dir)
    left = Path(str(status_json(killed)["path"]))
    marks = [p.name for p in left.iterdir() if p.is_dir()]
    assert marks == [f"node.{killed.pid}.{_start_ticks(killed.pid)}"], marks
    owners = psutil.Process(killed.pid).children()
    killed.kill()
    psutil.wait_procs(owners, timeout=10)  # the owners follow their node (parent death)
    if not left.is_dir():  # any node that starts on this host sweeps it: one did meanwhile
        pytest.skip("another node started on this host meanwhile and swept it first")
    stopped = start_node()
    assert not left.exists()
    base = Path(str(status_json(stopped)["path"]))
    assert stopped.stop().returncode == 0
    assert not base.exists()


def _start_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19])
