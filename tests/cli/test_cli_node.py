"""The `subagents-node` command line for the node itself (issue 2, item 7).

start/stop/ping/status with and without --json; user errors are one line on stderr with a
non-zero exit code and never a traceback: 3 node not running, 2 bad address, 4 timeout;
`--help` works for every command. Start and stop run as real processes; the query commands run
both ways (real subprocess and click's CliRunner) against real nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import zmq
from click.testing import Result

from subagents_node.cli import cli
from subagents_node.client.client import Client
from subagents_node.client.paths import read_pid_file
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.errors import NodeNotRunning
from subagents_node.node.daemon import wait_exited
from tests.support.nodes import (
    CLI,
    REPO,
    NodeProcess,
    new_state_dir,
    node_files_left,
    run_cli,
    running_node,
)


@pytest.fixture(scope="module")
def served() -> Iterator[NodeProcess]:
    with running_node() as node:
        yield node


def assert_one_line_error(result: Result, exit_code: int, *fragments: str) -> None:
    assert result.exit_code == exit_code, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    if lines[0].startswith("{"):  # --json: the error object, on one line
        lines = [json.loads(lines[0])["error"]["message"]]
    else:
        assert lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


# -- real processes -------------------------------------------------------------------------------


def test_start_detach_ping_status_stop_as_real_processes(state_dir: Path) -> None:
    started = run_cli("start", "--detach", state_dir=state_dir)
    assert started.returncode == 0, started.stderr
    match = re.fullmatch(r"node started \(pid (\d+)\) at (ipc://\S+)\n", started.stdout)
    assert match, started.stdout
    pid, address = int(match[1]), match[2]
    assert address == f"ipc://{state_dir.resolve()}/node.sock"
    proc = psutil.Process(pid)
    try:
        ping = run_cli("ping", state_dir=state_dir)
        assert ping.returncode == 0
        assert re.fullmatch(rf"pong from node-\w+ \(pid {pid}, v[\d.]+\)\n", ping.stdout)

        pong = json.loads(run_cli("ping", "--json", state_dir=state_dir).stdout)
        assert set(pong) == {"node_id", "version", "pid", "uptime_s"}
        assert pong["pid"] == pid

        status = run_cli("status", state_dir=state_dir)
        assert status.returncode == 0
        assert f"pid {pid}" in status.stdout
        assert f"endpoints: {address}" in status.stdout
        assert re.search(r"capacity\s+running\s+pid \d+\s+restarts 0", status.stdout)

        listing = json.loads(run_cli("status", "--json", state_dir=state_dir).stdout)
        assert listing["endpoints"] == [address]
        assert {"capacity", "fanout", "session"} <= {a["name"] for a in listing["actors"]}
    finally:
        stopped = run_cli("stop", state_dir=state_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"node stopped (pid {pid})\n"
    assert wait_exited(proc, 5.0)
    assert read_pid_file(state_dir) is None
    assert not (state_dir / "node.sock").exists()

    after = run_cli("ping", state_dir=state_dir)
    assert after.returncode == 3
    assert after.stderr.startswith("error: no node is running at ")
    assert run_cli("stop", state_dir=state_dir).returncode == 3


def _read_until(master: int, marker: bytes) -> bytes:
    """What the node wrote to its terminal, up to `marker` (or its end: EOF, or EIO once it
    exited)."""
    said = b""
    while marker not in said:
        ready, _, _ = select.select([master], [], [], 20.0)
        assert ready, f"the node said nothing more in 20 s: {said!r}"
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not chunk:
            break
        said += chunk
    return said


@contextlib.contextmanager
def _foreground_node_in_a_terminal(state_dir: Path) -> Iterator[tuple[int, int]]:
    """`start` in a terminal of its own (a pty) that it leads: (its pid, the pty's master)."""
    pid, master = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [*CLI, "--state-dir", str(state_dir), "start"])
    try:
        yield pid, master
    finally:
        with contextlib.suppress(OSError):
            os.close(master)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.mark.parametrize("hangup", ["terminal closed", "job hung up"])
def test_a_foreground_node_whose_terminal_hangs_up_stops_as_stop_does(
    state_dir: Path, hangup: str
) -> None:
    """`start` in a terminal that is then closed: the hangup killed the node at once (SIGHUP's
    default), its pid file and sockets left behind and its owners killed with it; and when
    the shell passed the hangup on to the whole job, each owner died of it too. Now the node
    stops as `stop` (or SIGTERM) does: its owners stopped in order, none restarted, nothing
    left in the state dir, exit 0."""
    with _foreground_node_in_a_terminal(state_dir) as (pid, master):
        _read_until(master, b"serving")
        node = psutil.Process(pid)
        owners = node.children()
        assert len(owners) == 4
        if hangup == "terminal closed":
            os.close(master)
        else:  # what a shell does with its jobs when its own terminal hangs up
            os.killpg(pid, signal.SIGHUP)
            said = _read_until(master, b"\0").decode(errors="replace")
            assert "restarting" not in said, said
        assert node.wait(timeout=20) == 0
        assert not psutil.wait_procs(owners, timeout=5)[1], "an owner outlived the node"
        assert node_files_left(state_dir) == []


@pytest.mark.parametrize("ending", ["SIGHUP", "SIGTERM", "SIGINT", "terminal closed"])
def test_a_node_signalled_while_it_starts_stops_as_stop_does(state_dir: Path, ending: str) -> None:
    """A hangup, TERM or Ctrl-C that lands while `start` is still starting (here: once it has
    said which containment its children get, before any owner is forked): the handlers were
    set only after `start` returned, so the signal's default killed the node half started, its
    owners and sockets left behind. Now it asks for the stop, which comes once `start` is done.
    With its terminal closed, the "serving" line it then writes there failed and ended the
    process (exit 1) before its node was stopped: that write no longer counts."""
    with _foreground_node_in_a_terminal(state_dir) as (pid, master):
        _read_until(master, b"containment")
        said = ""
        if ending == "terminal closed":
            os.close(master)
        else:
            os.kill(pid, signal.Signals[ending])
            said = _read_until(master, b"\0").decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, said
        assert "restarting" not in said, said
        assert node_files_left(state_dir) == []


def _blocked(task: Path) -> set[signal.Signals] | None:
    """The signals a thread (/proc/PID/task/TID) blocks, of those that stop a node; None for
    one that ended, or one of libzmq's (which block every signal)."""
    try:
        if (task / "comm").read_text().startswith("ZMQbg"):
            return None
        status = (task / "status").read_text()
    except FileNotFoundError:
        return None
    mask = next(
        int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigBlk:")
    )
    stopping = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    return {s for s in stopping if mask >> (s - 1) & 1}


def test_only_the_main_thread_of_a_started_node_takes_the_signals_that_stop_it(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A hangup of `start`'s terminal (or a TERM) that the kernel gave to one of the node's
    other threads ran its handler only once the main thread ran Python again: never, while it
    waited for the stop, so the node went on serving with its terminal gone (1 run in ~8 of
    the hangup test above). Every other thread of the node now blocks them (as libzmq's own
    threads do; node/signalmask.py), so each goes to the main thread; an owner's threads, and
    the processes it starts, block none."""
    node = start_node()
    tasks = sorted(Path(f"/proc/{node.pid}/task").iterdir(), key=lambda t: int(t.name))
    main, others = tasks[0], tasks[1:]
    assert int(main.name) == node.pid
    assert _blocked(main) == set()
    assert others, "a started node runs threads of its own"
    assert all(
        _blocked(t) in (None, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}) for t in others
    )
    for owner in psutil.Process(node.pid).children():
        for task in Path(f"/proc/{owner.pid}/task").iterdir():
            assert _blocked(task) in (None, set()), (owner.pid, task.name)


def test_stop_with_an_address_stops_that_node_and_never_the_state_dirs(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    here, there = start_node(), start_node()
    stopped = run_cli("--address", there.address, "stop", state_dir=here.state_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"node stopped (pid {there.pid})\n"
    assert not psutil.pid_exists(there.pid) or psutil.Process(there.pid).status() == "zombie"
    assert read_pid_file(there.state_dir) is None
    assert here.client().ping().pid == here.pid
    # A typo in the address stops nothing: no node answers there.
    typo = run_cli("--address", f"ipc://{tmp_path}/typo.sock", "stop", state_dir=here.state_dir)
    assert typo.returncode == 3, typo.stderr
    assert here.client().ping().pid == here.pid


@pytest.mark.parametrize("where", ["directory", "/dev/zero", "file"])
def test_an_ipc_address_that_is_no_socket_is_no_node_at_once(tmp_path: Path, where: str) -> None:
    """Not a wait for the whole --timeout followed by 'is it running?'."""
    path = {"directory": str(tmp_path), "/dev/zero": "/dev/zero", "file": str(tmp_path / "f")}
    (tmp_path / "f").write_text("x")
    done = run_cli("--address", f"ipc://{path[where]}", "--timeout", "30", "ping", timeout=20)
    assert done.returncode == 3
    assert "is not a socket" in done.stderr


def test_a_detached_node_lifts_its_soft_descriptor_limit(state_dir: Path) -> None:
    """A pidfd per live shim: 1,000 children must not meet a login shell's 1024 (or less)."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard descriptor limit here is {hard}: nothing to lift to")

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    command = [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir)]
    started = subprocess.run(
        [*command, "start", "--detach"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=low_soft_limit,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    record = read_pid_file(state_dir)
    assert record is not None
    try:
        limits = Path(f"/proc/{record['pid']}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert int(line.split()[3]) >= 4096, line
    finally:
        run_cli("stop", state_dir=state_dir)


def test_starts_racing_for_one_state_dir_leave_exactly_one_node(state_dir: Path) -> None:
    """The pid file is written only once a node serves: two starts at once both passed its
    check, and two nodes (with two sets of owners) served one state dir."""
    command = [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir)]
    racers = [
        subprocess.Popen(
            [*command, "start", "--detach"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        outcomes.append((racer.returncode, out, err))
    try:
        started = [o for o in outcomes if o[0] == 0]
        assert len(started) == 1, outcomes
        for code, _, err in outcomes:
            if code != 0:
                assert "Traceback" not in err
                assert "already serves" in err or "another node is starting" in err, err
        record = read_pid_file(state_dir)
        assert record is not None and f"(pid {record['pid']})" in started[0][1]
        forked = {  # nodes and the owners each node forks share the command line
            p.pid: p.ppid()
            for p in psutil.process_iter(["cmdline"])
            if "start" in (p.info["cmdline"] or []) and str(state_dir) in (p.info["cmdline"] or [])
        }
        nodes = [pid for pid, parent in forked.items() if parent not in forked]
        assert nodes == [record["pid"]], forked
    finally:
        run_cli("stop", state_dir=state_dir)


RACERS = 12


@pytest.mark.slow
def test_background_runs_launched_at_once_with_no_node_all_use_the_one_node_that_won(
    state_dir: Path,
) -> None:
    """Each `run --async` with no node running starts one; the kernel lets one claim the
    state dir. The others used to fail with `node_error` (\"already serves\"); they wait for
    the winner to serve and launch there."""
    command = [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir)]
    agents = str(REPO / "examples" / "agents")
    launch = ["run", "--async", "--json", "--agents-dir", agents, "sleeper", "seconds=0"]
    racers = [
        subprocess.Popen(
            [*command, *launch], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(RACERS)
    ]
    try:
        outcomes = [(*r.communicate(timeout=90), r.returncode) for r in racers]
        assert all(code == 0 for _, _, code in outcomes), outcomes
        runs = {json.loads(out)["run_id"] for out, _, _ in outcomes}
        assert len(runs) == RACERS
        started = [err for _, err, _ in outcomes if "started a node" in err]
        assert len(started) == 1, outcomes
    finally:
        run_cli("stop", state_dir=state_dir)


def test_a_foreground_runs_embedded_node_serves_the_configured_actor_settings(
    state_dir: Path, tmp_path: Path
) -> None:
    """docs/configuration.md: a node a foreground `run` embeds (no node running) gets the
    actor settings of the configuration the command loaded, as a started node does: here its
    child log is cut at `SUBAGENTS_CHILD_LOG_MAX_BYTES`, not the built-in 64 MiB."""
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "loud.md").write_text(
        "---\nname: loud\ndescription: prints 300 KB\ntask_delivery: stdin\n"
        'command: ["{python}", "-c", "print((\'x\' * 99 + \'\\\\n\') * 3000)"]\n---\n',
        encoding="utf-8",
    )
    env = {**os.environ, "SUBAGENTS_CHILD_LOG_MAX_BYTES": str(64 << 10)}
    done = run_cli(
        "run", "--json", "--agents-dir", str(agents), "loud", "x", state_dir=state_dir, env=env
    )
    assert done.returncode == 0, done.stderr
    log = Path(json.loads(done.stdout)["children"][0]["stdout_path"])
    assert log.stat().st_size <= 64 << 10
    assert f"were cut here (child_log_max_bytes = {64 << 10})" in log.read_text(encoding="utf-8")


def test_console_script_help_and_version_work_as_a_real_process() -> None:
    helped = run_cli("--help")
    assert helped.returncode == 0
    for command in ("start", "stop", "ping", "status"):
        assert command in helped.stdout
    version = run_cli("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("subagents-node, version ")


# -- the query commands in-process ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["state-dir", "address", "env"])
def test_ping_and_status_find_the_node_by_state_dir_address_or_environment(
    how: str,
    served: NodeProcess,
    invoke: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if how == "state-dir":
        prefix = ["--state-dir", str(served.state_dir)]
    elif how == "address":
        prefix = ["--address", served.address]
    else:
        monkeypatch.setenv("SUBAGENTS_NODE", served.address)
        prefix = []
    ping = invoke(*prefix, "ping")
    assert ping.exit_code == 0
    assert f"(pid {served.pid}," in ping.stdout
    status = json.loads(invoke(*prefix, "status", "--json").stdout)
    assert status["pid"] == served.pid
    assert status["state_dir"] == str(served.state_dir.resolve())


def test_json_output_is_the_result_model_and_nothing_else(
    served: NodeProcess, invoke: Callable[..., Result]
) -> None:
    result = invoke("--address", served.address, "status", "--json")
    assert result.exit_code == 0
    status = json.loads(result.stdout)
    assert set(status) == {
        "node_id",
        "version",
        "pid",
        "uptime_s",
        "state_dir",
        "endpoints",
        "actors",
        "containment",
        "cluster",
        "tcp",
    }
    assert set(status["containment"]) == {"mode", "path", "why"}
    assert status["tcp"] == []  # a node on ipc alone has no tcp listener
    for actor in status["actors"]:
        assert set(actor) == {
            "name",
            "mailbox",
            "mailbox_limit",
            "restarts",
            "state",
            "pid",
            "reason",
            "quarantined",
        }


# -- exit codes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["ping"], ["ping", "--json"], ["status"], ["stop"]])
def test_node_not_running_exits_3_with_one_line(
    command: list[str], state_dir: Path, invoke: Callable[..., Result]
) -> None:
    result = invoke("--state-dir", str(state_dir), *command)
    assert_one_line_error(result, 3, str(state_dir))


def test_a_state_dir_given_on_the_command_line_beats_subagents_node(
    start_node: Callable[..., NodeProcess],
) -> None:
    """$SUBAGENTS_NODE (set for every agent child) won over an explicit --state-dir: in a
    child, `subagents-node --state-dir X stop` stopped the parent's node and left X's running
    (docs/api.md: a state dir given as --state-dir comes before $SUBAGENTS_NODE)."""
    inherited, named = start_node(), start_node()
    env = {**os.environ, "SUBAGENTS_NODE": inherited.address}
    ping = run_cli("ping", state_dir=named.state_dir, env=env)
    assert ping.returncode == 0 and f"(pid {named.pid}," in ping.stdout, ping.stdout
    stopped = run_cli("stop", state_dir=named.state_dir, env=env)
    assert stopped.stdout == f"node stopped (pid {named.pid})\n", stopped.stdout
    assert run_cli("ping", env=env).returncode == 0  # the inherited node still serves
    assert read_pid_file(named.state_dir) is None


def test_a_launch_never_answered_says_it_may_have_been_admitted(node: NodeProcess) -> None:
    """A launch whose answer did not come in --timeout (sent again under its launch id, and
    again unanswered) ended with "did not answer runs.launch in time (is it running?)": the
    user launched it again, while the first run, admitted all the same, went on unseen."""
    agents = str(REPO / "examples" / "agents")
    try:
        for mode in ("--async", "--foreground"):
            done = run_cli(
                "--timeout", "0.001", "run", mode, "--agents-dir", agents, "sleeper", "seconds=60",
                state_dir=node.state_dir,
            )  # fmt: skip
            assert done.returncode == 4, done.stdout
            assert done.stderr.startswith("error: the node at "), done.stderr
            assert done.stderr.endswith(
                "its outcome is unknown (it may have been applied): look at what it would have "
                "changed (`subagents-node runs`, `subagents-node show RUN`) before sending it "
                "again\n"
            ), done.stderr
    finally:
        for run in node.client().runs.list(active_only=True):
            run_cli("stop", run.run_id, state_dir=node.state_dir)


def test_stopping_the_node_with_json_prints_json(node: NodeProcess) -> None:
    """`stop --json` (the node) printed the text line "node stopped (pid N)": `--help` says
    --json prints machine-readable JSON, and a script parsing it failed on a stop that worked."""
    pid = read_pid_file(node.state_dir)
    assert pid is not None
    stopped = run_cli("stop", "--json", state_dir=node.state_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout) == {"state": "stopped", "pid": pid["pid"]}
    assert read_pid_file(node.state_dir) is None


@pytest.mark.parametrize(
    "address", ["localhost:7700", "tcp://no-port", "tcp://:7700", "ipc://", "http://x:1"]
)
def test_bad_address_exits_2_with_one_line(address: str, invoke: Callable[..., Result]) -> None:
    result = invoke("--address", address, "ping")
    assert_one_line_error(result, 2, "bad node address", repr(address))


@pytest.mark.parametrize(
    "args", [["show", "a" * 100_000], ["--timeout", "9" * 100_000, "ping"], ["show", "é" * 500]]
)
def test_a_huge_bad_value_is_shown_cut_short_in_its_one_line_error(
    args: list[str], invoke: Callable[..., Result]
) -> None:
    result = invoke(*args, "--json")
    assert_one_line_error(result, 2, "characters)")
    assert len(result.stderr) < 1000, "the error names the value, it does not repeat it"


@pytest.mark.parametrize("path", ["/tmp/" + "x" * 150, "/tmp/" + "x" * 100_000])
def test_an_ipc_address_too_long_for_any_socket_is_a_bad_address(
    path: str, invoke: Callable[..., Result]
) -> None:
    """It was "no node is running ... (socket does not exist)" (exit 3) or, past 255 bytes,
    "File name too long" (exit 1): no socket can have such a path, a usage error (exit 2)."""
    result = invoke("--address", f"ipc://{path}", "ping")
    assert_one_line_error(result, 2, "bad node address", "an ipc socket path is at most 107")


@pytest.mark.parametrize(
    "args",
    [
        ["--timeout", "\u0663", "ping"],
        ["--timeout", "1_0", "ping"],
        ["runs", "--limit", "1_0"],
        ["capacity", "--limit", "\u0661\u0660"],
        ["run", "--timeout-ms", "\u0663", "echo", "x"],
        ["workflow", "--timeout-ms", "1_000", "examples/workflows/scan_and_summarize.py"],
        ["grant", "\u0663", "--session", "s"],
    ],
    ids=lambda args: " ".join(args),
)
def test_a_number_option_is_ascii_digits_as_every_number_variable(
    args: list[str], state_dir: Path, invoke: Callable[..., Result]
) -> None:
    """int() and float() took other scripts' digits and "1_000": `--timeout-ms ٣` was a 3 ms
    deadline, `--timeout ٣` three seconds, where SUBAGENTS_TIMEOUT_MS=٣ is refused."""
    result = invoke("--state-dir", str(state_dir), *args)
    assert_one_line_error(result, 2, "Invalid value for")
    assert "ASCII digits" in result.stderr or "is not a number of seconds" in result.stderr
    assert list(state_dir.iterdir()) == []


def test_state_dir_too_long_for_an_ipc_socket_exits_2(invoke: Callable[..., Result]) -> None:
    too_long = "/tmp/" + "d" * 120
    result = invoke("--state-dir", too_long, "status")
    assert_one_line_error(result, 2, "longer than 107 bytes")


@pytest.mark.parametrize("size", [94, 96, 97])
def test_a_state_dir_whose_owner_sockets_do_not_fit_is_refused_before_any_start(
    size: int, tmp_path: Path
) -> None:
    """node.sock fitted in 107 bytes but capacity.sock (4 bytes longer), fanout.sock and
    session.sock did not: `start --detach` said "node started" and those owners crash-looped
    ("ipc path ... is longer than 107 characters") and stayed failed; every launch failed."""
    state_dir = Path("/tmp") / ("d" * (size - len("/tmp/")))
    assert len(str(state_dir / "node.sock")) <= 107 < len(str(state_dir / "capacity.sock"))
    try:
        started = run_cli("start", "--detach", state_dir=state_dir)
        assert started.returncode == 2, started.stdout
        assert started.stderr == (
            f"error: socket path {state_dir}/capacity.sock is longer than 107 bytes; "
            "choose a shorter state dir (--state-dir or $SUBAGENTS_STATE_DIR)\n"
        )
        assert not state_dir.exists()
    finally:
        if (state_dir / "node.pid").exists():  # the fault: a node started; stop it
            run_cli("stop", state_dir=state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_the_longest_state_dir_that_fits_serves_with_every_owner(
    start_node: Callable[..., NodeProcess],
) -> None:
    state_dir = Path("/tmp") / ("e" * (93 - len("/tmp/")))  # capacity.sock: 107 bytes
    shutil.rmtree(state_dir, ignore_errors=True)
    node = start_node(state_dir=state_dir)
    try:
        status = json.loads(run_cli("status", "--json", state_dir=node.state_dir).stdout)
        assert {a["name"]: a["state"] for a in status["actors"]}.keys() >= {"capacity", "session"}
        assert all(a["state"] == "running" for a in status["actors"])
    finally:
        run_cli("stop", state_dir=state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.mark.parametrize("name", ["new\nline", "semi;colon"], ids=["newline", "semicolon"])
def test_start_refuses_a_state_dir_whose_socket_no_command_could_reach_and_creates_nothing(
    name: str,
) -> None:
    """Such a node served, but ping, status and stop refuse its address: nothing could reach
    or stop it. `start` refuses the state dir first, as it does one too long for a socket."""
    state_dir = new_state_dir() / name
    try:
        done = run_cli("start", "--detach", state_dir=state_dir)
        assert done.returncode == 2, done.stderr
        assert done.stdout == "" and "Traceback" not in done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: state dir ") and "cannot hold the node's socket" in line
        assert not state_dir.exists(), "a refused start creates nothing"
    finally:
        record = read_pid_file(state_dir) if state_dir.exists() else None
        if record is not None:  # without the check: a node nothing else could stop
            node = psutil.Process(int(str(record["pid"])))
            node.terminate()
            wait_exited(node, 30.0)
        shutil.rmtree(state_dir.parent)


@pytest.mark.parametrize("command", ["ping", "status"])
def test_node_that_never_answers_exits_4_after_the_timeout(
    command: str, invoke: Callable[..., Result]
) -> None:
    directory = new_state_dir()
    address = f"ipc://{directory}/node.sock"
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    mute = zctx.socket(zmq.ROUTER)  # accepts the connection, reads, never replies
    try:
        mute.bind(address)
        result = invoke("--address", address, "--timeout", "0.5", command)
    finally:
        mute.close(linger=0)
        zctx.term()
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()
    assert_one_line_error(result, 4, "did not answer", address)


@pytest.mark.parametrize("command", [None, *sorted(cli.commands)])
def test_help_works_for_every_command(command: str | None, invoke: Callable[..., Result]) -> None:
    args = ["--help"] if command is None else [command, "--help"]
    result = invoke(*args)
    assert result.exit_code == 0
    usage = "Usage: subagents-node" + ("" if command is None else f" {command}")
    assert result.stdout.startswith(usage)


@pytest.mark.parametrize("family", [None, "config", "keys", "intercom"])
def test_the_command_or_a_family_given_nothing_shows_its_help_laid_out(
    family: str | None, invoke: Callable[..., Result]
) -> None:
    """`subagents-node` alone (the first thing a new user types), or a family such as `config`
    alone, printed its whole help squeezed into one line: `error: Usage: subagents-node
    [OPTIONS] COMMAND [ARGS]... Launch and ... Options: --state-dir ...`. It shows the help as
    `--help` lays it out; on stderr, exit 2, since a command is missing."""
    result = invoke(*([] if family is None else [family]))
    assert result.exit_code == 2
    usage = "Usage: subagents-node" + ("" if family is None else f" {family}")
    assert result.stderr.startswith(usage) and "\nOptions:\n" in result.stderr
    assert "\nCommands:\n" in result.stderr and "error" not in result.stderr.lower()
    assert result.stdout == ""


def test_every_command_family_is_named_in_the_lazy_table_and_nothing_else_is() -> None:
    """`subagents-node CMD` imports only CMD's family: the lazy table must name each command
    of each family's COMMANDS exactly once, with the attribute that holds it."""
    import importlib

    from subagents_node.cli.main import LAZY_COMMANDS

    families = ("runs", "ledgers", "manage", "observe", "workflow", "mcp", "keys", "prune", "nodes")
    declared = {}
    for family in families:
        module = importlib.import_module(f"subagents_node.cli.{family}")
        for command in module.COMMANDS:
            (attribute,) = [k for k, v in vars(module).items() if v is command]
            declared[command.name] = (module.__name__, attribute)
    assert declared == dict(LAZY_COMMANDS)


def test_version_and_help_of_one_command_load_no_other_command_family() -> None:
    probe = (
        "import sys\n"
        "from subagents_node.cli import cli\n"
        "try:\n"
        "    cli(['ping', '--help'], prog_name='subagents-node')\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = [m for m in sys.modules if m.startswith('subagents_node.cli.')]\n"
        "print(' '.join(sorted(loaded)), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stderr.split() == [
        "subagents_node.cli.common",
        "subagents_node.cli.main",
        "subagents_node.cli.params",  # the value types of the group's own options
        "subagents_node.cli.terminal",  # how every line of human output is printed
    ]


def test_a_client_that_talked_to_an_owner_is_told_at_once_when_the_node_stops(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A clean stop left the owners' socket files behind: a client holding a channel to an
    owner waited out its whole timeout (NodeTimeout) where a fresh one got NodeNotRunning."""
    node = start_node()
    with Client(ZmqTransport(node.address), timeout=30.0) as client:
        budget = client.fanout.create(root_run_id="r-stop", limit=2)
        done = run_cli("stop", state_dir=node.state_dir)
        assert done.returncode == 0, done.stderr
        with pytest.raises(NodeNotRunning):
            client.fanout.claim(budget, ["tasks[0]"])
    assert not list(node.state_dir.glob("*.sock"))


def test_an_empty_state_dir_or_address_on_the_command_line_is_refused_not_taken_as_default(
    tmp_path: Path,
) -> None:
    """`--state-dir "$DIR"` with DIR unset must not mean the default state dir (a `stop`
    would stop another node); an empty variable, though, is as good as unset."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    env.pop("SUBAGENTS_STATE_DIR", None)
    env.pop("SUBAGENTS_NODE", None)
    # Blank counts as empty: `--state-dir " "` was a directory named " " (status: "no node is
    # running at ipc:// /node.sock"), while SUBAGENTS_STATE_DIR=" " meant the default.
    for option in ("--state-dir", "--address"):
        for value in ("", "  "):
            done = subprocess.run(
                [*CLI, option, value, "stop"], capture_output=True, text=True, timeout=60, env=env
            )
            assert done.returncode == 2, done.stderr
            assert f"'{option}': is empty" in done.stderr and len(done.stderr.splitlines()) == 1
    for variable in ("SUBAGENTS_STATE_DIR", "SUBAGENTS_NODE"):
        for value in ("", " "):
            done = subprocess.run(
                [*CLI, "status"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**env, variable: value},
            )
            assert str(tmp_path / "xdg") in done.stderr  # the default state dir, asked
