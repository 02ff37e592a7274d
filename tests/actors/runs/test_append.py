"""Chain append: steps queued on a running background chain (SPEC §11 R-APP, INV-APP-1).

An append's fan-out claims are reserved, its record is made durable, and only then are the
claims committed (R-APP-4), so the claims exist iff the append does: the tests read both from
the node's store (`run_appends` and the fan-out owner's claims and reservations). Appends that
race for the last claims of a budget are admitted exactly as far as they fit, all or nothing
(R-FAN-13); appended steps run after the steps already queued, in order (R-APP-6); an append to
anything but a running background chain is refused and changes nothing (R-APP-1).

Embedded node, real children; the racing appends come from separate ZeroMQ clients.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from subagents_node.actors.runs.management import RECORD_APPEND
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import (
    AgentCommandNotFound,
    AppendRejected,
    FanoutLimitExceeded,
    InjectedFault,
    OwnerUnavailable,
    RunCwdMissing,
    RunNotFound,
    SubagentsError,
    TaskUndeliverable,
)
from subagents_node.messages.fanout import FanoutDescriptor, decode_descriptor
from subagents_node.messages.lineage import Append, AppendResult
from subagents_node.messages.supervisor import ChainStep, RunView, TaskItem
from subagents_node.node.node import Node
from tests.support.manage import embedded, store_rows
from tests.support.nodes import NodeProcess
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, events_of, launch_context, wait_until


def echo(ctx: LaunchContext, *tasks: str) -> ChainStep:
    """A sequential step (one task) or a parallel step (several)."""
    items = [TaskItem(agent=ctx.plan("echo"), task=t) for t in tasks]
    return ChainStep(items=items, parallel=len(items) > 1)


def gated_chain(
    client: Client, ctx: LaunchContext, gate: Gate, *later: ChainStep, background: bool = True
) -> RunView:
    """A chain whose first step waits at the gate (so the chain stays running), then `later`."""
    first = ChainStep(items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))])
    run = client.runs.launch(ctx.launch("chain", background, chain=[first, *later]))
    gate.accept(1)
    return run


def append(client: Client, run_id: str, *steps: ChainStep) -> AppendResult:
    return client.ask(Append(run_id=run_id, steps=list(steps)), AppendResult)


def budget_of(run: RunView) -> FanoutDescriptor:
    return decode_descriptor(run.fanout_descriptor)


def appends_of(state_dir: Path, run_id: str) -> list[tuple[str, int, str]]:
    """The run's append records: (reservation id, step count, state)."""
    return [
        (str(r[0]), int(r[1]), str(r[2]))
        for r in store_rows(
            state_dir,
            "SELECT reservation_id, steps, state FROM run_appends WHERE run_id=? ORDER BY seq",
            run_id,
        )
    ]


def launch_claim(state_dir: Path, budget: FanoutDescriptor) -> str:
    """The id of the chain's own launch claim: the first reservation on the budget its
    admission made (a top-level launch claims its paths under an id, stored as a reservation
    committed at once: actors/runs/admission.py)."""
    [(first,)] = store_rows(
        state_dir,
        "SELECT reservation_id FROM fanout_reservations WHERE budget_id=? "
        "ORDER BY created_at, rowid LIMIT 1",
        budget.budget_id,
        owner="fanout",
    )
    return str(first)


def reserved_claims(state_dir: Path, budget: FanoutDescriptor) -> dict[str, list[str]]:
    """The budget's claims made through reservations after its launch's own, by reservation
    id, in claim order."""
    launched = launch_claim(state_dir, budget)
    claims: dict[str, list[str]] = {}
    for reservation, path in store_rows(
        state_dir,
        "SELECT reservation_id, path FROM fanout_claims "
        "WHERE budget_id=? AND reservation_id IS NOT NULL ORDER BY seq",
        budget.budget_id,
        owner="fanout",
    ):
        if str(reservation) != launched:
            claims.setdefault(str(reservation), []).append(str(path))
    return claims


def reservations(state_dir: Path, budget: FanoutDescriptor) -> dict[str, str]:
    """The budget's reservations but its launch's own claim (the appends')."""
    launched = launch_claim(state_dir, budget)
    rows = store_rows(
        state_dir,
        "SELECT reservation_id, state FROM fanout_reservations WHERE budget_id=?",
        budget.budget_id,
        owner="fanout",
    )
    return {str(r[0]): str(r[1]) for r in rows if str(r[0]) != launched}


def chain_facts(client: Client, run: RunView) -> tuple[object, ...]:
    """What an append would change: the run's steps and events, and its budget's usage."""
    view = client.runs.show(run.run_id)
    kinds = [e.kind for e in events_of(client, run.run_id) if e.kind != "child.started"]
    return (
        view.state,
        [c.label for c in view.children],
        kinds,
        client.fanout.snapshot(budget_of(run)),
    )


# -- racing appends (R-APP-4, R-FAN-13, INV-APP-1) -------------------------------------------------


def test_r_app_4_two_appends_racing_for_a_nearly_full_budget_admit_exactly_the_one_that_fits(
    node: Node, client: Client, agents: Path, gate: Gate, state_dir: Path
) -> None:
    """R-FAN-22: a chain append claims its own steps' paths (`chain[1]`, `chain[2]`) on the
    chain's budget, when it is appended, not at the chain's admission."""
    ctx = launch_context(agents, max_subagent_spawns_per_run=4)
    run = gated_chain(client, ctx, gate)
    budget = budget_of(run)
    assert client.fanout.snapshot(budget).remaining == 3  # room for one 2-step append, not two

    barrier = threading.Barrier(2)
    outcomes: dict[str, AppendResult | SubagentsError] = {}

    def racer(name: str) -> None:
        with node.client("zmq") as own:
            barrier.wait(timeout=10)
            try:
                outcomes[name] = append(
                    own, run.run_id, echo(ctx, f"{name}1"), echo(ctx, f"{name}2")
                )
            except SubagentsError as err:
                outcomes[name] = err

    threads = [threading.Thread(target=racer, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)

    admitted = [n for n, o in outcomes.items() if isinstance(o, AppendResult)]
    refused = [o for o in outcomes.values() if isinstance(o, FanoutLimitExceeded)]
    assert len(admitted) == 1 and len(refused) == 1, outcomes
    [winner], [loser] = admitted, refused
    assert loser.message == (
        f"Failed to append step to chain run {run.run_id}: Run fan-out limit reached at chain[4] "
        "(3/4 used; 2 requested, 1 remaining). No children from this admission group were "
        "started. Start a new top-level run or raise max_subagent_spawns_per_run."
    )
    assert (loser.rejection.used, loser.rejection.remaining) == (3, 1)  # values before the batch
    # INV-APP-1: one append record, one committed reservation, and exactly its claims.
    [(reservation, steps, state)] = appends_of(state_dir, run.run_id)
    assert (steps, state) == (2, "committed")
    assert reservations(state_dir, budget) == {reservation: "committed"}
    assert reserved_claims(state_dir, budget) == {reservation: ["chain[1]", "chain[2]"]}
    assert client.fanout.snapshot(budget).used == 3  # the loser took nothing (all or nothing)

    gate.children[0].release(0)
    done = client.runs.wait(run.run_id, timeout=20)
    assert done.state == "complete"
    assert [(c.label, c.output) for c in done.children[1:]] == [
        ("chain[1]", f"{winner}1"),
        ("chain[2]", f"{winner}2"),
    ]


def test_r_app_4_an_append_whose_record_fails_leaves_no_claims_at_once(
    agents: Path, gate: Gate, state_dir: Path
) -> None:
    """R-APP-4: "A failed write means no claims remain." An append whose record was undone (as a
    full disk undoes the supervisor's commit) was refused, but its reservation stayed pending
    for its TTL (300 s), its claims counted against the whole run tree's budget meanwhile: a
    launch or append that fitted was refused RUN_FANOUT_LIMIT. It is aborted at once now."""
    ctx = launch_context(agents, max_subagent_spawns_per_run=3)
    with embedded(state_dir, faults=True, settings={"fault_points": [RECORD_APPEND]}) as node:
        client = node.client()
        run = gated_chain(client, ctx, gate)
        budget = budget_of(run)
        assert client.fanout.snapshot(budget).used == 1
        with pytest.raises(InjectedFault):
            append(client, run.run_id, echo(ctx, "a1"), echo(ctx, "a2"))
        assert appends_of(state_dir, run.run_id) == []
        assert client.fanout.snapshot(budget).used == 1  # was 3, for 300 s
        assert list(reservations(state_dir, budget).values()) == ["aborted"]
        gate.children[0].release(0)
        assert client.runs.wait(run.run_id, timeout=20).state == "complete"


def test_r_app_4_an_append_whose_reservation_answer_died_with_the_fanout_owner_is_made_once(
    agents: Path, gate: Gate, state_dir: Path
) -> None:
    """The fan-out owner was killed (kill -9) after it recorded an append's reservation and
    before it answered: the append failed "fanout restarted with fanout.reserve in flight",
    and the reservation it never learnt the id of stayed pending for its TTL (300 s), its
    claims counting against the whole run tree's budget (3/3 used: a launch or an append that
    fitted was refused RUN_FANOUT_LIMIT). The supervisor picks the reservation's id now, so the
    reserve is sent again to the restarted owner, which answers the same reservation: the
    append is made once, and its claims are exactly its own."""
    ctx = launch_context(agents, max_subagent_spawns_per_run=4)
    settings = {"fault_kill_points": ["owner:reserve_recorded"]}
    with embedded(state_dir, faults=True, settings=settings) as node:
        client = node.client(timeout=30)
        run = gated_chain(client, ctx, gate)
        budget = budget_of(run)
        restarts = next(a.restarts for a in node.owner_statuses() if a.name == "fanout")
        made = append(client, run.run_id, echo(ctx, "a1"), echo(ctx, "a2"))
        assert made.steps == 2
        assert next(a.restarts for a in node.owner_statuses() if a.name == "fanout") > restarts
        [(reservation, steps, state)] = appends_of(state_dir, run.run_id)
        assert (steps, state) == (2, "committed")
        assert reservations(state_dir, budget) == {reservation: "committed"}
        assert client.fanout.snapshot(budget).used == 3  # 1 + the append's 2, nothing held
        gate.children[0].release(0)
        done = client.runs.wait(run.run_id, timeout=30)
        assert done.state == "complete", done
        assert [c.output for c in done.children[1:]] == ["a1", "a2"]


def test_r_app_4_an_append_the_fanout_owner_never_answered_leaves_no_claims_once_it_is_back(
    agents: Path, gate: Gate, state_dir: Path
) -> None:
    """The same, with the reserve lost each time it is sent (the owner killed again at each
    resend: it recorded the reservation, then never answered): the append fails "unavailable",
    and its reservation held 2 of the budget's 3 claims for its TTL (300 s). Its abort is
    owed through the supervisor's outbox now, sent until the owner answers: once it is back,
    the reservation is aborted and the claims are free (R-APP-4: no append, no claims)."""
    ctx = launch_context(agents, max_subagent_spawns_per_run=3)
    settings = {"fault_kill_points": ["owner:reserve_recorded", "owner:reserve_repeated"]}
    with embedded(state_dir, faults=True, settings=settings) as node:
        client = node.client(timeout=30)
        run = gated_chain(client, ctx, gate)
        budget = budget_of(run)
        with pytest.raises(OwnerUnavailable):
            append(client, run.run_id, echo(ctx, "a1"), echo(ctx, "a2"))
        assert appends_of(state_dir, run.run_id) == []
        wait_until(
            lambda: list(reservations(state_dir, budget).values()) == ["aborted"],
            what="the reservation aborted",
        )
        assert client.fanout.snapshot(budget).used == 1  # was 3, for 300 s
        assert next(a.state for a in node.owner_statuses() if a.name == "fanout") == "running"
        gate.children[0].release(0)
        assert client.runs.wait(run.run_id, timeout=30).state == "complete"


def test_r_app_4_an_append_whose_node_died_with_its_reserve_out_leaves_no_claims_after_restart(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    """The whole node was killed (kill -9) after the fan-out owner recorded an append's
    reservation and before its answer: the append was never recorded nor answered, and the
    restarted node knew nothing of the reservation, which held 2 of the budget's 3 claims for
    its TTL (300 s). Its id is recorded before the reserve is sent now, and the restarted
    node aborts it (R-APP-4: no append, no claims)."""
    ctx = launch_context(agents, max_subagent_spawns_per_run=3)
    dying = start_node("--faults", state_dir=state_dir, kill_at="reserve_recorded")
    run = gated_chain(dying.client(), ctx, gate)
    budget = budget_of(run)
    with pytest.raises(SubagentsError):
        append(dying.client(timeout=5), run.run_id, echo(ctx, "a1"), echo(ctx, "a2"))
    assert dying.wait_exited(10), "the node did not die at reserve_recorded"
    client = start_node(state_dir=state_dir).client()
    wait_until(
        lambda: list(reservations(state_dir, budget).values()) == ["aborted"],
        what="the reservation aborted",
    )
    assert client.fanout.snapshot(budget).used == 1  # was 3, for 300 s
    assert appends_of(state_dir, run.run_id) == []
    gate.children[0].release(0)


# -- order (R-APP-3, R-APP-5, R-APP-6) -------------------------------------------------------------


def test_r_app_6_appended_steps_run_after_the_queued_ones_in_the_order_they_were_appended(
    client: Client, agents: Path, gate: Gate, state_dir: Path
) -> None:
    ctx = launch_context(agents)
    run = gated_chain(client, ctx, gate, echo(ctx, "queued"))
    budget = budget_of(run)

    first = append(client, run.run_id, echo(ctx, "third after {previous}"))
    second = append(client, run.run_id, echo(ctx, "p0", "p1"), echo(ctx, "last after {previous}"))

    assert first.text == (
        f"Append queued for chain run {run.run_id}: 1 step(s). It becomes eligible after the "
        "chain's already-queued steps finish. Pending appends: 0."
    )
    assert (second.steps, second.run_id) == (2, run.run_id)
    # R-APP-3: absolute indices after the run's own steps and earlier appends.
    [(r1, _, _), (r2, _, _)] = appends_of(state_dir, run.run_id)
    assert reserved_claims(state_dir, budget) == {
        r1: ["chain[2]"],
        r2: ["chain[3].parallel[0]", "chain[3].parallel[1]", "chain[4]"],
    }
    assert client.fanout.snapshot(budget).used == 2 + 1 + 3

    gate.children[0].release(0)
    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "complete"
    assert [c.label for c in done.children] == [
        "chain[0]",
        "chain[1]",
        "chain[2]",
        "chain[3].parallel[0]",
        "chain[3].parallel[1]",
        "chain[4]",
    ]
    outputs = {c.label: c.output for c in done.children}
    assert outputs["chain[2]"] == "third after queued"
    assert outputs["chain[4]"] == "last after p0\n\np1"
    assert done.output == "last after p0\n\np1"
    # Each step started only after every child of the step before it had ended.
    steps: dict[int, list[tuple[float, float]]] = {}
    for child in done.children:
        step = int(child.label.split("]")[0].removeprefix("chain["))
        assert child.started_at is not None and child.ended_at is not None
        steps.setdefault(step, []).append((child.started_at, child.ended_at))
    for step in range(1, 5):
        assert min(s for s, _ in steps[step]) >= max(e for _, e in steps[step - 1])


# -- refusals change nothing (R-APP-1) -------------------------------------------------------------


@pytest.mark.parametrize("target", ["finished chain", "background single", "foreground chain"])
def test_r_app_1_append_to_anything_but_a_running_background_chain_is_refused_and_changes_nothing(
    client: Client, agents: Path, gate: Gate, state_dir: Path, target: str
) -> None:
    ctx = launch_context(agents)
    if target == "finished chain":
        run = client.runs.launch(ctx.launch("chain", True, chain=[echo(ctx, "done")]))
        run = client.runs.wait(run.run_id, timeout=20)
        problem = "the run is complete"
    elif target == "background single":
        run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
        gate.accept(1)
        problem = "it is not a background chain run"
    else:
        run = gated_chain(client, ctx, gate, background=False)
        problem = "it is not a background chain run"
    before = chain_facts(client, run)

    with pytest.raises(AppendRejected) as refused:
        append(client, run.run_id, echo(ctx, "x"), echo(ctx, "y", "z"))

    assert refused.value.message == f"Failed to append step to chain run {run.run_id}: {problem}"
    assert chain_facts(client, run) == before
    assert appends_of(state_dir, run.run_id) == []
    assert reservations(state_dir, budget_of(run)) == {}
    for child in gate.children:
        child.release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"


def test_r_app_1_append_to_an_unknown_run_is_refused(client: Client, agents: Path) -> None:
    ctx = launch_context(agents)
    with pytest.raises(RunNotFound):
        append(client, "0123456789ab", echo(ctx, "x"))


@pytest.mark.parametrize("problem", ["nul task", "no cwd", "no command"])
def test_r_app_1_a_step_that_could_never_start_is_refused_before_any_claim(
    client: Client, agents: Path, gate: Gate, state_dir: Path, problem: str
) -> None:
    """Appended steps pass the checks a launch's steps pass (R-ADM-1's validation); they used
    to be queued and claimed, and then failed the whole chain when they came up."""
    ctx = launch_context(agents)
    run = gated_chain(client, ctx, gate)
    item = TaskItem(agent=ctx.plan("echo"), task="fine")
    if problem == "nul task":
        item = item.model_copy(update={"task": "a\x00b"})
        refusal: type[SubagentsError] = TaskUndeliverable
    elif problem == "no cwd":
        item = item.model_copy(update={"cwd": str(state_dir / "no-such-dir")})
        refusal = RunCwdMissing
    else:
        agent = item.agent.model_copy(update={"command": ["/no/such/command", "{task}"]})
        item = item.model_copy(update={"agent": agent})
        refusal = AgentCommandNotFound
    before = chain_facts(client, run)

    with pytest.raises(refusal) as refused:
        append(client, run.run_id, echo(ctx, "ok"), ChainStep(items=[item, item], parallel=True))

    assert refused.value.message.startswith(f"Failed to append step to chain run {run.run_id}: ")
    assert chain_facts(client, run) == before
    assert appends_of(state_dir, run.run_id) == [] and reservations(state_dir, budget_of(run)) == {}
    gate.children[0].release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "complete"


# -- the budget identity (R-APP-2) ----------------------------------------------------------------


def test_r_app_2_append_to_a_chain_adopted_after_a_node_kill_9_is_refused_and_claims_nothing(
    start_node: Callable[..., NodeProcess], state_dir: Path, agents: Path, gate: Gate
) -> None:
    """A restarted node adopts a running chain from its rows, without the launch or the budget
    identity its steps would claim against (it starts no new step). An append to it is
    refused with one line saying why, and nothing is claimed or recorded."""
    first = start_node(state_dir=state_dir)
    ctx = launch_context(agents)
    run = gated_chain(first.client(), ctx, gate, echo(ctx, "later"))
    first.kill()
    client = start_node(state_dir=state_dir).client()
    before = client.fanout.snapshot(budget_of(run))

    with pytest.raises(AppendRejected) as refused:
        append(client, run.run_id, echo(ctx, "x"))

    assert refused.value.message == (
        f"Failed to append step to chain run {run.run_id}: "
        f"Run '{run.run_id}' is missing its run fan-out budget identity. "
        "A restarted node adopted it and starts none of its steps still to come."
    )
    assert client.fanout.snapshot(budget_of(run)) == before
    assert appends_of(state_dir, run.run_id) == [] and reservations(state_dir, budget_of(run)) == {}
    gate.children[0].release(0)
    assert client.runs.wait(run.run_id, timeout=20).state == "failed"  # its later step never ran


def test_r_spn_3_a_11_appended_steps_and_unbounded_expand_items_are_not_counted_as_spawns(
    client: Client, agents: Path, gate: Gate
) -> None:
    """The documented rule, pinned (a tester read it as a bypass of the session cap): the
    session spawn budget counts what a launch declares, so a chain append (A-11) and the
    items of an expand step without `max_items` (R-SPN-3: it declares 0) are not counted.
    The cap of 2 still lets this chain start five children and reads 1/2 used."""
    ctx = launch_context(agents, max_subagent_spawns_per_session=2)
    first = ChainStep(items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))])
    run = client.runs.launch(ctx.launch("chain", True, chain=[first]))
    [held] = gate.accept(1)
    assert client.session.snapshot(ctx.session_id).used == 1

    template = TaskItem(agent=ctx.plan("echo"), task="got {item}")
    append(client, run.run_id, echo(ctx, "a\nb\nc"))
    append(client, run.run_id, ChainStep(kind="expand", items=[template]))
    held.release(0)
    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "complete", done.error
    assert [c.output.strip() for c in done.children[2:]] == ["got a", "got b", "got c"]
    assert len(done.children) == 5
    spawns = client.session.snapshot(ctx.session_id)
    assert (spawns.used, spawns.limit) == (1, 2)
