"""A hostile or broken child against its shim and the shim template: whatever it kills, the
launch is answered, the run ends, and the slot is freed only once the tree is proven gone
(DESIGN §1, SPEC §0.4 "Proof from the parent", R-RUN-5, R-CAP-21).

Real node processes (`start --detach`), real shims, template and children; every wait has a
deadline (a pidfd, a long-poll, the client's timeout).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import termios
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from subagents_node.actors.child.shimtemplate import TEMPLATE_MODULE
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.supervisor import RunView, TaskItem
from tests.actors.runs.test_runs_cgroup import needs_cgroups
from tests.actors.runs.test_runs_shims import wait_gone
from tests.support.nodes import NodeProcess, new_state_dir
from tests.support.runs import launch_context, wait_until, write_agent

CHILDREN = 4
#: Kill the shim's template (its parent's parent: field 4 of the shim's stat), then stop the
#: shim: it stays stopped, an orphan nobody continues. (Stopping the template first raced: a
#: SIGSTOP is taken by one thread when it is next scheduled, and until then the template's
#: stop-watching thread could still continue the shim. A SIGKILL ends every thread at once.)
_FREEZE_FOR_GOOD = "read -r _ _ _ T _ < /proc/$PPID/stat; kill -KILL $T; kill -STOP $PPID"


@pytest.fixture
def hostile() -> Iterator[Path]:
    directory = new_state_dir()
    agents = directory / "agents"
    write_agent(
        agents,
        "shimkiller",
        "SIGKILLs its own shim (its parent) at once, then sleeps.",
        '["sh", "-c", "kill -9 $PPID; exec sleep 60"]',
    )
    write_agent(
        agents,
        "latekiller",
        "SIGKILLs its own shim once it has reported, then sleeps, ignoring SIGTERM.",
        '["sh", "-c", "sleep 0.5; kill -9 $PPID; trap \'\' TERM; exec sleep 60"]',
    )
    # The template continues a shim a child stopped (shimstops.py); these kill the template
    # first, so nothing continues the shim: what the node's backstops are for
    # (a shim whose template is gone, as after a node restart, stays stopped).
    write_agent(
        agents,
        "shimfreezer",
        "Freezes its own shim for good once it has reported (its template killed first), "
        "then sleeps.",
        f'["sh", "-c", "sleep 0.5; {_FREEZE_FOR_GOOD}; exec sleep 60"]',
    )
    write_agent(
        agents,
        "earlyfreezer",
        "Freezes its own shim for good at once, before its first report, then sleeps.",
        f'["sh", "-c", "{_FREEZE_FOR_GOOD}; exec sleep 60"]',
    )
    write_agent(agents, "sh", "Runs its task with sh.", '["sh", "-c", "{task}"]')
    write_agent(agents, "quick", "Says hi.", '["sh", "-c", "echo hi"]')
    yield agents
    with suppress(OSError):
        for path in sorted(directory.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        directory.rmdir()


@pytest.mark.parametrize(
    "containment",
    [
        pytest.param("cgroup", marks=needs_cgroups),
        "subreaper",
    ],
)
def test_children_that_kill_their_shim_at_once_are_answered_held_and_stopped(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    hostile: Path,
    containment: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child that SIGKILLs its shim before the shim's first report was never known to the
    node: the launch was not answered (the client gave up: "did not answer runs.launch in
    time (is it running?)"), the run stayed `running` until the node restarted, and `stop`
    ended nothing ("still running after 30s"). Each shim is watched from its announcement
    now: the child, found in its cgroup (or, with the subreaper alone, in its dead shim's
    session: it was failed "ended", exit unknown, its slot retained for good, while it ran
    on), is started (a real pid), holds the slot, and `stop` kills it and frees the slot."""
    monkeypatch.setenv("SUBAGENTS_CONTAINMENT", containment)
    client = start_node(state_dir=state_dir).client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    tasks = [TaskItem(agent=ctx.plan("shimkiller"), task="x") for _ in range(CHILDREN)]
    run = client.runs.launch(ctx.launch("parallel", True, items=tasks, concurrency=CHILDREN))
    pids = [c.pid for c in run.children]
    try:
        assert all(pids), run.children
        assert client.runs.show(run.run_id).state == "running"
        assert client.capacity.snapshot(ctx.session_id, 1).used == 1
        for pid in pids:
            assert pid is not None
            os.kill(pid, 0)  # alive: the child, not its dead shim

        client.runs.stop(run.run_id)
        for pid in pids:
            assert pid is not None
            wait_gone(pid)
        done = client.runs.wait(run.run_id, timeout=30)
        assert done.state == "stopped", done
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        for pid in pids:
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_a_child_that_killed_its_shim_is_still_ended_at_its_deadline(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """The shim keeps the child's deadline; with the shim killed by its child the deadline
    was kept by nobody: a `--timeout-ms 1500` run ran its child to its own end (60 s here) and
    then failed "exit status is unknown". The supervisor ends what is left at the deadline
    now (TERM, then KILL after the grace): timed out, the slot freed."""
    client = start_node(state_dir=state_dir).client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("latekiller", "x", True, 1500))
    pid = run.children[0].pid
    assert pid is not None
    try:
        done = client.runs.wait(run.run_id, timeout=20)
        assert done.state == "failed" and done.children[0].state == "failed", done
        assert "timed out after 1500 ms" in done.error, done.error
        wait_gone(pid, timeout=5)
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_child_that_froze_its_shim_is_still_stopped(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """A child that SIGSTOPs its shim made itself unstoppable: the stop's SIGTERM waited in
    the frozen shim, the run stayed `running` ("still running after 30s") with its slot held,
    for good. A shim that has not ended a stopped tree by the grace (and a margin) is killed
    now, and what it leaves is killed as a dead shim's tree is: stopped, the slot freed."""
    client = start_node(state_dir=state_dir).client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("shimfreezer", "x", True, None))
    pid = run.children[0].pid
    assert pid is not None
    shim = psutil.Process(pid).parent()
    assert shim is not None
    try:
        wait_until(lambda: shim.status() == psutil.STATUS_STOPPED, what="the frozen shim")
        client.runs.stop(run.run_id)
        done = client.runs.wait(run.run_id, timeout=20)
        assert done.state == "stopped", done
        wait_gone(pid, timeout=5)
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with suppress(psutil.Error):
            shim.kill()


def _template_of(node: NodeProcess) -> psutil.Process:
    node_proc = psutil.Process(node.pid)
    for proc in node_proc.children(recursive=True):
        with suppress(psutil.Error):
            if TEMPLATE_MODULE in proc.cmdline():
                return proc
    raise AssertionError("no shim template under the node")


def _queued_bytes(pid: int) -> int:
    """Bytes waiting in the template's order pipe (FIONREAD on its stdin, read by nobody)."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, termios.FIONREAD, buf)
        return int.from_bytes(buf, "little")
    finally:
        os.close(fd)


def test_a_child_that_froze_its_shim_is_still_ended_at_its_deadline(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """The shim keeps the child's deadline; a child that froze its shim (SIGSTOP) ran past
    it for as long as it liked, its run `running` and its slot held (a child that then
    exited stayed a zombie under the frozen shim: the run never ended). A running child whose
    deadline and grace are over by a margin, with no end recorded by its shim, is timed out
    by the supervisor now: its shim is killed, and what it leaves with it."""
    client = start_node(state_dir=state_dir).client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("shimfreezer", "x", True, 1500))
    pid = run.children[0].pid
    assert pid is not None
    shim = psutil.Process(pid).parent()
    assert shim is not None
    try:
        done = client.runs.wait(run.run_id, timeout=20)
        assert done.state == "failed", done
        assert "timed out after 1500 ms" in done.error, done.error
        wait_gone(pid, timeout=5)
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with suppress(psutil.Error):
            shim.kill()


@contextlib.contextmanager
def _frozen(pid: int, thaw: bool = False) -> Iterator[None]:
    """`pid` frozen in a cgroup v2 cgroup of its own (cgroup.freeze: it runs no more, and
    is not *stopped*, which the node would see and replace); the cgroup goes afterwards, with
    `pid` killed, or (`thaw`) thawed and moved back where it was."""
    mount = next(
        line.split(" - ")[0].split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if " - cgroup2 " in line
    )
    own = next(
        x[3:] for x in Path("/proc/self/cgroup").read_text().splitlines() if x.startswith("0::")
    )
    group = Path(os.path.normpath(mount + own)) / f"sa-test-freeze.{os.getpid()}"
    was = next(
        x[3:] for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x.startswith("0::")
    )
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "cgroup.freeze").write_text("1")
        wait_until(lambda: "frozen 1" in (group / "cgroup.events").read_text(), what="the freeze")
        yield
    finally:
        if thaw:
            with suppress(OSError):
                (group / "cgroup.freeze").write_text("0")
                (Path(os.path.normpath(mount + was)) / "cgroup.procs").write_text(str(pid))
        with suppress(OSError):
            (group / "cgroup.kill").write_text("1")
        wait_until(
            lambda: "populated 0" in (group / "cgroup.events").read_text(), what="empty cgroup"
        )
        group.rmdir()


@needs_cgroups
def test_an_order_a_killed_shim_template_never_read_ends_the_child_not_started(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """A child can SIGKILL the shim template (its shim's parent) while its siblings' orders
    wait in the template's pipe: no shim ever took them, and the run waited for them for
    good (`running`, its launch unanswered). The template's announce pipe ends with it: an
    order it never announced forked nothing, so its child ends not-started, the launch is
    answered, and the next launch gets a new template."""
    node = start_node(state_dir=state_dir)
    client = node.client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    first = client.runs.launch(ctx.single("quick", "x", True, None))  # the template starts
    assert client.runs.wait(first.run_id, timeout=30).state == "complete"
    template = _template_of(node)
    answers: list[RunView] = []
    with _frozen(template.pid):  # it reads no order: the next one stays queued
        slow = node.client(timeout=30.0)
        launching = threading.Thread(
            target=lambda: answers.append(slow.runs.launch(ctx.single("quick", "x", True, None)))
        )
        launching.start()
        wait_until(lambda: _queued_bytes(template.pid) > 0, what="the order in the pipe")
        template.send_signal(signal.SIGKILL)  # dies with the order unread
        launching.join(timeout=40)
        assert not launching.is_alive() and answers, "the launch was never answered"
    run = client.runs.wait(answers[0].run_id, timeout=30)
    assert run.state == "failed", run
    assert run.children[0].proof_state == "not-started", run.children[0]
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    after = client.runs.launch(ctx.single("quick", "x", True, None))
    assert client.runs.wait(after.run_id, timeout=30).state == "complete"


def test_a_stopped_shim_template_is_replaced_and_launches_go_on(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """Any child can SIGSTOP the shim template (its shim's parent): it forked nothing more,
    and every later launch on the node, of every user, went unanswered ("did not answer
    runs.launch in time") and left a run `running` for good. A stopped template is killed
    (at once: shimtemplate.py) and replaced at the next order now."""
    node = start_node(state_dir=state_dir)
    client = node.client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    first = client.runs.launch(ctx.single("quick", "x", True, None))  # the template starts
    assert client.runs.wait(first.run_id, timeout=30).state == "complete"
    template = _template_of(node)
    template.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _stopped_or_ended(template), what="the frozen template")
        run = client.runs.launch(ctx.single("quick", "x", True, None))
        assert client.runs.wait(run.run_id, timeout=30).state == "complete"
        assert _template_of(node).pid != template.pid
    finally:
        with suppress(psutil.Error):
            template.send_signal(signal.SIGKILL)
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")


@needs_cgroups
def test_orders_queued_in_a_shim_template_a_child_stopped_are_answered_at_once(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """A stopped template was replaced only at the next order: an order already waiting in its
    pipe (a child SIGSTOPped the template, its shim's parent, just after a sibling's order was
    written) waited for that next order, and with none, for good (its launch unanswered, the
    run `running`). Orders that wait on a template that announces nothing are looked at after a
    second now: a stopped template is ended, and those orders end their children not-started.
    (The order is queued behind a cgroup freeze, the stop sent, then the freeze lifted.)"""
    node = start_node(state_dir=state_dir)
    client = node.client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    first = client.runs.launch(ctx.single("quick", "x", True, None))  # the template starts
    assert client.runs.wait(first.run_id, timeout=30).state == "complete"
    template = _template_of(node)
    answers: list[RunView] = []
    slow = node.client(timeout=30.0)
    launching = threading.Thread(
        target=lambda: answers.append(slow.runs.launch(ctx.single("quick", "x", True, None)))
    )
    try:
        with _frozen(template.pid, thaw=True):  # it reads no order: the next one stays queued
            launching.start()
            wait_until(lambda: _queued_bytes(template.pid) > 0, what="the order in the pipe")
            template.send_signal(signal.SIGSTOP)  # taken as the freeze is lifted, before a read
        launching.join(timeout=20)
        assert not launching.is_alive() and answers, "the launch was never answered"
        run = client.runs.wait(answers[0].run_id, timeout=30)
        assert run.state == "failed", run
        assert run.children[0].proof_state == "not-started", run.children[0]
        after = client.runs.launch(ctx.single("quick", "x", True, None))
        assert client.runs.wait(after.run_id, timeout=30).state == "complete"
    finally:
        with suppress(psutil.Error):
            template.send_signal(signal.SIGKILL)
        launching.join(timeout=40)


def test_a_child_that_froze_its_shim_before_its_first_report_is_answered_and_stopped(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """A child that SIGSTOPs its shim at once froze it before its `started` report: the
    launch was never answered (the client gave up after 40 s: "did not answer runs.launch in
    time"), `stop` said "still running after 30s", and the run stayed `running` for good (the
    child, once ended, a zombie under the frozen shim). An announced shim that has not
    reported after a second and is stopped is killed now, and its child is found as a dead
    shim's is: started (a real pid), held, and stopped by `stop`, the slot freed."""
    client = start_node(state_dir=state_dir).client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    run = client.runs.launch(ctx.single("earlyfreezer", "x", True, None))
    pid = run.children[0].pid
    try:
        assert pid is not None, run.children
        assert client.runs.show(run.run_id).state == "running"
        assert client.capacity.snapshot(ctx.session_id, 1).used == 1
        client.runs.stop(run.run_id)
        wait_gone(pid, timeout=10)
        done = client.runs.wait(run.run_id, timeout=30)
        assert done.state == "stopped", done
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        if pid is not None:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_shim_frozen_before_its_first_report_is_ended_by_the_node_that_adopts_it(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """The node died as its child's shim was forked (`shim_launched`), and the child froze its
    shim before the shim's first report. The restarted node knew that shim from its claim
    alone and watched it: the run stayed `running` for good and `stop` said "still running
    after 30s" (it signalled nobody). An adopted shim that never reported is ended too when
    it is found stopped, and its child is handled as a dead shim's: the run is stopped."""
    dying = start_node("--faults", state_dir=state_dir, kill_at="shim_launched")
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    with pytest.raises(SubagentsError):
        dying.client(timeout=5).runs.launch(ctx.single("earlyfreezer", "x", True, None))
    assert dying.wait_exited(10), "the node did not die at shim_launched"

    client = start_node(state_dir=state_dir).client(timeout=20.0)
    [run] = wait_until(lambda: [r for r in client.runs.list() if r.state == "running"])
    pid = wait_until(lambda: client.runs.show(run.run_id).children[0].pid, what="its pid")
    try:
        client.runs.stop(run.run_id)
        done = client.runs.wait(run.run_id, timeout=30)
        assert done.state == "stopped", done
        wait_gone(pid, timeout=10)
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stopped_or_ended(process: psutil.Process) -> bool:
    """`process` stopped, or ended (a zombie, or reaped): the node ends a stopped template."""
    try:
        return process.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _release(fifo: Path) -> None:
    """Let the child waiting on `fifo` go (its `read x < fifo` opened it: bounded wait)."""

    def opened() -> int | None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            return None

    fd = wait_until(opened, what="the child waiting on its fifo")
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)


#: A process the child left behind (a `setsid` daemon, waited for: the tree lives on) freezes
#: the shim, its parent once the child exited, and then exits. (TERM ignored: the TERM the
#: shim sends the child's group as the child exits may come before the `setsid`.)
_LEFT_BEHIND = (
    "trap '' TERM; setsid sh -c"
    " 'read x < {fifo}; read -r _ _ _ P _ < /proc/$$/stat; kill -STOP $P; exit 0' & exit 0"
)


@pytest.mark.parametrize(
    ("script", "leader_first"),
    [
        pytest.param("read x < {fifo}; kill -STOP $PPID; exit 0", False, id="the-child-itself"),
        pytest.param(_LEFT_BEHIND, True, id="a-process-it-left"),
    ],
)
def test_a_child_that_froze_its_shim_and_exited_ends_its_run_with_its_exit_status(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    hostile: Path,
    script: str,
    leader_first: bool,
) -> None:
    """A child that SIGSTOPped its shim after the shim's first report and then exited stayed a
    zombie under the frozen shim (as did a process it left behind): no exit record, no report,
    and a run with no deadline stayed `running`, its slot held, for good. The shim template,
    every shim's parent, is told of the stop now and continues the shim, which reaps the tree
    and reports its real end: complete, exit 0, the slot freed (the proof is still the
    parent's: SPEC §0.4, R-RUN-5)."""
    client = start_node(state_dir=state_dir).client(timeout=20.0)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    fifo = hostile.parent / "go.fifo"
    os.mkfifo(fifo)
    run = client.runs.launch(ctx.single("sh", script.format(fifo=fifo), True, None))
    pid = run.children[0].pid  # the launch is answered once the shim reported the child
    assert pid is not None
    claim = json.loads((Path(run.run_dir) / "child-0" / "shim.json").read_text())
    shim = psutil.Process(int(claim["shim_pid"]))
    try:
        if leader_first:
            wait_gone(pid)  # what it left is the shim's child now
        _release(fifo)
        done = client.runs.wait(run.run_id, timeout=20)
        assert done.state == "complete", done
        assert done.children[0].exit_code == 0, done.children[0]
        assert done.children[0].proof_state == "observed", done.children[0]
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(psutil.Error):
            shim.kill()


def test_a_shim_frozen_where_nothing_continued_it_is_continued_by_the_node_that_adopts_it(
    start_node: Callable[..., NodeProcess], state_dir: Path, hostile: Path
) -> None:
    """The node stopped (its template with it, so no parent was left to continue the shim);
    then the child stopped its shim and exited: a zombie under a stopped shim, its run
    `running`, and the restarted node only watched that shim, so the run stayed `running` for
    good. The node that adopts a stopped shim continues it: it reaps the child and reports its
    real end (complete, exit 0). (A running node continues such a shim itself:
    test_runs_orphan_shims.py.)"""
    first = start_node(state_dir=state_dir)
    ctx = launch_context(hostile, max_active_async_runs_per_session=1)
    fifo = hostile.parent / "go.fifo"
    os.mkfifo(fifo)
    script = f"read x < {fifo}; kill -STOP $PPID; exit 0"
    run = first.client(timeout=20.0).runs.launch(ctx.single("sh", script, True, None))
    pid = run.children[0].pid
    assert pid is not None
    shim = psutil.Process(pid).parent()
    assert shim is not None
    try:
        first.stop()  # its template exits with it; the shim and its child live on
        _release(fifo)
        wait_gone(pid)  # a zombie under its stopped shim
        # Its SIGSTOP is taken when the shim is next scheduled: on a loaded host, after the
        # child is seen gone (the shim showed `running` here in CI).
        wait_until(lambda: shim.status() == psutil.STATUS_STOPPED, what="the stopped shim")
        client = start_node(state_dir=state_dir).client(timeout=20.0)
        done = client.runs.wait(run.run_id, timeout=20)
        assert done.state == "complete", done
        assert done.children[0].exit_code == 0, done.children[0]
        wait_until(lambda: client.capacity.snapshot(ctx.session_id, 1).used == 0, what="release")
    finally:
        with suppress(psutil.Error):
            shim.kill()
