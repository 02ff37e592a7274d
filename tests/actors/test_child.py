"""The child shim: real shims forked from a real template, real children, and the test in the
supervisor's seat (a ROUTER socket that validates every report and acknowledges it, or not).

What each test checks is a rule of the shim (DESIGN §1, SPEC §0.4 "Proof from the parent",
R-EXT-3, R-RUN-5): exit status, logs, deadline and stop of the whole tree, the end of a tree
that a `setsid()` daemon keeps alive, spawn failures, the exit record written before the
report, and reports retried until acknowledged. Every wait has a deadline (a socket poll, a
FIFO read or a pidfd); nothing sleeps blindly. At teardown any process left is killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from subagents_node.actors.child import procfs, records, reports, shimtemplate
from subagents_node.actors.child.procfs import ProcessIdentity, is_alive
from subagents_node.actors.child.shims import signal_shim
from subagents_node.actors.child.shimtemplate import ShimTemplate
from subagents_node.messages.codec import encode
from subagents_node.messages.envelope import REPLY, Envelope
from subagents_node.messages.protocol import parse_request
from subagents_node.messages.runs import ChildReport, ChildSpec
from tests.support.nodes import short_dir
from tests.support.runs import wait_until

SLEEPER = Path(__file__).resolve().parents[2] / "examples" / "agents" / "sleeper.py"
PY = sys.executable
WAIT_S = 15.0


class Harness:
    """A shim template, and a ROUTER where the supervisor would be."""

    def __init__(self) -> None:
        self.dir = short_dir()
        self.address = f"ipc://{self.dir}/runs.sock"
        self.zctx = zmq.Context()
        self.router: zmq.Socket[bytes] | None = None
        self.bind()
        self.template = ShimTemplate()
        self.reports: list[ChildReport] = []
        self.shims: list[ProcessIdentity] = []

    def bind(self) -> None:
        self.router = self.zctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(self.address)

    def unbind(self) -> None:
        assert self.router is not None
        self.router.close(0)
        self.router = None

    def spec(self, child_id: str, argv: list[str], **fields: Any) -> ChildSpec:
        fields.setdefault("cwd", str(self.dir))
        fields.setdefault("env", {"PATH": os.environ.get("PATH", os.defpath)})
        return ChildSpec(
            child_id=child_id,
            run_id="run-1",
            argv=argv,
            stdout_path=str(self.dir / f"{child_id}.stdout.log"),
            stderr_path=str(self.dir / f"{child_id}.stderr.log"),
            **fields,
        )

    def start(self, spec: ChildSpec) -> None:
        Path(spec.stdout_path).parent.mkdir(parents=True, exist_ok=True)
        self.template.order(spec, self.address)

    def report(self, ack: bool = True, timeout: float = WAIT_S) -> ChildReport:
        """The next report, validated as the node's gateway validates it, then acknowledged."""
        assert self.router is not None
        assert self.router.poll(timeout * 1000), "no report from the shim in time"
        identity, frame = self.router.recv_multipart()
        raw = msgpack.unpackb(frame, raw=False)
        request = parse_request(raw["type"], raw["body"])
        assert isinstance(request, ChildReport) and raw["target"] == "supervisor"
        if request.kind == "started":
            self.shims.append(ProcessIdentity(request.shim_pid, request.shim_start))
        if ack:
            env = Envelope(type=raw["type"], body={}, id=raw["id"], sender=raw["sender"])
            self.router.send_multipart([identity, encode(env.reply(REPLY, {"ok": True}))])
        self.reports.append(request)
        return request

    def until(self, kind: str, timeout: float = WAIT_S) -> ChildReport:
        """Reports up to the first one of `kind` (resends of earlier ones are skipped)."""
        while True:
            report = self.report(timeout=timeout)
            if report.kind == kind:
                return report

    def close(self) -> None:
        self.template.close()
        for identity in self.shims:
            signal_shim(identity, signal.SIGKILL)
        if self.router is not None:
            self.router.close(0)
        self.zctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)


def read_fifo(path: Path, timeout: float = WAIT_S) -> str:
    got: list[str] = []
    done = threading.Event()

    def reader() -> None:
        with open(path) as fifo:
            got.append(fifo.read())
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    assert done.wait(timeout), "the child never wrote to its FIFO"
    return got[0]


def wait_gone(pid: int, timeout: float = WAIT_S) -> None:
    """Block on a pidfd until `pid` exits (it is not our child: no wait() possible)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        import select

        assert select.select([fd], [], [], timeout)[0], f"process {pid} is still alive"
    finally:
        os.close(fd)


def sleeper(h: Harness, task: str) -> tuple[list[str], Path]:
    fifo = h.dir / f"ready-{len(os.listdir(h.dir))}.fifo"
    os.mkfifo(fifo)
    return [PY, str(SLEEPER), f"{task} ready={fifo}"], fifo


def exit_record(spec: ChildSpec) -> dict[str, Any]:
    with open(Path(spec.records) / records.EXIT_RECORD) as fh:
        data: dict[str, Any] = json.load(fh)
    return data


# -- the wire --------------------------------------------------------------------------------


def test_the_shim_speaks_the_report_type_and_owner_the_node_routes() -> None:
    assert ChildReport.model_fields["type"].default == reports.REPORT_TYPE
    assert ChildReport.target == reports.SUPERVISOR


def test_the_shim_template_imports_neither_pydantic_pykka_nor_sqlite() -> None:
    """A shim costs a fork of a small process: what the template imports, every shim holds."""
    code = (
        "import sys; import subagents_node.actors.child.template; "
        "print(sorted(m for m in ('pydantic', 'pykka', 'sqlite3', 'psutil') if m in sys.modules))"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_order_the_template_cannot_read_ends_one_shim_and_the_template_serves_on(
    shim_harness: Harness,
) -> None:
    """The shim parses its order (the template makes no objects between forks): a line that
    is not an order costs that one fork, not the template and the orders after it."""
    spec = shim_harness.spec("c-after", [PY, "-c", "pass"])
    Path(spec.stdout_path).parent.mkdir(parents=True, exist_ok=True)
    proc = shim_harness.template._ensure()  # started, as for a first order
    assert proc.stdin is not None
    proc.stdin.write(b"not an order\n")
    proc.stdin.flush()
    shim_harness.start(spec)
    assert shim_harness.until("tree_ended").exit_code == 0
    assert shim_harness.template.pid == proc.pid and proc.poll() is None


# -- exits -----------------------------------------------------------------------------------


def test_r_ext_3_exit_0_is_reported_started_then_tree_ended_in_sequence(
    shim_harness: Harness,
) -> None:
    """A child that leaves no descendant: its exit and its tree's end are one report."""
    spec = shim_harness.spec("c1", [PY, "-c", "print('  hello  ')"])
    shim_harness.start(spec)
    started = shim_harness.until("started")
    assert started.pid is not None and started.identity_start is not None
    ended = shim_harness.until("tree_ended")
    assert [started.seq, ended.seq] == [1, 2]
    assert [r.kind for r in shim_harness.reports] == ["started", "tree_ended"]
    assert (ended.exit_code, ended.signal, ended.tree_ended) == (0, None, True)
    assert Path(spec.stdout_path).read_text() == "  hello  \n"  # stdout straight to the log
    wait_gone(started.shim_pid)  # every report acknowledged: the shim exits


@pytest.mark.parametrize(("argv_tail", "code", "signum"), [("exit(3)", 3, None), ("kill", None, 9)])
def test_r_ext_3_the_shim_as_parent_sees_the_exact_exit_code_or_signal(
    shim_harness: Harness, argv_tail: str, code: int | None, signum: int | None
) -> None:
    script = (
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
        if argv_tail == "kill"
        else ("import sys; sys.exit(3)")
    )
    spec = shim_harness.spec("c1", [PY, "-c", script])
    shim_harness.start(spec)
    ended = shim_harness.until("tree_ended")
    assert (ended.exit_code, ended.signal) == (code, signum)


def test_r_run_5_the_exit_record_is_durable_before_the_report_that_tells_of_it(
    shim_harness: Harness,
) -> None:
    argv, fifo = sleeper(shim_harness, "seconds=0 daemon=1 exit=5")
    spec = shim_harness.spec("c1", argv)
    shim_harness.start(spec)
    read_fifo(fifo)
    shim_harness.until("exited")  # the daemon keeps the tree alive: the exit is reported alone
    record = exit_record(spec)  # read while the report is only just received
    assert record["exit_code"] == 5 and record["tree_ended"] is False
    shim_harness.until("tree_ended")
    record = exit_record(spec)
    assert record["tree_ended"] is True and record["exit_code"] == 5
    assert not [p for p in os.listdir(spec.records) if p.endswith(".tmp")]


def test_child_reads_its_stdin_file_and_gets_the_given_env_and_cwd(shim_harness: Harness) -> None:
    stdin = shim_harness.dir / "task.txt"
    stdin.write_text("the task")
    work = shim_harness.dir / "work"
    work.mkdir()
    script = "import os, sys; print(sys.stdin.read(), os.environ['X_TEST'], os.getcwd())"
    spec = shim_harness.spec(
        "c1", [PY, "-c", script], stdin_path=str(stdin), cwd=str(work), env={"X_TEST": "42"}
    )
    shim_harness.start(spec)
    assert shim_harness.until("tree_ended").exit_code == 0
    assert Path(spec.stdout_path).read_text().split() == ["the", "task", "42", str(work)]


def test_child_without_a_stdin_file_reads_dev_null(shim_harness: Harness) -> None:
    spec = shim_harness.spec("c1", [PY, "-c", "import sys; print(repr(sys.stdin.read()))"])
    shim_harness.start(spec)
    shim_harness.until("tree_ended")
    assert Path(spec.stdout_path).read_text().strip() == "''"


@pytest.mark.parametrize("case", ["missing-command", "cwd-gone", "not-executable"])
def test_r_run_5_spawn_failure_is_reported_not_started_with_one_line_naming_the_cause(
    shim_harness: Harness, case: str
) -> None:
    not_executable = shim_harness.dir / "tool.sh"
    not_executable.write_text("#!/bin/sh\n")
    argv, cwd, words = {
        "missing-command": (
            ["/nonexistent/agent-cli"],
            str(shim_harness.dir),
            "/nonexistent/agent-cli",
        ),
        "cwd-gone": ([PY, "-c", "pass"], str(shim_harness.dir / "gone"), "working directory"),
        "not-executable": ([str(not_executable)], str(shim_harness.dir), "Permission denied"),
    }[case]
    shim_harness.start(shim_harness.spec("c1", argv, cwd=cwd))
    report = shim_harness.report()
    assert report.kind == "not_started" and report.pid is None
    assert report.error is not None and words in report.error and "\n" not in report.error


@pytest.mark.parametrize("planted", ["symlink", "fifo"])
def test_a_link_or_fifo_planted_as_a_childs_log_starts_nothing_and_says_so(
    shim_harness: Harness, planted: str
) -> None:
    """The shim opened a child's logs as named: a link planted under a log's name (a sibling
    child knows the run's directory) had this child's output appended to the file it named;
    a FIFO held the shim in open(), so the child never started and nothing said why."""
    outside = shim_harness.dir / "outside"
    outside.write_text("precious\n")
    spec = shim_harness.spec("c1", [PY, "-c", "print('secret output')"])
    if planted == "symlink":
        Path(spec.stdout_path).symlink_to(outside)
    else:
        os.mkfifo(spec.stdout_path)
    shim_harness.start(spec)
    report = shim_harness.report()
    assert report.kind == "not_started" and report.pid is None
    kind = "a symbolic link" if planted == "symlink" else "a FIFO"
    assert report.error == f"cannot start the child: {spec.stdout_path}: {kind}, not a regular file"
    assert outside.read_text() == "precious\n"


# -- ending the tree -------------------------------------------------------------------------


def test_r_ext_3_deadline_kills_the_whole_tree_including_a_grandchild_that_ignores_term(
    shim_harness: Harness,
) -> None:
    argv, fifo = sleeper(shim_harness, "seconds=60 grandchild=1 ignore_term=1")
    shim_harness.start(shim_harness.spec("c1", argv, deadline_s=0.5, grace_s=0.3))
    shim_harness.until("started")
    leader, grandchild = (int(p) for p in read_fifo(fifo).split())
    ended = shim_harness.until("tree_ended")
    assert ended.ended_by == "deadline" and ended.signal == signal.SIGKILL
    for pid in (leader, grandchild):
        wait_gone(pid)


def test_r_ext_3_stop_is_sigterm_to_the_shim_and_ends_the_group_with_term(
    shim_harness: Harness,
) -> None:
    argv, fifo = sleeper(shim_harness, "seconds=60 grandchild=1")
    shim_harness.start(shim_harness.spec("c1", argv, grace_s=5))
    started = shim_harness.until("started")
    read_fifo(fifo)
    assert signal_shim(ProcessIdentity(started.shim_pid, started.shim_start))
    ended = shim_harness.until("tree_ended")
    assert (ended.ended_by, ended.signal) == ("stop", signal.SIGTERM)


def test_leader_exit_ends_members_of_its_group_that_outlive_it(shim_harness: Harness) -> None:
    spec = shim_harness.spec("c1", ["sh", "-c", "sleep 60 & echo $!; exit 0"], grace_s=0.3)
    shim_harness.start(spec)
    ended = shim_harness.until("tree_ended")
    assert ended.exit_code == 0
    grandchild = int(Path(spec.stdout_path).read_text())
    assert procfs.start_time_of(grandchild) is None


def test_a_setsid_daemon_keeps_the_tree_alive_until_it_ends_and_stop_kills_it(
    shim_harness: Harness,
) -> None:
    """The daemon escapes the child's process group, not its subreaper: the shim reports the
    child's exit, but `tree_ended` only once the daemon is gone too (here: stopped)."""
    argv, fifo = sleeper(shim_harness, "seconds=0 daemon=60")
    shim_harness.start(shim_harness.spec("c1", argv, grace_s=0.3))
    started = shim_harness.until("started")
    _, _, daemon = (int(p) for p in read_fifo(fifo).split())
    assert shim_harness.until("exited").exit_code == 0
    assert shim_harness.router is not None and not shim_harness.router.poll(500)  # no tree end yet
    assert procfs.start_time_of(daemon) is not None
    assert signal_shim(ProcessIdentity(started.shim_pid, started.shim_start))
    ended = shim_harness.until("tree_ended")
    assert ended.ended_by == "stop" and ended.exit_code == 0
    wait_gone(daemon)


def test_a_daemon_that_ends_by_itself_ends_the_tree_with_the_childs_exit_status(
    shim_harness: Harness,
) -> None:
    argv, fifo = sleeper(shim_harness, "seconds=0 daemon=1 exit=4")
    shim_harness.start(shim_harness.spec("c1", argv))
    shim_harness.until("started")
    _, _, daemon = (int(p) for p in read_fifo(fifo).split())
    assert shim_harness.until("exited").exit_code == 4
    ended = shim_harness.until("tree_ended")
    assert (ended.exit_code, ended.ended_by) == (4, "")
    assert procfs.start_time_of(daemon) is None


# -- reports and the node's absence ----------------------------------------------------------


def test_reports_are_resent_until_acknowledged_and_the_child_runs_on_meanwhile(
    shim_harness: Harness,
) -> None:
    argv, fifo = sleeper(shim_harness, "seconds=60")
    shim_harness.start(shim_harness.spec("c1", argv))
    first = shim_harness.report(ack=False)
    again = shim_harness.report(ack=False)
    assert (first.kind, again.kind, first.seq, again.seq) == ("started", "started", 1, 1)
    leader = int(read_fifo(fifo).split()[0])
    shim_harness.unbind()  # the node is gone
    assert first.identity_start is not None
    assert is_alive(ProcessIdentity(leader, first.identity_start))
    shim_harness.bind()  # a new node: it receives the resend and adopts the shim by acknowledging
    assert shim_harness.report().kind == "started"
    assert signal_shim(ProcessIdentity(first.shim_pid, first.shim_start))
    assert shim_harness.until("tree_ended").ended_by == "stop"


def test_a_child_that_ended_before_its_started_report_left_costs_one_report(
    shim_harness: Harness,
) -> None:
    """Every report carries every fact known so far: the newest supersedes one not yet
    acknowledged, so a child that ends while the node is away is one `tree_ended` report
    that also says who it was (pid, start time), not `started` and then `tree_ended`."""
    shim_harness.unbind()  # no node: the `started` report cannot leave
    spec = shim_harness.spec("c1", ["/bin/true"])
    shim_harness.start(spec)
    record = Path(spec.records) / records.EXIT_RECORD
    wait_until(lambda: record.exists() and exit_record(spec)["tree_ended"], what="the tree end")
    shim_harness.bind()
    only = shim_harness.report()
    assert (only.kind, only.seq, only.exit_code) == ("tree_ended", 2, 0)
    assert only.pid is not None and only.identity_start is not None
    wait_gone(only.shim_pid)  # acknowledged: nothing else was waiting to be sent
    assert [r.kind for r in shim_harness.reports] == ["tree_ended"]


def test_a_shim_whose_tree_ended_stops_retrying_after_a_bound_and_leaves_its_record(
    shim_harness: Harness,
) -> None:
    """Nothing to keep alive once the tree ended: the shim exits after a bounded retry, and its
    exit record (what a recovering node reads) holds the exit status and the tree's end."""
    spec = shim_harness.spec("c1", [PY, "-c", "import sys; sys.exit(6)"])
    order = {**shimtemplate.order_of(spec, shim_harness.address), "give_up_s": 0.5}
    Path(spec.stdout_path).parent.mkdir(parents=True, exist_ok=True)
    shim_harness.template.order_raw(order)
    first = shim_harness.report(ack=False)
    shim_harness.unbind()  # the node is gone for good
    wait_gone(first.shim_pid)
    record = exit_record(spec)
    assert (record["exit_code"], record["tree_ended"]) == (6, True)


def test_a_shim_whose_child_never_started_stops_retrying_after_the_same_bound(
    shim_harness: Harness,
) -> None:
    """A spawn that failed set no moment for its tree's end, and the bound on retries counts
    from it: with its node gone for good, such a shim retried its `not_started` forever, an
    idle process per failed spawn."""
    spec = shim_harness.spec("c1", ["/nonexistent/agent-cli"])
    order = {**shimtemplate.order_of(spec, shim_harness.address), "give_up_s": 0.5}
    Path(spec.stdout_path).parent.mkdir(parents=True, exist_ok=True)
    shim_harness.template.order_raw(order)
    first = shim_harness.report(ack=False)
    assert first.kind == "not_started"
    shim_harness.unbind()  # the node is gone for good
    wait_gone(first.shim_pid)


def test_a_child_given_up_by_a_recovering_node_is_never_started_by_a_late_shim(
    shim_harness: Harness,
) -> None:
    spec = shim_harness.spec("c1", [PY, "-c", "open('started', 'w')"])
    Path(spec.records).mkdir(parents=True)
    assert records.write_atomically(
        str(Path(spec.records) / records.SHIM_RECORD), {"abandoned": True}
    )
    shim_harness.start(spec)
    assert shim_harness.router is not None and not shim_harness.router.poll(1000)
    assert not (shim_harness.dir / "started").exists()


def test_write_atomically_exclusive_loses_to_an_existing_record(tmp_path: Path) -> None:
    path = str(tmp_path / "r.json")
    assert records.write_atomically(path, {"a": 1}, exclusive=True)
    assert not records.write_atomically(path, {"a": 2}, exclusive=True)
    assert json.loads(Path(path).read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["r.json"]


def test_write_atomically_that_cannot_rename_raises_and_leaves_no_temp_file(
    tmp_path: Path,
) -> None:
    """Only a failed rename leaves the temp file behind, so only that path removes it."""
    (tmp_path / "r.json").mkdir()  # a directory where the record goes: rename fails
    with pytest.raises(OSError):
        records.write_atomically(str(tmp_path / "r.json"), {"a": 1}, sync=False)
    assert os.listdir(tmp_path) == ["r.json"]


def test_write_atomically_never_writes_through_a_symlink_planted_under_its_old_temp_name(
    tmp_path: Path,
) -> None:
    """A shim's records used to go through `<record>.<pid>.tmp`: a child knows its shim's pid
    (its parent's), so it could plant that link and have its exit record written over any file
    it named, then the link renamed into place."""
    target = tmp_path / "outside"
    target.write_bytes(b"precious\n")
    path = tmp_path / records.EXIT_RECORD
    Path(f"{path}.{os.getpid()}.tmp").symlink_to(target)
    assert records.write_atomically(str(path), {"exit_code": 0}, sync=False)
    assert json.loads(path.read_text()) == {"exit_code": 0}
    assert not path.is_symlink()
    assert target.read_bytes() == b"precious\n"


def test_signal_shim_never_signals_a_pid_whose_start_time_differs() -> None:
    identity = ProcessIdentity(os.getpid(), 1.0)  # our pid, another start time
    assert not signal_shim(identity, signal.SIGTERM)  # (had it sent it, pytest would be dead)


# -- what a shim costs -------------------------------------------------------------------------

SHIM_PRIVATE_LIMIT = 2 << 20  # issue 10: shim private memory <= 2 MiB per child


def private_bytes(pid: int) -> int:
    """Memory only this process maps (Private_Clean + Private_Dirty of smaps_rollup)."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    fields = (line.split() for line in text.splitlines())
    return sum(int(f[1]) * 1024 for f in fields if f[0] in ("Private_Clean:", "Private_Dirty:"))


@pytest.mark.slow
def test_a_running_childs_shim_is_one_thread_with_at_most_2_mib_of_private_memory(
    shim_harness: Harness,
) -> None:
    """Issue 10's target, with a child's whole environment (as the node passes it): the shim
    is forked from the template, runs one thread (no libzmq context) and copies little."""
    count = 8
    for i in range(count):
        shim_harness.start(shim_harness.spec(f"c{i}", ["/bin/sleep", "60"], env=dict(os.environ)))
    started = [shim_harness.until("started") for _ in range(count)]
    pids = [report.shim_pid for report in started]
    threads = [len(os.listdir(f"/proc/{pid}/task")) for pid in pids]
    private = [private_bytes(pid) for pid in pids[:-1]]  # the last shares the least so far
    for report in started:
        assert signal_shim(ProcessIdentity(report.shim_pid, report.shim_start))
    ended = {shim_harness.until("tree_ended").child_id for _ in range(count)}
    assert ended == {f"c{i}" for i in range(count)}
    assert threads == [1] * count
    mean = sum(private) / len(private)
    assert mean <= SHIM_PRIVATE_LIMIT, f"{mean / (1 << 20):.2f} MiB per shim"


def test_a_shim_whose_record_directory_was_removed_gives_up_once_its_tree_ended(
    shim_harness: Harness,
) -> None:
    """A record that cannot be written for lack of space is owed (the shim waits for space);
    one whose directory is gone (the state dir removed with its node) is owed to nobody, and
    a shim that kept trying, unacknowledged, would live on for good."""
    release = shim_harness.dir / "release.fifo"
    os.mkfifo(release)
    spec = shim_harness.spec("c1", [PY, "-c", "import sys; open(sys.argv[1]).read()", str(release)])
    shim_harness.template.order_raw(
        {**shimtemplate.order_of(spec, shim_harness.address), "give_up_s": 0.1}
    )
    started = shim_harness.until("started")
    shutil.rmtree(spec.records)
    release.write_text("go")
    ended = shim_harness.report(ack=False)
    assert (ended.kind, ended.exit_code) == ("tree_ended", 0)
    wait_gone(started.shim_pid)  # no acknowledgement ever came: it gives up all the same
