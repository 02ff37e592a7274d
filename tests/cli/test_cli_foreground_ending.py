"""A foreground `run` ended while it follows its run: two Ctrl-C's at once, a terminal that is
closed, a CI job's `timeout` that signals the whole process group (runs.md faults 1-3).

Whatever the signals and whatever the terminal does, the command sends the stop for the run it
launched before it writes anything, and exits 128 + the first signal: 130, 129 or 143. The
terminal's writes that block (a full pipe) or fail (EIO once it hung up) come after the stop;
a signal meant for the command's process group is not its embedded node's owners'. Real
processes, pipes and pseudo-terminals; every wait is on output, a pidfd or a reply, with a
deadline.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pty
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.cli.ending import Ended, EndingSignals
from tests.support.foreground import StderrLines
from tests.support.nodes import CLI, REPO, NodeProcess, node_files_left
from tests.support.runs import EXAMPLE_AGENTS, WAIT_S, wait_gone

RUN_STARTED = r"run ([0-9a-f]{12}) started"


def _run_argv(state_dir: Path, task: str) -> list[str]:
    return [
        *CLI,
        *("--state-dir", str(state_dir), "run", "--agents-dir", str(EXAMPLE_AGENTS)),
        *("sleeper", task),
    ]


def test_a_second_signal_while_the_first_unwinds_waits_for_the_stop() -> None:
    """The signal acted on raised, and a second one that came before the follower's handler
    had sent the stop (while the exception unwound, or a terminal write blocked) raised again
    and escaped it: the run went on and the command said no run was launched. Now every signal
    after the one acted on is only counted until the follower asks for them again."""
    with EndingSignals() as signals:
        with signals.holding():
            pass  # the launch
        with pytest.raises(KeyboardInterrupt), signals.raising():  # the follow
            signal.raise_signal(signal.SIGINT)  # its handler runs before this returns
        try:  # the second Ctrl-C, and a TERM, before the stop is sent
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
        except (KeyboardInterrupt, Ended):
            pytest.fail("a signal after the first escaped the follower before its stop")
        assert (signals.count, signals.pending) == (3, signal.SIGINT)
        # The stop sent: from here a second signal ends the command.
        with pytest.raises(KeyboardInterrupt), signals.raising(acted_on=1):
            pass


def _fill_stderr(pid: int) -> None:
    """Fill the pipe that is the stderr of process `pid` (through a descriptor of the test's
    own, non-blocking): the process's next write there blocks until the pipe is read."""
    fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK)
    try:
        chunk = b"x" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except BlockingIOError:
                if len(chunk) == 1:
                    return
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)


def test_two_ctrl_cs_while_the_terminal_write_blocks_still_stop_the_run(
    node: NodeProcess,
) -> None:
    """runs.md fault 1: the handler wrote `stopping run …` before it sent the stop; with that
    write blocked (a full pipe here; a slow or paused terminal, or the live table's redraw),
    no stop went out, and a second SIGINT (a double Ctrl-C, a wrapper forwarding SIGINT to a
    group that got it too) escaped the handler: `interrupted: no run was launched`, exit 130,
    and the run went on on the detached node. Now the stop goes first."""
    client = node.client()
    run_id = ""
    proc = subprocess.Popen(
        _run_argv(node.state_dir, "seconds=60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    try:
        lines = StderrLines(proc)
        started = lines.wait_for(RUN_STARTED)
        run_id = re.search(RUN_STARTED, started).group(1)  # type: ignore[union-attr]
        lines.wait_for(r"started .* \(sleeper\) pid \d+")  # followed, its child running
        _fill_stderr(proc.pid)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        # The pipe stays full: the stop must not wait for the command's stderr.
        final = client.runs.wait(run_id, timeout=WAIT_S)
        assert final.state == "stopped"
        said = re.sub("x{8,}", "", "\n".join(lines.to_end()))  # the test's filling
        out, _ = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 130, (out, said)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)
        if run_id:
            client.runs.stop(run_id)  # a failed check must not leave the sleeper behind
    assert "no run was launched" not in said, said
    assert f"run {run_id}" in said, said


def _pty_command(argv: list[str]) -> tuple[int, int]:
    """`argv` on a pseudo-terminal of its own, which it leads (a terminal's shell's command):
    (its pid, the terminal's master)."""
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execve(argv[0], argv, {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"})
    return pid, master


def _read_until(master: int, pattern: str) -> str:
    """What the command wrote on its terminal, up to the first match of `pattern`."""
    said = b""
    deadline = time.monotonic() + WAIT_S
    while not re.search(pattern, said.decode(errors="replace")):
        ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"nothing matching {pattern!r} in {WAIT_S:g}s: {said[-2000:]!r}"
        try:
            said += os.read(master, 65536)
        except OSError as err:  # EIO: the command closed its side
            assert err.errno == errno.EIO
            break
    return said.decode(errors="replace")


def _pids_from(fifo: Path) -> list[int]:
    """The pids the sleeper wrote into `fifo` once it ran (its own, its grandchild's)."""
    ready = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # no writer yet: select waits for one
    said = b""
    try:
        while not said.endswith(b"\n"):
            assert select.select([ready], [], [], WAIT_S)[0], "the sleeper never started"
            chunk = os.read(ready, 4096)
            assert chunk, f"the sleeper closed its FIFO after {said!r}"
            said += chunk
    finally:
        os.close(ready)
    return [int(p) for p in said.split()]


def _exit_code(pid: int) -> int:
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], WAIT_S)
    finally:
        os.close(fd)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert ready, f"the command still ran {WAIT_S:g}s after its terminal closed"
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("where", ["detached node", "embedded node"])
def test_closing_the_terminal_stops_the_run_and_exits_129(
    start_node: Callable[..., NodeProcess], state_dir: Path, where: str
) -> None:
    """runs.md fault 2: the hangup ended the follow, whose handler first took the live table
    down, a redraw on the closed terminal: EIO, before the stop was sent. The command exited 1
    with a traceback (its error line failed on the terminal too) and, on a detached node, the
    run went on. Now the stop goes first, a write that fails on the closed terminal is
    dropped, and the command exits 129 as documented."""
    fifo = state_dir.parent / f"{state_dir.name}.ready"
    os.mkfifo(fifo)
    node = start_node(state_dir=state_dir) if where == "detached node" else None
    pid, master = _pty_command(_run_argv(state_dir, f"seconds=60 grandchild=1 ready={fifo}"))
    pids: list[int] = []
    try:
        pids = _pids_from(fifo)
        shown = _read_until(master, r"run [0-9a-f]{12} · sleeper · running")
        run_id = re.findall(r"run ([0-9a-f]{12}) · sleeper", shown)[-1]
        os.close(master)  # the terminal closes: SIGHUP, and EIO on every write to it
        master = -1
        assert _exit_code(pid) == 129
        for child in pids:
            wait_gone(child)
        if node is not None:
            final = node.client().runs.wait(run_id, timeout=WAIT_S)
            assert final.state == "stopped"
        else:
            assert node_files_left(state_dir) == []
    finally:
        if master >= 0:
            os.close(master)
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for child in pids:  # a failed check must not leave sleepers behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        fifo.unlink()


def test_a_sigterm_to_the_commands_process_group_stops_its_run_on_the_embedded_node(
    state_dir: Path,
) -> None:
    """runs.md fault 3: `timeout N subagents-node run …` (a CI job's timeout) signals the
    command's whole process group, and the owners of the node the command embeds were in it:
    they ended on the SIGTERM at once, the command's stop found no run supervisor (`owner …
    exited; restarting it`, `error: supervisor ended with runs.stop in flight`) and it exited 1,
    not 143. The owners now have a process group of their own; the node stops them itself."""
    proc = subprocess.Popen(
        _run_argv(state_dir, "seconds=60 grandchild=1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        start_new_session=True,  # a group of its own, as `timeout` gives it
    )
    try:
        lines = StderrLines(proc)
        lines.wait_for(r"started .* \(sleeper\) pid \d+")
        os.killpg(proc.pid, signal.SIGTERM)
        said = lines.to_end()
        out, _ = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 143, (out, said)
    assert re.search(r"run [0-9a-f]{12} stopped", out), out
    assert not [line for line in said if "owner" in line or "error" in line], said
    assert node_files_left(state_dir) == []


def test_a_foreground_run_whose_reader_goes_away_stops_its_run_and_exits_141(
    node: NodeProcess, tmp_path: Path
) -> None:
    """`run … 2>&1 | head -1`: the next progress line failed with EPIPE and the command exited
    141 at once, leaving its foreground run going on, unfollowed, on the detached node (a
    script's next step then started before it ended). Now the reader's going ends the command
    as a hangup does: its run is stopped, then exit 141 (128 + SIGPIPE)."""
    tasks = tmp_path / "tasks.toml"
    tasks.write_text(
        '[[tasks]]\nagent = "sleeper"\ntask = "seconds=60"\n'
        '[[tasks]]\nagent = "sleeper"\ntask = "seconds=0.5"\n'
    )
    argv = [
        *CLI,
        *("--state-dir", str(node.state_dir), "run", "--agents-dir", str(EXAMPLE_AGENTS)),
        *("--parallel", str(tasks)),
    ]
    client = node.client()
    run_id = ""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    try:
        lines = StderrLines(proc, stdout=True)
        started = lines.wait_for(RUN_STARTED)
        run_id = re.search(RUN_STARTED, started).group(1)  # type: ignore[union-attr]
        assert proc.stdout is not None
        # `head -1` has its line and goes; the short child's end is the next line written.
        proc.stdout.close()
        final = client.runs.wait(run_id, timeout=WAIT_S)
        assert final.state == "stopped", final
        assert proc.wait(timeout=WAIT_S) == 141
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
        if run_id:
            client.runs.stop(run_id)  # a failed check must not leave the sleeper behind


@pytest.mark.parametrize("embedded", [False, True], ids=["detached node", "embedded node"])
def test_a_foreground_run_whose_stdout_reader_goes_away_is_stopped_at_once_not_at_its_end(
    start_node: Callable[..., NodeProcess], state_dir: Path, embedded: bool
) -> None:
    """`run … | head`: a foreground run writes to stdout only its summary, at its end, so the
    reader's going was seen only then: a 60 s run ran its 60 s for nobody, then exited 141. The
    command now watches its stdout (POLLERR on a pipe whose reader is gone) and stops the run
    at once, as for a hangup, then exits 141; nothing is written after."""
    node = None if embedded else start_node(state_dir=state_dir)
    run_id = ""
    proc = subprocess.Popen(
        _run_argv(state_dir, "seconds=60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    try:
        said = StderrLines(proc)
        run_id = re.search(RUN_STARTED, said.wait_for(RUN_STARTED)).group(1)  # type: ignore[union-attr]
        said.wait_for(r"started single \(sleeper\) pid")
        assert proc.stdout is not None
        proc.stdout.close()  # the reader goes; the command writes nothing to stdout till the end
        assert proc.wait(timeout=15) == 141, said.to_end()
        lines = said.to_end()
        assert any(re.search(rf"stopping run {run_id}", line) for line in lines), lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
        assert proc.stderr is not None
        proc.stderr.close()
        if node is not None and run_id:
            node.client().runs.stop(run_id)  # a failed check must not leave the sleeper behind
    if node is not None:
        final = node.client().runs.wait(run_id, timeout=WAIT_S)
        assert final.state == "stopped", final
    else:  # its embedded node stopped with it, its run's tree first
        assert node_files_left(state_dir) == []
