"""Launch admission: capacity, fan-out and spawn budgets, rollback points, bad input (SPEC §8).

R-ADM-1's early exits and R-ADM-2's rollback points, observed from outside: a refused launch
leaves the capacity pool, the spawn counters and the fan-out budget exactly as they were (the
tests compare snapshots), and no run record or process behind. Rollback points that cannot be
reached from outside deterministically are reached with the admission's fault-injection hook
(`fault_points`, honoured only by a node started with faults). Real processes throughout,
including nested `run` commands launched by agents through $SUBAGENTS_NODE.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from subagents_node.actors.runs.admission import FAULT_POINTS
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import (
    AgentCommandNotFound,
    AgentNotFound,
    CapacityExhausted,
    CapacityOwnershipChanged,
    FanoutBudgetUnavailable,
    FanoutDescriptorInvalid,
    FanoutLimitExceeded,
    InjectedFault,
    InvalidTimeout,
    NestedCallBlocked,
    PreviousUnavailable,
    RunCwdMissing,
    RunStorageFailed,
    SpawnBudgetExceeded,
    SubagentsError,
    TaskUndeliverable,
)
from subagents_node.messages.fanout import FanoutDescriptor, decode_descriptor, encode_descriptor
from subagents_node.messages.supervisor import AgentPlan, ChainStep, Launch, RunView, TaskItem
from subagents_node.node.node import Node
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import gate as gate
from tests.support.runs import (
    Gate,
    launch_context,
    ledgers,
    new_session,
    process_gone,
    stop_active_runs,
    wait_until,
    write_agent,
)

StartNode = Callable[..., Node]


@pytest.fixture
def start_embedded(state_dir: Path) -> Iterator[StartNode]:
    """Factory: an embedded node on the test's state dir with the given NodeOptions."""
    with ExitStack() as stack:

        def start(**options: Any) -> Node:
            node = stack.enter_context(Node.embedded(state_dir=state_dir, **options))
            stack.callback(stop_active_runs, node.client())  # before the node stops
            return node

        yield start


@pytest.fixture
def client(start_embedded: StartNode) -> Client:
    return start_embedded().client()


def echo_items(ctx: LaunchContext, count: int) -> list[TaskItem]:
    return [TaskItem(agent=ctx.plan("echo"), task=f"task {i}") for i in range(count)]


def assert_slot_is_free(client: Client, session: str) -> None:
    """The pool has room for one more: acquire it, then give it back."""
    handle = client.capacity.acquire(session, 1, "probe-run")
    assert handle is not None
    assert handle.rollback()


# -- capacity -------------------------------------------------------------------------------------


def test_r_cap_9_a_session_limit_of_2_admits_2_of_5_background_launches_and_frees_slots_as_runs_end(
    client: Client, agents: Path, gate: Gate
) -> None:
    """R-ADM-7 too: each admitted launch reports the capacity snapshot its acquire left, and
    each refusal carries the error's snapshot."""
    ctx = launch_context(agents, max_active_async_runs_per_session=2)
    admitted: list[RunView] = []
    refused: list[CapacityExhausted] = []
    for _ in range(5):
        try:
            admitted.append(client.runs.launch(ctx.single("gate", str(gate.path), True, None)))
        except CapacityExhausted as err:
            refused.append(err)

    assert len(admitted) == 2 and len(refused) == 3
    assert [(r.snapshots.capacity_used, r.snapshots.capacity_limit) for r in admitted] == [
        (1, 2),
        (2, 2),
    ]
    for err in refused:
        assert (err.used, err.limit) == (2, 2)
        assert err.message == "Active async run capacity exhausted: 2/2 used."
    assert {r.run_id for r in client.runs.list()} == {r.run_id for r in admitted}

    first, second = gate.accept(2)
    first.release(0)
    first.wait_exit()
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 2).used == 1, what="one slot")
    later = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    assert (later.snapshots.capacity_used, later.snapshots.capacity_limit) == (2, 2)
    [third] = gate.accept(1)
    with pytest.raises(CapacityExhausted):
        client.runs.launch(ctx.single("gate", str(gate.path), True, None))

    second.release(0)
    third.release(0)
    for run in (*admitted, later):
        assert client.runs.wait(run.run_id, timeout=20).state == "complete"
    wait_until(lambda: client.capacity.snapshot(ctx.session_id, 2).used == 0, what="all freed")


def test_r_top_7_foreground_runs_are_admitted_while_the_sessions_capacity_is_full(
    client: Client, agents: Path, gate: Gate
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    holder = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)

    foreground = client.runs.launch(ctx.single("echo", "not charged", False, None))
    done = client.runs.wait(foreground.run_id, timeout=20)

    assert done.state == "complete" and done.snapshots.capacity_used is None
    assert client.capacity.snapshot(ctx.session_id, 1).used == 1
    held.release(0)
    assert client.runs.wait(holder.run_id, timeout=20).state == "complete"


# -- rollback points (R-ADM-2, R-ADM-3) -----------------------------------------------------------


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_r_adm_2_a_failure_injected_at_each_rollback_point_leaves_no_slot_behind(
    start_embedded: StartNode, agents: Path, point: str, state_dir: Path
) -> None:
    """R-ADM-2/3, and R-ADM-6's registry: a launch that failed before its run was recorded
    leaves no run record and no run directory behind (nothing a lookup could find)."""
    client = start_embedded(faults=True, settings={"fault_points": [point]}).client()
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    before = ledgers(client, ctx.session_id, 1)

    with pytest.raises(InjectedFault) as refused:
        client.runs.launch(ctx.single("sleeper", "seconds=60", True, None))

    assert refused.value.point == point
    after = ledgers(client, ctx.session_id, 1)
    assert after.capacity == before.capacity
    assert_slot_is_free(client, ctx.session_id)
    if point != "mark_started":
        assert after.runs == before.runs == ()
        # Nor a run directory no record names (prune would never find it).
        runs_dir = state_dir / "runs"
        assert not runs_dir.exists() or not any(runs_dir.iterdir())
        return
    # R-ADM-5: the run was recorded and its child started before mark_started failed; a launch
    # that reports an error must not leave it running.
    [run_id] = after.runs
    done = client.runs.wait(run_id, timeout=20)
    assert (done.state, done.error) == ("failed", refused.value.message)
    assert [c.state for c in done.children] == ["stopped"]
    assert done.children[0].pid is None or process_gone(done.children[0].pid)


def test_r_adm_5_a_mark_started_refused_by_the_ledger_fails_the_launch_and_stops_its_run(
    start_embedded: StartNode, agents: Path
) -> None:
    """A reservation TTL far shorter than admission: the ledger expires the slot before the run
    reports its start, so mark_started is refused (ownership changed) after the child started."""
    client = start_embedded(settings={"reservation_ttl_s": 1e-6}).client()
    ctx = launch_context(agents, max_active_async_runs_per_session=1)

    with pytest.raises(CapacityOwnershipChanged):
        client.runs.launch(ctx.single("sleeper", "seconds=60", True, None))

    [run] = client.runs.list()
    done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "failed" and "ownership changed" in done.error
    assert [c.state for c in done.children] == ["stopped"]
    assert client.capacity.snapshot(ctx.session_id, 1).used == 0


def test_fault_points_are_ignored_by_a_node_started_without_faults(
    start_embedded: StartNode, agents: Path
) -> None:
    client = start_embedded(settings={"fault_points": list(FAULT_POINTS)}).client()
    ctx = launch_context(agents)

    run = client.runs.launch(ctx.single("echo", "admitted", True, None))

    assert client.runs.wait(run.run_id, timeout=20).state == "complete"


def test_r_adm_2_run_dir_creation_failure_rolls_the_slot_back(
    client: Client, agents: Path, state_dir: Path
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=1)
    (state_dir / "runs").write_text("a file where the runs directory belongs")
    before = ledgers(client, ctx.session_id, 1)

    with pytest.raises(RunStorageFailed, match="Failed to create run storage"):
        client.runs.launch(ctx.single("echo", "x", True, None))

    assert ledgers(client, ctx.session_id, 1).capacity == before.capacity
    (state_dir / "runs").unlink()
    run = client.runs.launch(ctx.single("echo", "now it fits", True, None))
    assert run.snapshots.capacity_used == 1  # the slot the failed launch held was free again
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"


def test_r_fan_16_a_budget_claim_rejection_rolls_the_slot_back_and_starts_nothing(
    client: Client, agents: Path
) -> None:
    ctx = launch_context(agents, max_active_async_runs_per_session=1, max_subagent_spawns_per_run=1)
    launch = ctx.launch("parallel", True, items=echo_items(ctx, 2))
    before = ledgers(client, ctx.session_id, 1)

    with pytest.raises(FanoutLimitExceeded) as refused:
        client.runs.launch(launch)

    rejection = refused.value.rejection
    assert (rejection.path, rejection.requested, rejection.used) == ("tasks[1]", 2, 0)
    assert (rejection.limit, rejection.remaining) == (1, 1)
    assert refused.value.message.startswith(
        "Run fan-out limit reached at tasks[1] (0/1 used; 2 requested, 1 remaining). "
        "No children from this admission group were started."
    )
    after = ledgers(client, ctx.session_id, 1)
    assert (after.capacity, after.runs) == (before.capacity, ())
    assert_slot_is_free(client, ctx.session_id)


def test_r_spn_4_a_session_spawn_preflight_refusal_takes_no_slot(
    client: Client, agents: Path
) -> None:
    ctx = launch_context(
        agents, max_active_async_runs_per_session=1, max_subagent_spawns_per_session=2
    )

    with pytest.raises(SpawnBudgetExceeded, match=r"\(0/2 used, 3 requested\)"):
        client.runs.launch(ctx.launch("parallel", True, items=echo_items(ctx, 3)))

    assert client.capacity.snapshot(ctx.session_id, 1).used == 0
    assert client.session.spawn_snapshot(ctx.session_id).used == 0
    assert client.runs.list() == []


# -- bad input: early exits that change nothing (R-ADM-1) -----------------------------------------


@dataclass(frozen=True)
class BadInput:
    error: type[SubagentsError]
    message: str
    build: Callable[[LaunchContext], Launch]
    env: tuple[tuple[str, str], ...] = ()


def _missing_cwd(ctx: LaunchContext) -> Launch:
    item = TaskItem(agent=ctx.plan("echo"), task="x", cwd="no/such/directory")
    return ctx.launch("single", True, items=[item])


def _previous_first(ctx: LaunchContext) -> Launch:
    step = ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="after {previous}")])
    return ctx.launch("chain", True, chain=[step])


def _missing_command(ctx: LaunchContext) -> Launch:
    agent = AgentPlan(name="ghost", command=["/no/such/program"])
    return ctx.launch("single", True, items=[TaskItem(agent=agent, task="x")])


def _argv_task(task: str) -> Callable[[LaunchContext], Launch]:
    """A parallel launch whose second task rides in argv (`--prompt={task}`) and cannot."""

    def build(ctx: LaunchContext) -> Launch:
        agent = AgentPlan(
            name="argv", command=["/bin/echo", "--prompt={task}"], task_delivery="argv"
        )
        items = [TaskItem(agent=agent, task="fine"), TaskItem(agent=agent, task=task)]
        return ctx.launch("parallel", True, items=items)

    return build


BAD_INPUT = {
    "unknown agent": BadInput(
        AgentNotFound,
        "Unknown agent 'no-such-agent'. Available agents: ",
        lambda ctx: ctx.single("no-such-agent", "x", True, None),
    ),
    "missing cwd": BadInput(RunCwdMissing, "working directory does not exist: ", _missing_cwd),
    # Read from the run supervisor's directory (`/`): its children ran in `/`, not the caller's.
    "relative launch cwd": BadInput(
        RunCwdMissing,
        "working directory is not usable: it is a relative path, and the node's own directory",
        lambda ctx: ctx.single("echo", "x", True, None).model_copy(update={"cwd": "."}),
    ),
    "command not found": BadInput(
        AgentCommandNotFound,
        "Agent 'ghost': command '/no/such/program' not found",
        _missing_command,
    ),
    # exec(2) would refuse these after the claims were made: a child failed, a unit spent.
    "task with a NUL in argv": BadInput(
        TaskUndeliverable,
        "Task tasks[1] cannot be passed to agent 'argv' in its arguments: it contains a NUL",
        _argv_task("before\x00after"),
    ),
    "task over the argument limit": BadInput(
        TaskUndeliverable,
        "Task tasks[1] cannot be passed to agent 'argv' in its arguments: the argument would be "
        "131,081 bytes, over Linux's 131,071; use task_delivery: file or stdin",
        _argv_task("x" * 131_072),
    ),
    "timeout zero": BadInput(
        InvalidTimeout,
        "timeout_ms must be a positive integer.",
        lambda ctx: ctx.single("echo", "x", True, 0),
    ),
    "timeout too large": BadInput(
        InvalidTimeout,
        "timeout_ms must be at most 2147483647 ms.",
        lambda ctx: ctx.single("echo", "x", True, 2**31),
    ),
    "previous with nothing before it": BadInput(
        PreviousUnavailable, "{previous} in the first chain step", _previous_first
    ),
    "depth at the maximum": BadInput(
        NestedCallBlocked,
        "Nested subagent call blocked (depth=2, max=2).",
        lambda ctx: ctx.single("echo", "x", True, None),
        (("SUBAGENTS_DEPTH", "2"), ("SUBAGENTS_MAX_DEPTH", "2")),
    ),
}


@pytest.mark.parametrize("nested", [False, True], ids=["top-level", "nested"])
@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_r_adm_1_bad_input_is_refused_before_any_process_starts_and_changes_no_ledger(
    client: Client, agents: Path, case: str, nested: bool
) -> None:
    """Top-level launches are compared on capacity and spawns; nested ones on their budget."""
    bad = BAD_INPUT[case]
    session = new_session()
    budget: FanoutDescriptor | None = None
    env = {"SUBAGENTS_MAX_DEPTH": "3"}
    if nested:
        budget = client.fanout.create(f"root-{session}", 10)
        env |= {"SUBAGENTS_DEPTH": "1", "SUBAGENTS_RUN_FANOUT": encode_descriptor(budget)}
    limits = {"max_active_async_runs_per_session": 1, "max_subagent_spawns_per_session": 10}
    good = launch_context(agents, session=session, env=env, **limits)
    warmup = client.runs.launch(good.single("echo", "opens the session", True, None))
    assert client.runs.wait(warmup.run_id, timeout=20).state == "complete"
    wait_until(lambda: client.capacity.snapshot(session, 1).used == 0, what="warm-up released")
    before = ledgers(client, session, 1, budget)
    assert before.spawns.used == 1
    assert before.budget is None or before.budget.used == 1  # the warm-up's claim

    ctx = launch_context(agents, session=session, env=env | dict(bad.env), **limits)
    with pytest.raises(bad.error) as refused:
        client.runs.launch(bad.build(ctx))

    assert bad.message in refused.value.message
    assert ledgers(client, session, 1, budget) == before


@pytest.mark.parametrize(
    ("descriptor", "error", "message"),
    [
        ("not a descriptor!", FanoutDescriptorInvalid, "Invalid inherited run fan-out budget: "),
        (
            encode_descriptor(FanoutDescriptor(root_run_id="gone", budget_id="gone-1", limit=5)),
            FanoutBudgetUnavailable,
            "Run fan-out budget directory is unavailable: unknown budget gone-1",
        ),
    ],
    ids=["undecodable", "unknown budget"],
)
def test_r_fan_5_an_unusable_inherited_budget_is_refused_and_charges_nothing(
    client: Client,
    agents: Path,
    descriptor: str,
    error: type[SubagentsError],
    message: str,
) -> None:
    env = {"SUBAGENTS_DEPTH": "1", "SUBAGENTS_MAX_DEPTH": "3", "SUBAGENTS_RUN_FANOUT": descriptor}
    ctx = launch_context(agents, env=env, max_subagent_spawns_per_session=10)
    client.session.open(ctx.session_id, configured_limit=10)
    before = ledgers(client, ctx.session_id, 1)

    with pytest.raises(error, match=re.escape(message)):
        client.runs.launch(ctx.single("echo", "x", True, None))

    assert ledgers(client, ctx.session_id, 1) == before


# -- nested launches from inside children (R-FAN-4/8/12/16, R-CFG-8) ------------------------------

LAUNCH_WRAPPER = '''\
"""Runs `python -m subagents_node run ARGS` and keeps what it printed, for the test to read."""
import json, os, subprocess, sys, uuid

done = subprocess.run(
    [sys.executable, "-m", "subagents_node", "run", *sys.argv[1:]], capture_output=True, text=True
)
record = {"rc": done.returncode, "stderr": done.stderr, "depth": os.environ["SUBAGENTS_DEPTH"]}
log = os.path.join(os.environ["LAUNCH_LOG_DIR"], uuid.uuid4().hex + ".json")
with open(log, "w") as fh:
    json.dump(record, fh)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
sys.exit(done.returncode)
'''


@pytest.mark.slow
def test_r_fan_16_a_recursive_agent_is_stopped_by_the_budget_after_exactly_limit_launches(
    client: Client, agents: Path, state_dir: Path
) -> None:
    """depth=2 width=2 asks for 1 + 2 + 4 launches; a budget of 4 admits the root, both
    children and exactly one of the four grandchildren, all or nothing per launch. Each nested
    launch of a fan-out child claims its own static path, `single`, under the child's (R-FAN-22)."""
    logs = state_dir / "launches"
    logs.mkdir()
    wrapper = state_dir / "launch.py"
    wrapper.write_text(LAUNCH_WRAPPER)
    env = {
        "SUBAGENTS_MAX_DEPTH": "4",  # the default (2) would refuse the grandchildren's launches
        "SUBAGENTS_MAX_SPAWNS_PER_RUN": "4",
        "SUBAGENTS_LAUNCH": json.dumps([sys.executable, str(wrapper)]),
        "LAUNCH_LOG_DIR": str(logs),
    }
    ctx = launch_context(agents, env=env, cwd=state_dir)

    run = client.runs.launch(ctx.single("recursive", "depth=2 width=2", False, None))
    done = client.runs.wait(run.run_id, timeout=90)

    assert done.state == "complete", done.error
    assert "admitted=2 refused=0 failed=0 subtree_admitted=3 subtree_refused=3" in done.output
    budget = client.fanout.snapshot(decode_descriptor(done.fanout_descriptor))
    assert (budget.used, budget.limit, budget.remaining) == (4, 4, 0)
    tree = client.runs.list(root_run_id=done.root_run_id)
    assert len(tree) == 4 and sorted(r.depth for r in tree) == [0, 1, 1, 2]
    launches = [json.loads(p.read_text()) for p in logs.iterdir()]
    refused = [entry for entry in launches if entry["rc"] != 0]
    assert len(launches) == 6 and len(refused) == 3
    for entry in refused:
        assert entry["depth"] == "2"
        text = entry["stderr"]
        assert re.search(
            r"Run fan-out limit reached at single/[0-9a-f]{8}/single/[0-9a-f]{8}/single "
            r"\(4/4 used; 1 requested, 0 remaining\)\. No children from this admission group "
            r"were started\.",
            text,
        ), text


def test_r_fan_4_a_child_whose_agent_lacks_fanout_may_not_launch_subagents(
    client: Client, agents: Path
) -> None:
    command = json.dumps(
        ["{python}", "-m", "subagents_node", "run", "--agents-dir", str(agents), "echo", "{task}"]
    )
    write_agent(agents, "launcher", "Tries to launch echo.", command)
    ctx = launch_context(agents, env={"SUBAGENTS_MAX_DEPTH": "4"})

    done = client.runs.wait(
        client.runs.launch(ctx.single("launcher", "nested", False, None)).run_id, timeout=30
    )

    assert done.state == "failed"
    assert "may not launch subagents" in done.error
    assert client.runs.list() == [done]  # the nested launch recorded no run
