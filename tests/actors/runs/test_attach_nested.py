"""Attach from inside a run: a nested chain on a new budget (R-RES-6, R-TOP-1, R-FAN-10, A-12).

Attaching a live run as the root of a new chain, asked from inside a run (a depth, the caller's
route), is not a top-level launch (R-TOP-1), so the chain takes no slot (R-TOP-7) and the source
keeps its own, as it always does (R-RES-6). Its budget is new all the same, with its own static
claims: R-FAN-10 says attaching *always* creates one (A-12); the caller's route is not the
chain's budget. The caller must show that route, which only a `fanout: true` agent is given
(§0.2, R-FAN-4); it is validated (R-FAN-5) and charged one path (`attach[RUN]`: each attach
opens a new budget, so uncharged, one child could open them without bound), and the depth limit
still refuses the chain (R-CFG-8). A refusal changes nothing.

Embedded node, real children: in the first test the `attacher` agent, a `fanout: true` child,
runs `subagents-node attach` itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, TaskItem
from tests.support.manage import NESTED_REFUSAL_IDS, NESTED_REFUSALS, a_route
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, ledgers, wait_until, write_agent

LIMIT = 2


@pytest.fixture
def ctx(agents: Path) -> LaunchContext:
    return launch_context(agents, max_active_async_runs_per_session=LIMIT)


def used(client: Client, ctx: LaunchContext) -> int:
    return client.capacity.snapshot(ctx.session_id, LIMIT).used


def test_r_res_6_a_fanout_child_attaches_a_chain_taking_no_slot_on_a_new_budget(
    client: Client, agents: Path, state_dir: Path, gate: Gate
) -> None:
    """`subagents-node attach` run by a `fanout: true` agent (SUBAGENTS_DEPTH=1 and
    SUBAGENTS_RUN_FANOUT in its environment): no slot for the chain, the source's kept as it
    was; a new budget with the chain's own claim; one path (`attach[RUN]`) claimed on the
    caller's route."""
    steps = state_dir / "steps.toml"
    steps.write_text('[[steps]]\nagent = "echo"\ntask = "after {previous}"\n')
    command = ["{python}", "-m", "subagents_node", "attach", "{task}", str(steps)]
    command += ["--agents-dir", str(agents)]
    write_agent(agents, "attacher", "Attaches a chain.", json.dumps(command), fanout="true")
    ctx = launch_context(agents, max_active_async_runs_per_session=LIMIT)
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    source_budget = decode_descriptor(source.fanout_descriptor)
    source_claims = client.fanout.snapshot(source_budget)
    source_slot = client.capacity.inspect(source.run_id, ctx.session_id)
    assert used(client, ctx) == 1

    caller = client.runs.launch(ctx.single("attacher", source.run_id, False, None))
    done = client.runs.wait(caller.run_id, timeout=30)
    assert done.state == "complete", done.error
    chain = client.runs.show(done.output.strip())

    assert (chain.source_run_id, chain.source_kind, chain.depth) == (source.run_id, "attach", 1)
    # R-TOP-7: not top-level, so no slot; the source keeps its own (R-RES-6).
    assert chain.snapshots.capacity_used is None
    assert client.capacity.inspect(chain.run_id, ctx.session_id).relation == "none"
    assert client.capacity.inspect(source.run_id, ctx.session_id) == source_slot
    assert used(client, ctx) == 1
    # R-FAN-10 / A-12: a new budget (neither the source's nor the caller's), its own claim.
    chain_budget = decode_descriptor(chain.fanout_descriptor)
    assert chain.root_run_id not in (source.root_run_id, done.root_run_id)
    assert chain_budget.parent_path == ""
    assert client.fanout.snapshot(chain_budget).used == 1  # chain[1]
    assert client.fanout.snapshot(source_budget) == source_claims
    assert client.fanout.snapshot(decode_descriptor(done.fanout_descriptor)).used == 2

    held.release(0)
    finished = client.runs.wait(chain.run_id, timeout=20)
    assert (finished.state, finished.output) == ("complete", "after released 0")
    wait_until(lambda: used(client, ctx) == 0, what="the source's slot to be released")
    assert client.fanout.snapshot(chain_budget).used == 1


@pytest.mark.parametrize(
    ("depth", "route", "error", "message"), NESTED_REFUSALS, ids=NESTED_REFUSAL_IDS
)
def test_r_fan_4_a_refused_nested_attach_changes_nothing(
    client: Client,
    ctx: LaunchContext,
    gate: Gate,
    depth: int,
    route: str | None,
    error: type[SubagentsError],
    message: str,
) -> None:
    """The depth limit and the caller's own authorization (R-FAN-4, R-FAN-5) still apply to
    an attach from inside a run: no slot, no budget, no claim, no run, the source untouched."""
    source = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [held] = gate.accept(1)
    caller = a_route(client)
    budget = decode_descriptor(source.fanout_descriptor)
    before = ledgers(client, ctx.session_id, LIMIT, budget)
    slot = client.capacity.inspect(source.run_id, ctx.session_id)
    steps = [ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="after {previous}")])]
    request = Resume(
        run_id=source.run_id,
        attach=steps,
        capacity_limit=LIMIT,
        depth=depth,
        inherited_fanout=caller if route == "valid" else route,
    )

    with pytest.raises(error) as refused:
        client.ask(request, LaunchResult)

    assert message in refused.value.message
    assert ledgers(client, ctx.session_id, LIMIT, budget) == before
    assert client.capacity.inspect(source.run_id, ctx.session_id) == slot
    assert client.fanout.snapshot(decode_descriptor(caller)).used == 0
    held.release(0)
    assert client.runs.wait(source.run_id, timeout=20).state == "complete"
