"""A launch sent again under its client's launch id is the run it launched: never a second run,
never a second charge to a ledger (docs/api.md, "Launching again"; R-SPN-5, R-FAN-15, R-CAP-7).

The node is killed at each step of an admission (SUBAGENTS_TEST_KILL_AT on a node started with
faults: the run supervisor's steps, and the fan-out owner's `claim_recorded`, a claim recorded
and not yet answered), its client's launch ends with its outcome unknown, and the same request
is sent to the next node on the state dir. A session capped at one async slot and one spawn
shows a second charge at once (the launch sent again is refused), and the figures afterwards
count one of each. The clients do the sending again themselves: `run --async` (a real CLI
process) and the asyncio client, their node killed mid-launch, wait for the next node and get
the one run. Real detached nodes and real children; waits are on events or re-read snapshots
with a deadline. A client closed by its caller while its launch is sent again is no node that
went: the launch ends at once with the client's own NodeNotRunning.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import PIPE
from typing import TypeVar

import pytest

from subagents_node.client.aio import AsyncClient
from subagents_node.client.client import Client
from subagents_node.client.plans import Plan
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.constants import NODE_BACK_S
from subagents_node.messages.errors import (
    BadRequest,
    LaunchIdConflict,
    NodeNotRunning,
    SubagentsError,
)
from subagents_node.messages.fanout import FanoutDescriptor, decode_descriptor, encode_descriptor
from subagents_node.messages.supervisor import Launch, LaunchResult, RunView
from tests.support.manage import embedded
from tests.support.nodes import CLI, NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import detached_run_node as detached_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, new_session, wait_until

WAIT_S = 30.0
#: Every step of a top-level launch's admission the node can be killed at, in order (its
#: budget is its own, made afresh each attempt: its claim takes no id and is no `claim_recorded`).
KILL_POINTS = (
    "resolve_budget",
    "claim_paths",
    "create_run_dir",
    "reserve_spawns",
    "record_run",
    "mark_started",
    "answer_launch",
)
#: Those of a nested launch that may have charged its caller's fan-out budget (its claim
#: recorded by the fan-out owner, not yet answered, first).
NESTED_KILL_POINTS = ("claim_recorded", "create_run_dir", "reserve_spawns", "record_run")


def capped_launch(agents: Path, task: str = "hello") -> Launch:
    """A background run in a new session with room for one active run and one spawn, under a
    fresh launch id."""
    ctx = launch_context(
        agents,
        session=new_session(),
        max_active_async_runs_per_session=1,
        max_subagent_spawns_per_session=1,
    )
    launch = ctx.single("echo", task, True, None)
    return launch.model_copy(update={"launch_id": uuid.uuid4().hex})


def nested(launch: Launch, budget: FanoutDescriptor) -> Launch:
    """`launch` as a run's child launches it: on its caller's budget, with no slot of its own."""
    return launch.model_copy(update={"depth": 1, "inherited_fanout": encode_descriptor(budget)})


def sent_to_a_dying_node(
    start_node: Callable[..., NodeProcess], state_dir: Path, point: str, launch: Launch
) -> Client:
    """`launch` on a node that kills itself at `point`; then the next node's client."""
    dying = start_node("--faults", state_dir=state_dir, kill_at=point)
    with pytest.raises(SubagentsError):  # the node went: the outcome is unknown
        dying.client(timeout=10).ask(launch, LaunchResult)
    assert dying.wait_exited(WAIT_S), f"the node did not die at {point}"
    return start_node(state_dir=state_dir).client(timeout=20)


@contextlib.contextmanager
def launched_past_a_killed_owner(
    state_dir: Path, agents: Path, point: str, call_timeout_s: float = 2.0
) -> Iterator[tuple[Client, Launch, RunView]]:
    """A capped launch, sent once (the client does not resend), on an embedded node whose owner
    is killed alone (and restarted by the node) at `point` ("OWNER:POINT"): after it committed
    its part of the launch and before it answered. Yields the client, the launch and its run,
    once the node says that owner was restarted exactly once."""
    owner, _, at = point.partition(":")
    settings = {"owner_call_timeout_s": call_timeout_s, "fault_kill_points": [f"owner:{at}"]}
    with embedded(state_dir, faults=True, settings=settings) as node:
        client = node.client(timeout=30)
        launch = capped_launch(agents)
        run = client.ask(launch, LaunchResult).run
        [killed] = [a for a in node.owner_statuses() if a.name == owner]
        assert killed.restarts == 1, f"the {owner} owner was not killed at {at}"
        yield client, launch, run


def one_run_charged_once(client: Client, launch: Launch, run: RunView) -> None:
    """The session has exactly `run`, which completes; one spawn counted, and once it ended no
    async slot held (a first attempt's slot would be held until its TTL)."""
    assert [r.run_id for r in client.runs.list(session_id=launch.session_id)] == [run.run_id]
    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    assert client.session.spawn_snapshot(launch.session_id).used == 1
    wait_until(
        lambda: client.capacity.snapshot(launch.session_id, 1).used == 0,
        timeout=WAIT_S,
        what="the run's slot to be freed, and no other held",
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_r_spn_5_a_launch_sent_again_after_its_node_died_at_any_step_is_one_run_charged_once(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, point: str
) -> None:
    """Sent again to the next node, the launch made a second run (killed after recording it)
    or was refused by the ledgers its first attempt charged: the spawn (R-SPN-4) and the slot,
    held until its TTL (CapacityExhausted)."""
    launch = capped_launch(agents)

    client = sent_to_a_dying_node(start_node, state_dir, point, launch)
    run = client.runs.launch(launch)

    one_run_charged_once(client, launch, run)
    assert client.runs.launch(launch).run_id == run.run_id  # and again, once it ended
    budget = client.fanout.snapshot(decode_descriptor(run.fanout_descriptor))
    assert budget.used == 1, budget


@pytest.mark.slow
@pytest.mark.parametrize("point", NESTED_KILL_POINTS)
def test_r_fan_15_a_nested_launch_sent_again_claims_its_callers_budget_once(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, point: str
) -> None:
    """A run's child launch, on its caller's budget: sent again after its node died once its
    path was claimed, it claimed it a second time (R-FAN-11: paths are labels, not keys)."""
    first = start_node(state_dir=state_dir)
    budget = first.client().fanout.create(f"caller-{uuid.uuid4().hex[:8]}", 5)
    assert first.stop().returncode == 0
    launch = nested(capped_launch(agents), budget)

    client = sent_to_a_dying_node(start_node, state_dir, point, launch)
    run = client.runs.launch(launch)

    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    assert [r.run_id for r in client.runs.list(session_id=launch.session_id)] == [run.run_id]
    assert client.session.spawn_snapshot(launch.session_id).used == 1
    assert client.fanout.snapshot(budget).used == 1


def test_a_launch_id_sent_with_another_request_is_refused_and_changes_nothing(
    client: Client, agents: Path
) -> None:
    launch = capped_launch(agents)
    run = client.runs.launch(launch)
    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    changed = launch.model_copy(
        update={"items": [launch.items[0].model_copy(update={"task": "x"})]}
    )

    with pytest.raises(LaunchIdConflict) as refused:
        client.runs.launch(changed)

    assert refused.value.message == (
        f"Launch id '{launch.launch_id}' was already used for another launch (run "
        f"{run.run_id}); use a new launch id."
    )
    assert "\n" not in refused.value.message
    assert [r.run_id for r in client.runs.list(session_id=launch.session_id)] == [run.run_id]
    assert client.session.spawn_snapshot(launch.session_id).used == 1
    assert client.runs.launch(launch).run_id == run.run_id  # the first request still is its run


def test_one_launch_id_sent_twice_at_once_is_one_run_and_both_callers_get_it(
    client: Client, agents: Path, gate: Gate
) -> None:
    """The second send arrives while the first is admitted or its child starting (the gate
    child holds it running): it waits for that admission's answer instead of launching a
    second run (refused, here, by the session's one slot and one spawn)."""
    ctx = launch_context(
        agents,
        session=new_session(),
        max_active_async_runs_per_session=1,
        max_subagent_spawns_per_session=1,
    )
    launch = ctx.single("gate", str(gate.path), True, None)
    launch = launch.model_copy(update={"launch_id": uuid.uuid4().hex})
    answers: list[RunView | SubagentsError] = []

    def send() -> None:
        try:
            answers.append(client.runs.launch(launch))
        except SubagentsError as err:
            answers.append(err)

    senders = [threading.Thread(target=send) for _ in range(2)]
    for sender in senders:
        sender.start()
    [held] = gate.accept(1, timeout=WAIT_S)
    for sender in senders:
        sender.join(WAIT_S)

    assert all(isinstance(a, RunView) for a in answers) and len(answers) == 2, answers
    first, second = (a.run_id for a in answers if isinstance(a, RunView))
    assert first == second
    assert [r.run_id for r in client.runs.list(session_id=launch.session_id)] == [first]
    held.release(0)
    assert client.runs.wait(first, timeout=WAIT_S).state == "complete"
    assert client.session.spawn_snapshot(launch.session_id).used == 1


@pytest.mark.parametrize("launch_id", ["x" * 65, "-starts-with-a-dash", "a b", ""])
def test_a_launch_id_out_of_bounds_is_refused_in_one_line_and_launches_nothing(
    client: Client, agents: Path, launch_id: str
) -> None:
    """At most 64 letters, digits, '.', '_' or '-', the first a letter or digit."""
    launch = capped_launch(agents).model_copy(update={"launch_id": launch_id})  # not validated

    with pytest.raises(BadRequest) as refused:
        client.ask(launch, LaunchResult)

    assert "launch_id" in refused.value.message and "\n" not in refused.value.message
    assert client.runs.list(session_id=launch.session_id) == []


def test_a_workflow_child_is_sent_again_under_its_key_not_a_launch_id(agents: Path) -> None:
    launch = capped_launch(agents)
    with pytest.raises(ValueError, match="not a launch_id"):
        Launch.model_validate({**launch.model_dump(), "workflow_key": "k", "parent_run_id": "p"})


# -- the clients send a launch again -------------------------------------------------------------

#: Steps after which a lost node may have charged or recorded the launch (the other steps
#: charge what these do, at most).
CLIENT_KILL_POINTS = ("reserve_spawns", "record_run", "answer_launch")


@pytest.mark.slow
@pytest.mark.parametrize("point", CLIENT_KILL_POINTS)
def test_r_spn_5_run_async_rides_out_a_node_lost_mid_launch_with_one_run_charged_once(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, point: str
) -> None:
    """`run --async` with a session spawn cap, its node killed mid-launch: it exited 4
    ("outcome unknown (it may have been applied)"), and running it again charged the session a
    second spawn (with a cap of one: refused). Now it waits for the next node, sends the
    launch again under its launch id, and prints the one run."""
    session = new_session()
    dying = start_node("--faults", state_dir=state_dir, kill_at=point)
    env = {
        **os.environ,
        "SUBAGENTS_MAX_SPAWNS_PER_SESSION": "1",
        "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION": "1",
    }
    args = ["--agents-dir", str(agents), "--cwd", str(state_dir), "--session", session]
    command = [*CLI, "--state-dir", str(state_dir), "run", "--async", *args, "echo", "hi"]
    with subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True, env=env) as cli:
        assert dying.wait_exited(WAIT_S), f"the node did not die at {point}"
        client = start_node(state_dir=state_dir).client(timeout=20)
        out, err = cli.communicate(timeout=WAIT_S)

    assert cli.returncode == 0, err
    [run] = client.runs.list(session_id=session)
    assert out.strip() == run.run_id
    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    assert client.session.spawn_snapshot(session).used == 1


def test_r_spn_5_a_session_owner_killed_after_counting_a_launch_is_asked_again_and_counts_once(
    state_dir: Path, agents: Path
) -> None:
    """The session owner alone is killed (and restarted by the node) after it committed a
    launch's spawn count and before it answered. The run supervisor's request waited out its
    deadline and the launch failed (`OwnerUnavailable`), its spawn counted for good: with a cap
    of one, the session could launch nothing more. It sends the request again under the
    launch's reservation id now, which counts nothing more, and the launch goes on."""
    settings = {"owner_call_timeout_s": 2.0, "fault_kill_points": ["owner:spawn_reserved"]}
    with embedded(state_dir, faults=True, settings=settings) as node:
        client = node.client(timeout=30)
        launch = capped_launch(agents)
        run = client.runs.launch(launch)
        [session] = [a for a in node.owner_statuses() if a.name == "session"]
        assert session.restarts == 1, "the session owner was not killed"
        one_run_charged_once(client, launch, run)


def test_r_cap_11_a_capacity_owner_killed_after_taking_a_slot_is_asked_again_and_holds_one(
    state_dir: Path, agents: Path
) -> None:
    """The capacity owner alone is killed (and restarted by the node) after it committed a
    launch's slot and before it answered. The launch failed ("capacity restarted with
    capacity.acquire in flight"), and the slot it had taken stayed held until its TTL, which
    the restarted owner re-arms in full: with a limit of one, the session could launch nothing
    for a minute or more (found by a soak that killed an owner every 40 s: never). The run
    supervisor sends the acquire again under its id now, which is answered with the slot
    taken, and the launch goes on holding that one slot."""
    with launched_past_a_killed_owner(state_dir, agents, "capacity:slot_acquired") as launched:
        client, launch, run = launched
        [holder] = client.capacity.holders(launch.session_id).holders
        assert holder.owner is not None and holder.owner.run_id == run.run_id
        one_run_charged_once(client, launch, run)


def test_r_fan_2_a_fanout_owner_killed_after_making_a_launchs_budget_is_asked_again(
    state_dir: Path, agents: Path
) -> None:
    """The fan-out owner alone is killed after it committed a new launch's budget and before
    it answered: the launch failed ("fanout restarted with fanout.create in flight"). The run
    supervisor asks again now (a second budget; the first, named to no one, counts nothing)
    and the launch goes on."""
    with launched_past_a_killed_owner(state_dir, agents, "fanout:budget_created") as launched:
        one_run_charged_once(*launched)


def test_r_fan_15_a_fanout_owner_killed_after_a_top_level_launchs_claim_is_asked_again(
    state_dir: Path, agents: Path
) -> None:
    """A top-level launch claims its paths on the budget its admission made. That claim took
    no id, so a fan-out owner killed after committing it and before answering failed the launch
    ("fanout restarted with fanout.claim in flight": a soak's resume met the same with its
    empty batch). It is made under an id now, sent again, counted once, and the launch goes
    on."""
    with launched_past_a_killed_owner(state_dir, agents, "fanout:claim_recorded") as launched:
        client, _, run = launched
        assert client.fanout.snapshot(decode_descriptor(run.fanout_descriptor)).used == 1
        one_run_charged_once(*launched)


def test_a_ledger_owner_restarted_mid_admission_is_noticed_in_a_second_not_at_the_deadline(
    state_dir: Path, agents: Path
) -> None:
    """The same kill, with a call deadline longer than the client's own timeout: the run
    supervisor sees the session owner's socket file replaced (its successor bound a new one)
    within a second, sends its request again, and the launch is answered in time. Before, it
    waited out the deadline (15 s by default) whatever had happened to the owner."""
    point = "session:spawn_reserved"
    with launched_past_a_killed_owner(state_dir, agents, point, call_timeout_s=60.0) as launched:
        one_run_charged_once(*launched)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["reserve_spawns", "answer_launch"])
def test_r_spn_5_a_foreground_run_whose_node_dies_mid_launch_starts_a_node_and_is_one_run(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, point: str
) -> None:
    """A foreground `run` whose (detached) node was killed mid-launch waited NODE_BACK_S for
    another node, then exited 4 ("outcome unknown"); run again, it charged a second spawn.
    It starts a node of its own at once now (as it does when none runs), sends the launch
    again there under its launch id, and follows the one run to its end."""
    session = new_session()
    dying = start_node("--faults", state_dir=state_dir, kill_at=point)
    env = {**os.environ, "SUBAGENTS_MAX_SPAWNS_PER_SESSION": "1"}
    args = ["--agents-dir", str(agents), "--cwd", str(state_dir), "--session", session]
    command = [*CLI, "--state-dir", str(state_dir), "run", *args, "echo", "hi"]
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=WAIT_S * 3)
    took = time.monotonic() - began

    assert done.returncode == 0, done.stderr
    assert dying.wait_exited(WAIT_S), f"the node did not die at {point}"
    assert took < NODE_BACK_S, f"{took:.1f} s: it waited for another node to start"
    client = start_node(state_dir=state_dir).client(timeout=20)
    [run] = client.runs.list(session_id=session)
    assert (run.state, run.background) == ("complete", False)
    assert client.session.spawn_snapshot(session).used == 1


@pytest.mark.slow
def test_the_asyncio_client_sends_a_launch_again_on_the_next_node_once(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """`AsyncClient.runs.launch` as the blocking client's: the node killed once the run was
    recorded (its answer lost), the launch is sent to the next node and answered there with
    that run."""
    launch = capped_launch(agents).model_copy(update={"launch_id": None})  # the client's own
    dying = start_node("--faults", state_dir=state_dir, kill_at="answer_launch")
    answer: list[RunView] = []

    async def send() -> None:
        async with AsyncClient(dying.address, timeout=10) as client:
            answer.append(await client.runs.launch(launch))

    sender = threading.Thread(target=asyncio.run, args=(send(),))
    sender.start()
    assert dying.wait_exited(WAIT_S), "the node did not die at answer_launch"
    client = start_node(state_dir=state_dir).client(timeout=20)
    sender.join(WAIT_S)

    [run] = client.runs.list(session_id=launch.session_id)
    assert [view.run_id for view in answer] == [run.run_id]
    assert client.runs.wait(run.run_id, timeout=WAIT_S).state == "complete"
    assert client.session.spawn_snapshot(launch.session_id).used == 1


@pytest.mark.slow
@pytest.mark.parametrize("ended_by", ["cancel", "aclose"])
def test_an_asyncio_launch_ended_while_it_waits_for_the_next_node_ends_at_once(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, ended_by: str
) -> None:
    """The wait for the next node runs in a thread (`asyncio.to_thread`). A cancel ended the
    launch at once but not that thread, and `asyncio.run` waits for its executor's threads as
    it ends: a program whose launch was cancelled (or that was interrupted) could not end for
    up to NODE_BACK_S (30 s) more. A client closed meanwhile (`aclose`) made the launch wait
    those 30 s, then raise its NodeTimeout, not "this client is closed" at once (docs/api.md,
    "Launching again"). Either now ends the thread's wait too."""
    dying = start_node("--faults", state_dir=state_dir, kill_at="answer_launch")

    async def ended_in_the_wait() -> None:
        client = AsyncClient(dying.address, timeout=10)
        launching = asyncio.create_task(client.runs.launch(capped_launch(agents)))
        deadline = time.monotonic() + WAIT_S  # every wait below is bounded
        while client.transport.outstanding == 0 and time.monotonic() < deadline:  # sent
            await asyncio.sleep(0.01)
        # Its answer lost with the node: the call leaves the table and, in the same step,
        # the launch starts its wait for the next node.
        while client.transport.outstanding == 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not launching.done(), launching
        began = time.monotonic()
        if ended_by == "cancel":
            launching.cancel()
            with pytest.raises(asyncio.CancelledError):
                await launching
        else:
            await client.aclose()
            with pytest.raises(NodeNotRunning, match=CLOSED):
                await launching
        assert time.monotonic() - began < 5, "the launch went on waiting for the next node"

    began = time.monotonic()
    asyncio.run(ended_in_the_wait())
    took = time.monotonic() - began
    assert dying.wait_exited(WAIT_S), "the node did not die at answer_launch"
    assert took < NODE_BACK_S / 2, f"asyncio.run ended {took:.1f} s after the launch began"


def _in_function(thread: threading.Thread, name: str) -> bool:
    """Whether `thread` is inside a call of function `name` now (read from its stack: nothing
    announces it)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back
    return False


@pytest.mark.slow
def test_a_launch_whose_client_is_closed_while_it_waits_for_the_next_node_says_so_at_once(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path
) -> None:
    """docs/api.md, "Launching again": a client closed meanwhile waits for no node. A close
    from another thread (or a signal handler) while the launch waited for the state dir's next
    node left that wait to run out: 30 s (NODE_BACK_S), then "this client is closed"."""
    dying = start_node("--faults", state_dir=state_dir, kill_at="answer_launch")
    client = Client(ZmqTransport(dying.address), timeout=10)
    outcome: list[BaseException] = []

    def launch() -> None:
        try:
            client.runs.launch(capped_launch(agents))
        except BaseException as err:
            outcome.append(err)

    launching = threading.Thread(target=launch)
    launching.start()
    assert dying.wait_exited(WAIT_S), "the node did not die at answer_launch"
    wait_until(lambda: _in_function(launching, "wait_for_node"), WAIT_S, "the wait for a node")
    began = time.monotonic()
    client.close()
    launching.join(WAIT_S)
    assert time.monotonic() - began < 5, "the launch went on waiting for the next node"
    assert len(outcome) == 1 and isinstance(outcome[0], NodeNotRunning), outcome
    assert str(outcome[0]) == CLOSED


T = TypeVar("T")
CLOSED = "this client is closed"


class _ClosedAsItSendsAgain(Client):
    """A client whose first send times out at once (timeout 0: the node got the launch, its
    answer is not waited for) and whose caller closes it as `runs.launch` sends it again."""

    sends = 0

    def perform(self, plan: Plan[T]) -> T:
        self.sends += 1
        if self.sends == 2:
            self.close()
        return super().perform(plan)


def test_a_launch_whose_client_is_closed_as_it_is_sent_again_says_so_at_once(
    state_dir: Path, agents: Path
) -> None:
    """The closed client's NodeNotRunning was read as a node that went: the launch waited 30 s
    (NODE_BACK_S) for the next node, pinging through the closed client, which could never
    answer, then raised its first NodeTimeout."""
    with embedded(state_dir) as node:
        client = _ClosedAsItSendsAgain(ZmqTransport(node.address), timeout=0)
        began = time.monotonic()
        with pytest.raises(NodeNotRunning, match=CLOSED):
            client.runs.launch(capped_launch(agents))
        assert time.monotonic() - began < 5, "it waited for another node"
        assert client.sends == 2


class _AsyncClosedWhileItSendsAgain(AsyncClient):
    """The asyncio twin: its second send is on the wire (with a timeout of 10 s) when its
    caller closes it."""

    sends = 0

    async def perform(self, plan: Plan[T]) -> T:
        self.sends += 1
        if self.sends == 2:
            self.timeout = 10.0
            asyncio.get_running_loop().create_task(self._close_once_sent())
        return await super().perform(plan)

    async def _close_once_sent(self) -> None:
        while self.transport.outstanding == 0:
            await asyncio.sleep(0)
        await self.aclose()


def test_an_async_launch_whose_client_is_closed_as_it_is_sent_again_says_so_at_once(
    state_dir: Path, agents: Path
) -> None:
    """It sent the launch again through the closed client until its sends were spent, then
    raised its first NodeTimeout: an unknown outcome, for a client its own caller closed."""

    async def go(address: str) -> None:
        client = _AsyncClosedWhileItSendsAgain(address, timeout=0)
        with pytest.raises(NodeNotRunning, match=CLOSED):
            await client.runs.launch(capped_launch(agents))
        assert client.sends == 2

    with embedded(state_dir) as node:
        asyncio.run(go(node.address))
