"""A run's files replaced by a FIFO or a symlink (a child runs as the node's user and knows its
run directory): the run supervisor never blocks on one and never writes through one.

It used to open them with a plain, blocking, link-following open(): a FIFO in place of
`events.jsonl`, `recovery.json` or a child's `exit.json` blocked the single-threaded supervisor
in open() for good (every later request timed out; at a restart the node could not even
start), and a symlink had the run's events, or its summary (through a planted `summary.tmp`,
then renamed into place), written over the file it named. Each refused file is now what a file
that does not parse was: skipped (events.jsonl, a child record) or a one-line refusal
(resume). Real detached node, real children; every request has a short client timeout, so a
wedged supervisor fails the test at once instead of hanging it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from subagents_node.actors.runs.recovery import RECOVERY
from subagents_node.client.client import Client
from subagents_node.messages.errors import RunNotResumable
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import LaunchResult, RunView
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import detached_run_node as detached_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import WAIT_S, Gate, GateChild, launch_context, write_agent
from tests.support.victims import PRECIOUS
from tests.support.victims import victim as victim

pytestmark = pytest.mark.processes

#: Far above any answer of a supervisor that serves; what a wedged one fails the test after.
CLIENT_TIMEOUT_S = 5.0


@pytest.fixture
def client(node: NodeProcess) -> Client:
    return node.client(timeout=CLIENT_TIMEOUT_S)


def plant(path: Path, kind: str, victim: Path) -> None:
    """`path` replaced by a FIFO, or by a symlink to `victim`."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(victim)


def gated_run(client: Client, agents: Path, gate: Gate) -> tuple[RunView, GateChild]:
    """A background run whose one child waits at the gate."""
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    return run, gate.accept(1)[0]


def assert_serving(client: Client, run_id: str, state: str) -> None:
    """The supervisor answers (a wedged one times out: NodeTimeout)."""
    assert client.runs.show(run_id).state == state
    assert run_id in [r.run_id for r in client.runs.list()]


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_fifo_or_symlink_as_events_jsonl_never_wedges_the_supervisor_nor_is_written_through(
    client: Client, agents: Path, gate: Gate, victim: Path, kind: str
) -> None:
    run, child = gated_run(client, agents, gate)
    events = Path(run.run_dir) / "events.jsonl"
    plant(events, kind, victim)

    child.release(0)

    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    assert_serving(client, run.run_id, "complete")
    assert victim.read_bytes() == PRECIOUS
    left = os.lstat(events).st_mode
    assert stat.S_ISFIFO(left) if kind == "fifo" else stat.S_ISLNK(left)


def test_a_symlink_planted_as_summary_tmp_is_never_written_through(
    client: Client, agents: Path, gate: Gate, victim: Path
) -> None:
    run, child = gated_run(client, agents, gate)
    plant(Path(run.run_dir) / "summary.tmp", "symlink", victim)

    child.release(0)

    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    assert victim.read_bytes() == PRECIOUS
    summary = Path(run.run_dir) / "summary.json"
    assert stat.S_ISREG(os.lstat(summary).st_mode)
    assert run.run_id in summary.read_text()


#: A child that puts a FIFO in place of its own stdout log (the file its fd 1 is), then exits.
FIFO_STDOUT = (
    '["{python}", "-c", "import os; p = os.readlink(\'/proc/self/fd/1\'); '
    'os.unlink(p); os.mkfifo(p)"]'
)


def test_a_child_that_leaves_a_fifo_as_its_stdout_log_is_settled_with_no_output(
    client: Client, agents: Path
) -> None:
    """The supervisor reads the tail of a child's stdout log as the child settles: a FIFO
    there blocked it in open() for good."""
    write_agent(agents, "fifo-stdout", "Leaves a FIFO as its stdout log.", FIFO_STDOUT)
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("fifo-stdout", "go", True, None))

    done = client.runs.wait(run.run_id, timeout=WAIT_S)

    assert done.state == "complete", done.error
    assert [c.output for c in done.children] == [""]
    assert_serving(client, run.run_id, "complete")


def test_a_fifo_in_place_of_recovery_json_refuses_the_resume_in_one_line_at_once(
    client: Client, agents: Path, victim: Path
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=2)
    run = client.runs.launch(ctx.single("echo", "source task", True, None))
    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    recovery = Path(run.run_dir) / RECOVERY
    plant(recovery, "fifo", victim)

    with pytest.raises(RunNotResumable) as refused:
        client.ask(Resume(run_id=run.run_id, capacity_limit=2), LaunchResult)

    assert refused.value.details["reason"] == "invalid_recovery"
    assert refused.value.message == (
        f"Invalid persisted run fan-out budget '{recovery}': a FIFO, not a regular file"
    )
    assert_serving(client, run.run_id, "complete")


def test_a_fifo_in_place_of_a_childs_exit_json_never_keeps_the_next_node_from_starting(
    node: NodeProcess, agents: Path, gate: Gate
) -> None:
    """The restarted node reads each running child's exit record as it recovers: the FIFO is a
    record that does not parse, the live shim is adopted, and its report settles the run."""
    client = node.client(timeout=CLIENT_TIMEOUT_S)
    run, child = gated_run(client, agents, gate)
    node.close_clients()
    assert node.stop().returncode == 0
    os.mkfifo(Path(run.run_dir) / "child-0" / "exit.json")

    node.start()  # used to time out (20 s): the supervisor never got past the FIFO
    client = node.client(timeout=CLIENT_TIMEOUT_S)
    assert_serving(client, run.run_id, "running")
    child.release(0)

    done = client.runs.wait(run.run_id, timeout=WAIT_S)
    assert done.state == "complete", done.error
    assert [c.exit_code for c in done.children] == [0]
