"""A workflow goes on across its node's upgrade (`stop` then `start`) or kill -9 and restart
(SPEC R-WF-4..6, R-FAN-13/15).

The host's admissions and launches wait for the state dir's next node, as its awaits do, and are
sent again there; nothing is done twice and nothing is lost:

- a call made while no node runs waits for the next node (the workflow used to fail with
  `NodeNotRunning`);
- a child launch the node recorded and started but died before answering is answered by the
  next node with that same run (R-WF-4: one key, one launch), not launched a second time;
- an admission the fan-out owner recorded but never answered is not charged again (its claim
  id), nor refused because of its own first attempt; nothing is refunded (R-FAN-15);
- a child's spawn the session owner reserved for a launch the node never recorded is not
  reserved again (R-SPN-5: one spawn per child launched), nor refused because of its own first
  reservation; nothing is refunded (R-SPN-6: usage is never reset).

Each test counts the workflow's children by key (exactly one run each) and its budget (used =
the number of keys). Real detached nodes (fault injection: SUBAGENTS_TEST_KILL_AT kills the
node at a named step), a real host, real children; every wait is on an event or re-reads a
snapshot with a deadline.
"""

from __future__ import annotations

import textwrap
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.supervisor import RunView
from subagents_node.workflow.launch import workflow_launch, workflow_result
from tests.support.foreground import watches_inotify
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, new_session, process_gone, wait_until

WAIT_S = 60.0

#: A batch first (one admission group of 3), then children one after another; with a gate,
#: the host blocks on it half-way (so the test can take the node away before its next call).
_SCRIPT = """\
import os, socket

GATE = {gate!r}


def main(runs):
    specs = [{{"key": f"batch{{i}}", "agent": "echo", "task": f"b{{i}}"}} for i in range(3)]
    batch = runs.all(specs)
    for i in range(4):
        runs.run(f"before{{i}}", "echo", f"before {{i}}")
    if GATE:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(GATE)
        sock.sendall(f"{{os.getpid()}}\\n".encode())
        sock.recv(64)
    for i in range(6):
        runs.run(f"after{{i}}", "echo", f"after {{i}}")
    return [r.state for r in batch]
"""
KEYS = [
    *(f"batch{i}" for i in range(3)),
    *(f"before{i}" for i in range(4)),
    *(f"after{i}" for i in range(6)),
]


#: A child, then (past the gate) a `resume` item of it under its own key.
_RESUMES = """\
import os, socket


def main(runs):
    runs.run("a", "echo", "first")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect({gate!r})
    sock.sendall(f"{{os.getpid()}}\\n".encode())
    sock.recv(64)
    return runs.resume("b", "a", "again").state
"""

#: The host's launch of key `k` sent again as it is after a lost node, then changed (R-WF-4).
_SENT_AGAIN = """\
from subagents_node.messages.errors import WorkflowKeyConflict
from subagents_node.workflow.childrequests import member_launch


def main(runs):
    first = runs.run("k", "echo", "hello")
    agent = runs._launcher.catalog.get("echo")
    launch = member_launch(runs.steps["k"], agent, runs._launcher, runs.env)
    again = runs._client.runs.launch(launch)
    item = launch.items[0].model_copy(update={"task": "another task"})
    try:
        runs._client.runs.launch(launch.model_copy(update={"items": [item]}))
        conflict = None
    except WorkflowKeyConflict as err:
        conflict = err.message
    return {"first": first.run_id, "again": again.run_id, "conflict": conflict}
"""


#: One key's launch sent twice at once, as a host whose first answer is slow might.
_SENT_TWICE_AT_ONCE = """\
import threading

from subagents_node.workflow.calls import ChildCall


def main(runs):
    group = runs._group([ChildCall.of({"key": "k", "agent": "echo", "task": "hello"})])
    [(step, launch)] = group.members
    runs._client.fanout.claim(runs.env.descriptor, ["workflow[k]"])  # admitted, as runs.run does
    views = [None, None]

    def send(i):
        views[i] = runs._client.runs.launch(launch)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [view.run_id for view in views]
"""


#: A child, then (past the gate) another one.
_TWO_CHILDREN = """\
import os, socket


def main(runs):
    first = runs.run("a", "echo", "first")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect({gate!r})
    sock.sendall(f"{{os.getpid()}}\\n".encode())
    sock.recv(64)
    return [first.state, runs.run("b", "echo", "second").state]
"""


def launch_workflow(
    client: Client,
    agents: Path,
    work: Path,
    gate: str = "",
    script_text: str = "",
    session: str | None = None,
) -> str:
    script = work / "loop.py"
    script.write_text(script_text or textwrap.dedent(_SCRIPT.format(gate=gate)))
    ctx = launch_context(agents, cwd=work, session=session)
    launch = workflow_launch(ctx, script, background=True, agents_dirs=(str(agents),))
    return client.runs.launch(launch).run_id


def each_key_once_and_charged_once(client: Client, run_id: str) -> RunView:
    """The workflow completed, launched every key exactly once and was charged one unit per
    key: nothing twice, nothing lost."""
    run = client.runs.wait(run_id, timeout=WAIT_S)
    assert run.state == "complete", run.error
    children = client.runs.list(parent_run_id=run_id, limit=1000)
    assert Counter(child.workflow_key for child in children) == Counter(KEYS)
    assert all(child.state == "complete" for child in children), children
    budget = client.fanout.snapshot(decode_descriptor(run.fanout_descriptor))
    assert budget.used == len(KEYS), budget
    return run


def _stop(node: NodeProcess) -> None:
    assert node.stop().returncode == 0


_LOSSES: dict[str, Callable[[NodeProcess], None]] = {"stopped": _stop, "killed": NodeProcess.kill}


@pytest.mark.slow
@pytest.mark.parametrize("loss", sorted(_LOSSES))
def test_r_wf_5_a_workflow_admits_and_launches_on_the_next_node_after_its_node_is_lost(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
    loss: str,
) -> None:
    """The upgrade (`stop`, then `start --detach`) or a kill -9 and restart while the script
    runs: its next admission, made while no node runs, failed the workflow with
    NodeNotRunning; it now waits for the next node and goes on there."""
    node = start_node(state_dir=state_dir)
    run_id = launch_workflow(node.client(timeout=20), agents, state_dir, str(gate.path))
    [held] = gate.accept(1, timeout=WAIT_S)  # the host, half-way through its script

    _LOSSES[loss](node)
    held.release(0)
    wait_until(
        lambda: process_gone(held.pid) or watches_inotify(held.pid),
        timeout=WAIT_S,
        what="the host to wait for the next node",
    )
    assert not process_gone(held.pid), "the workflow host gave up when its node went"
    again = start_node(state_dir=state_dir)

    each_key_once_and_charged_once(again.client(timeout=20), run_id)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["answer_workflow_launch", "claim_recorded"])
def test_r_wf_4_a_request_the_lost_node_recorded_but_never_answered_is_not_done_twice(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    point: str,
) -> None:
    """kill -9 of the node right after it recorded the host's first admission (a batch of 3
    claims) or its first child launch (the batch's first member, running), before it answered:
    sent again to the next node, the batch was charged a second time, and the launch got a
    second run of the same key."""
    dying = start_node("--faults", state_dir=state_dir, kill_at=point)
    run_id = launch_workflow(dying.client(timeout=20), agents, state_dir)
    assert dying.wait_exited(WAIT_S), f"the node did not die at {point}"
    again = start_node(state_dir=state_dir)

    each_key_once_and_charged_once(again.client(timeout=20), run_id)


@pytest.mark.slow
def test_r_wf_5_a_resume_item_the_lost_node_recorded_but_never_answered_is_relaunched_once(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
) -> None:
    """The node that gets the host's `resume` item is killed right after it recorded the
    relaunch (running) and before it answered: the next node answers the item sent again with
    that relaunch, not a second one."""
    first = start_node(state_dir=state_dir)
    script = _RESUMES.format(gate=str(gate.path))
    run_id = launch_workflow(first.client(timeout=20), agents, state_dir, script_text=script)
    [held] = gate.accept(1, timeout=WAIT_S)
    _stop(first)
    dying = start_node("--faults", state_dir=state_dir, kill_at="answer_workflow_launch")
    held.release(0)
    assert dying.wait_exited(WAIT_S), "the node did not die at answer_workflow_launch"
    client = start_node(state_dir=state_dir).client(timeout=20)

    run = client.runs.wait(run_id, timeout=WAIT_S)
    assert run.state == "complete", run.error
    result = workflow_result(run)
    assert result is not None and result["value"] == "complete", result  # the item's own end
    children = client.runs.list(parent_run_id=run_id, limit=1000)
    assert Counter(child.workflow_key for child in children) == Counter(["a", "b"])
    assert client.fanout.snapshot(decode_descriptor(run.fanout_descriptor)).used == 2


@pytest.mark.slow
@pytest.mark.parametrize("cap", [2, 10], ids=["cap-exactly-the-children", "cap-with-room"])
def test_r_spn_5_a_childs_spawn_reserved_by_a_node_lost_before_it_recorded_the_run_is_counted_once(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
    gate: Gate,
    cap: int,
) -> None:
    """A session with a spawn cap (R-CFG-4): the node that gets the host's launch of child
    `b` reserves its spawn (R-SPN-5) and is killed before it records the run (`record_run`).
    Sent again to the next node, the launch reserved a second spawn, never refunded (the
    session lost one for good), and in a session the first reservation filled it was refused
    (R-SPN-4). Now the same child's reservation is found and counted once."""
    session = new_session()
    first = start_node(state_dir=state_dir)
    client = first.client(timeout=20)
    assert client.session.open(session, configured_limit=cap).created
    script = _TWO_CHILDREN.format(gate=str(gate.path))
    run_id = launch_workflow(client, agents, state_dir, script_text=script, session=session)
    [held] = gate.accept(1, timeout=WAIT_S)
    _stop(first)
    dying = start_node("--faults", state_dir=state_dir, kill_at="record_run")
    held.release(0)
    assert dying.wait_exited(WAIT_S), "the node did not die at record_run"
    client = start_node(state_dir=state_dir).client(timeout=20)

    run = client.runs.wait(run_id, timeout=WAIT_S)
    assert run.state == "complete", run.error
    result = workflow_result(run)
    assert result is not None and result["value"] == ["complete", "complete"], result
    children = client.runs.list(parent_run_id=run_id, limit=1000)
    assert Counter(child.workflow_key for child in children) == Counter(["a", "b"])
    assert client.session.snapshot(session).used == 2


def test_r_wf_4_the_same_child_launch_sent_again_is_its_first_run_and_a_changed_one_a_conflict(
    client: Client, agents: Path, state_dir: Path
) -> None:
    """What the node answers a host that sends a launch again: a second run of the same key
    (and the changed launch a second one more); now the key's first run, and a changed launch
    is refused as the host itself refuses it (R-WF-4)."""
    run_id = launch_workflow(client, agents, state_dir, script_text=_SENT_AGAIN)
    run = client.runs.wait(run_id, timeout=WAIT_S)
    assert run.state == "complete", run.error
    result = workflow_result(run)
    assert result is not None
    value = result["value"]
    assert value["again"] == value["first"]
    assert value["conflict"] == (
        "Workflow child key 'k' was already used with different parameters; use a new key."
    )
    [child] = client.runs.list(parent_run_id=run_id, limit=1000)
    assert (child.run_id, child.workflow_key) == (value["first"], "k")


def test_r_wf_4_one_key_launched_twice_at_once_is_one_run(
    client: Client, agents: Path, state_dir: Path
) -> None:
    """The second launch of a key while the first is being admitted (or waits for its child
    to start) waits for that launch's answer: it used to start a second run."""
    run_id = launch_workflow(client, agents, state_dir, script_text=_SENT_TWICE_AT_ONCE)
    run = client.runs.wait(run_id, timeout=WAIT_S)
    assert run.state == "complete", run.error
    result = workflow_result(run)
    assert result is not None
    first, second = result["value"]
    [child] = client.runs.list(parent_run_id=run_id, limit=1000)
    assert first == second == child.run_id


#: Fails once (until MARK exists) after its first child, so that a resume has a finished key
#: to reuse and a new one to launch.
_FAILS_ONCE = """\
from pathlib import Path


def main(runs):
    first = runs.run("a", "echo", "first")
    if not Path({mark!r}).exists():
        raise RuntimeError("the first attempt fails")
    return [first.run_id, runs.run("b", "echo", "second").state]
"""


def _workflow_host_pid(script: Path) -> int | None:
    """The pid of the workflow host running `script` (from /proc), if one runs."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"subagents_node.workflow.host" in argv and str(script).encode() in argv:
            return int(proc.name)
    return None


@pytest.mark.slow
def test_r_fan_23_a_resumed_workflow_whose_node_is_lost_as_its_host_starts_reuses_its_source(
    start_node: Callable[..., NodeProcess],
    state_dir: Path,
    agents: Path,
) -> None:
    """The node that starts a resumed workflow's host is killed before the host asked it what
    run it serves (an upgrade right after `resume`). The host took the failed read for "not a
    resume": it ran the key its source had finished again and claimed it a second time (budget
    3 for 2 keys; R-FAN-23, R-RES-4: nothing claimed twice). It now waits for the next node,
    as the script's own calls do, and reuses the source's finished key."""
    mark = state_dir / "second-attempt"
    first = start_node(state_dir=state_dir)
    script_text = _FAILS_ONCE.format(mark=str(mark))
    source_id = launch_workflow(
        first.client(timeout=20), agents, state_dir, script_text=script_text
    )
    assert first.client(timeout=20).runs.wait(source_id, timeout=WAIT_S).state == "failed"
    mark.write_text("")
    _stop(first)
    dying = start_node("--faults", state_dir=state_dir, kill_at="answer_launch")
    resumed: list[str] = []
    # The resume's answer is lost with the node: its client sends it again to the next node.
    sender = threading.Thread(
        target=lambda: resumed.append(dying.client(timeout=20).runs.resume(source_id).run_id)
    )
    sender.start()
    assert dying.wait_exited(WAIT_S), "the node did not die at answer_launch"
    host = wait_until(lambda: _workflow_host_pid(state_dir / "loop.py"), what="the host")
    wait_until(
        lambda: process_gone(host) or watches_inotify(host),
        timeout=WAIT_S,
        what="the host to wait for the next node",
    )
    client = start_node(state_dir=state_dir).client(timeout=20)
    sender.join(WAIT_S)
    [run_id] = resumed

    run = client.runs.wait(run_id, timeout=WAIT_S)
    assert run.state == "complete", run.error
    assert run.source_run_id == source_id
    result = workflow_result(run)
    assert result is not None, run
    first_event = result["trace"][0]
    assert (first_event["event"], first_event["key"]) == ("reused", "a"), result
    children = [
        *client.runs.list(parent_run_id=source_id, limit=1000),
        *client.runs.list(parent_run_id=run_id, limit=1000),
    ]
    assert Counter(child.workflow_key for child in children) == Counter(["a", "b"])
    assert client.fanout.snapshot(decode_descriptor(run.fanout_descriptor)).used == 2
