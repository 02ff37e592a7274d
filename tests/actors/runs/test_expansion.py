"""Dynamic expansion: an `expand` chain step claims its k items as one batch (SPEC R-FAN-21).

The step turns the previous step's output into items (one per line, or one per element of a
JSON list) and claims `chain[i].expand[0..k-1]` in one all-or-nothing batch before any of them
starts (R-FAN-13): a batch that does not fit fails the step and the run with the rejection's
text, and no child of it starts; one that fits starts every item, labelled with its path
(R-FAN-12). Static admission claims nothing for expand steps (R-FAN-19), and the session spawn
preflight counts a declared `max_items` (R-SPN-3). A runner with no descriptor fails with
R-FAN-21's text.

Embedded node, real children; the claims are read from the node's store.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from subagents_node.actors.runs import expansion, runplan, steps
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.domains import MAX_TASK_CHARS
from subagents_node.messages.fanout import decode_descriptor, encode_descriptor
from subagents_node.messages.supervisor import ChainStep, RunView, TaskItem
from tests.support.manage import embedded, store_rows
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.runs import events_of, launch_context

ITEMS = [f"item-{n:02d}" for n in range(20)]


def expanding_chain(
    ctx: LaunchContext, source_task: str, max_items: int | None = None
) -> list[ChainStep]:
    """Step 0 prints `source_task`; step 1 runs `echo` once per item it printed."""
    source = ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task=source_task)])
    template = TaskItem(agent=ctx.plan("echo"), task="got {item}")
    return [source, ChainStep(kind="expand", items=[template], max_items=max_items)]


def claimed_paths(state_dir: Path, run: RunView) -> list[str]:
    budget = decode_descriptor(run.fanout_descriptor)
    rows = store_rows(
        state_dir,
        "SELECT path FROM fanout_claims WHERE budget_id=? ORDER BY seq",
        budget.budget_id,
        owner="fanout",
    )
    return [str(r[0]) for r in rows]


def test_r_fan_21_expansion_over_the_budget_is_rejected_as_one_batch_and_nothing_starts(
    client: Client, agents: Path, state_dir: Path
) -> None:
    ctx = launch_context(agents, max_subagent_spawns_per_run=10)
    launch = ctx.launch("chain", True, chain=expanding_chain(ctx, "\n".join(ITEMS)))
    run = client.runs.launch(launch)

    done = client.runs.wait(run.run_id, timeout=20)

    # The static claim is chain[0] only; the 20 items do not fit the 9 left: none is claimed.
    assert done.state == "failed"
    assert done.error == (
        "Run fan-out limit reached at chain[1].expand[9] (1/10 used; 20 requested, 9 "
        "remaining). No children from this admission group were started. Start a new "
        "top-level run or raise max_subagent_spawns_per_run."
    )
    assert claimed_paths(state_dir, done) == ["chain[0]"]
    assert [c.label for c in done.children] == ["chain[0]"]
    kinds = [e.kind for e in events_of(client, run.run_id)]
    assert kinds.count("child.started") == 1 and "step.rejected" in kinds
    [rejected] = [e for e in events_of(client, run.run_id) if e.kind == "step.rejected"]
    assert rejected.data["code"] == "RUN_FANOUT_LIMIT"


def test_r_fan_21_expansion_claims_all_items_as_one_batch(
    client: Client, agents: Path, state_dir: Path
) -> None:
    ctx = launch_context(agents, max_subagent_spawns_per_run=25)
    launch = ctx.launch("chain", True, chain=expanding_chain(ctx, "\n".join(ITEMS)))
    run = client.runs.launch(launch)

    done = client.runs.wait(run.run_id, timeout=60)

    assert done.state == "complete", done.error
    paths = [f"chain[1].expand[{j}]" for j in range(20)]
    assert claimed_paths(state_dir, done) == ["chain[0]", *paths]
    assert [c.label for c in done.children] == ["chain[0]", *paths]
    assert [c.output for c in done.children[1:]] == [f"got {i}" for i in ITEMS]
    assert (done.snapshots.fanout_used, done.snapshots.fanout_remaining) == (21, 4)
    # Every claim of the batch existed before the first of its children started.
    events = events_of(client, run.run_id)
    expanded = next(e.seq for e in events if e.kind == "step.expanded")
    first_item = min(
        e.seq for e in events if e.kind == "child.started" and int(str(e.data["child"])) > 0
    )
    assert expanded < first_item


def test_a_fifo_named_as_the_previous_steps_output_never_blocks_the_supervisor(
    client: Client, agents: Path, tmp_path: Path
) -> None:
    """The supervisor reads that file on its own loop: an open that waited for a writer would
    stop every run of the node. A file that is not a regular file is not read; the step
    expands the child's stdout instead."""
    os.mkfifo(tmp_path / "out.fifo")
    ctx = launch_context(agents, cwd=tmp_path)
    source = ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="a\nb", output="out.fifo")])
    template = TaskItem(agent=ctx.plan("echo"), task="got {item}")
    chain = [source, ChainStep(kind="expand", items=[template])]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain))

    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "complete", done.error
    assert [c.output for c in done.children[1:]] == ["got a", "got b"]
    assert any(r.run_id == run.run_id for r in client.runs.list())


def test_r_fan_21_a_json_list_gives_one_item_per_element(client: Client, agents: Path) -> None:
    ctx = launch_context(agents)
    source = '["alpha", {"n": 2}, "gamma"]'
    run = client.runs.launch(ctx.launch("chain", True, chain=expanding_chain(ctx, source)))

    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "complete", done.error
    assert [c.output for c in done.children[1:]] == ["got alpha", 'got {"n": 2}', "got gamma"]


def test_r_fan_21_output_nested_past_what_json_can_read_is_lines_and_no_owner_crashes(
    client: Client, agents: Path
) -> None:
    """A previous step printing 2,000 `[` made json.loads raise RecursionError, which the
    split did not catch: the run supervisor crashed on every restart until the node marked it
    failed, and every user of the node lost runs, stop and capacity."""
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.launch("chain", True, chain=expanding_chain(ctx, "[" * 2000)))

    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "complete", done.error
    assert [c.output for c in done.children[1:]] == ["got " + "[" * 2000]
    assert {a.name: a.restarts for a in client.status().actors}["supervisor"] == 0


def test_r_fan_21_more_items_than_max_items_fails_the_step_before_any_claim(
    client: Client, agents: Path, state_dir: Path
) -> None:
    ctx = launch_context(agents)
    chain = expanding_chain(ctx, "a\nb\nc", max_items=2)
    run = client.runs.launch(ctx.launch("chain", True, chain=chain))

    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "failed"
    assert done.error == "Dynamic step chain[1] produced 3 items; at most 2 are allowed."
    assert claimed_paths(state_dir, done) == ["chain[0]"]


def test_r_fan_21_a_runner_with_no_descriptor_fails_with_the_rules_message(
    agents: Path, tmp_path: Path
) -> None:
    ctx = launch_context(agents)
    launch = ctx.launch("chain", True, chain=expanding_chain(ctx, "a\nb"))
    groups = runplan.plan_children(launch)
    live = LiveRun(
        run_id="r1",
        session_id=ctx.session_id,
        runner_id="r1.x",
        run_dir=tmp_path,
        handle=None,
        launch=launch,
        descriptor=None,
        groups=groups,
        next_group=1,
        outputs={0: "a\nb"},
        dynamic=runplan.dynamic_steps(launch),
    )
    host = RecordingHost()

    assert steps.open_dynamic(host, live, 1) is False

    assert (live.failed, live.error) == (True, expansion.MISSING_DESCRIPTOR)
    assert live.error == "Async runner is missing its run fan-out budget identity."
    assert host.calls == []  # nothing was claimed


def test_r_fan_19_expand_and_checkpoint_steps_claim_nothing_statically(agents: Path) -> None:
    ctx = launch_context(agents)
    chain = [*expanding_chain(ctx, "x", max_items=7), ChainStep(kind="checkpoint")]
    launch = ctx.launch("chain", True, chain=chain)

    assert runplan.static_paths(launch) == ["chain[0]"]
    assert runplan.requested_spawns(launch) == 1 + 7  # R-SPN-3: the declared max_items


def test_r_fan_21_items_are_lines_or_json_list_elements() -> None:
    assert expansion.split_items("a\n\n b \nc\n") == ["a", "b", "c"]
    assert expansion.split_items('["a", 1, ["b"]]') == ["a", "1", '["b"]']
    assert expansion.split_items("[not json\nsecond") == ["[not json", "second"]
    assert expansion.item_task("do {item} now", "x") == "do x now"
    assert expansion.item_task("do", "x") == "do\n\nx"


class RecordingHost:
    """A StepHost that records what the moves ask for (no node: the rule is local)."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.calls: list[object] = []
        self.events: list[str] = []

    def clock(self) -> float:
        return 0.0

    def crash_point(self, point: str) -> None:
        pass

    def record_event(self, run_id: str, kind: str, data: dict[str, object]) -> None:
        self.events.append(kind)

    def call(self, key: object, request: object) -> None:
        self.calls.append(request)

    def advance(self, live: LiveRun) -> None:
        pass

    def stop_live(self, live: LiveRun, state: str, reason: str) -> None:
        pass


def test_r_fan_21_an_expansion_of_no_items_claims_nothing_and_the_chain_goes_on(
    client: Client, agents: Path, state_dir: Path
) -> None:
    ctx = launch_context(agents)
    chain = [
        *expanding_chain(ctx, " "),
        ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="end")]),
    ]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain))

    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "complete" and done.output == "end"
    assert claimed_paths(state_dir, done) == ["chain[0]", "chain[2]"]


def test_r_fan_21_an_item_with_a_nul_byte_fails_the_step_before_the_batch_is_claimed(
    client: Client, agents: Path, state_dir: Path
) -> None:
    """The echo agent takes its task in argv, where exec(2) refuses a NUL: the item could never
    start, so the batch is not claimed (nothing charged) and no child of it starts."""
    ctx = launch_context(agents)
    chain = expanding_chain(ctx, '["a", "b\\u0000c", "d"]')
    run = client.runs.launch(ctx.launch("chain", True, chain=chain))

    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "failed"
    assert done.error == (
        "Dynamic step chain[1] cannot start: Task chain[1].expand[1] cannot be passed to agent "
        "'echo' in its arguments: it contains a NUL character; use task_delivery: file or stdin"
    )
    assert claimed_paths(state_dir, done) == ["chain[0]"]
    assert [c.label for c in done.children] == ["chain[0]"]
    assert done.snapshots.fanout_used == 1


def test_r_fan_21_an_item_over_the_task_limit_fails_the_step_before_the_batch_is_claimed(
    client: Client, agents: Path, state_dir: Path, tmp_path: Path
) -> None:
    """`{item}` twice in the template: each item fits, the second one's task does not (the
    over-long task would go by file, so only the task limit catches it)."""
    big = "x" * (MAX_TASK_CHARS // 2 + 1)
    (tmp_path / "items.txt").write_text(f"small\n{big}\n")
    ctx = launch_context(agents, cwd=tmp_path)
    source = ChainStep(items=[TaskItem(agent=ctx.plan("echo"), task="s", output="items.txt")])
    template = TaskItem(agent=ctx.plan("echo"), task="{item}{item}")
    chain = [source, ChainStep(kind="expand", items=[template])]
    run = client.runs.launch(ctx.launch("chain", True, chain=chain))

    done = client.runs.wait(run.run_id, timeout=20)

    assert done.state == "failed"
    assert done.error == (
        f"Dynamic step chain[1] cannot start: Task chain[1].expand[1] is {2 * len(big):,} "
        f"characters, over the {MAX_TASK_CHARS:,}-character task limit."
    )
    assert claimed_paths(state_dir, done) == ["chain[0]"]
    assert [c.label for c in done.children] == ["chain[0]"]


def test_r_fan_21_an_expansion_whose_claim_answer_died_with_the_fanout_owner_is_claimed_once(
    agents: Path, state_dir: Path
) -> None:
    """The fan-out owner was killed (kill -9) after it recorded an expand step's batch claim
    and before it answered: the step was rejected "fanout restarted with fanout.claim in
    flight" and the run failed, its claims spent (R-FAN-15), for an owner back within a
    second. The batch goes under a claim id of its own now and is sent again to the restarted
    owner, which counts it once: the step expands and the run completes. (The run is launched
    on a budget of its caller's, under a launch id, so its own static claim has an id too and
    is sent again the same way.)"""
    items = ITEMS[:3]
    ctx = launch_context(agents)
    settings = {"fault_kill_points": ["owner:claim_recorded", "owner:plain_claim_recorded"]}
    with embedded(state_dir, faults=True, settings=settings) as node:
        client = node.client(timeout=30)
        budget = client.fanout.create(root_run_id="caller", limit=10)
        launch = ctx.launch("chain", True, chain=expanding_chain(ctx, "\n".join(items)))
        launch = launch.model_copy(
            update={"inherited_fanout": encode_descriptor(budget), "launch_id": "expand-once"}
        )
        done = client.runs.wait(client.runs.launch(launch).run_id, timeout=60)
        assert done.state == "complete", done.error
        assert [c.output for c in done.children[1:]] == [f"got {i}" for i in items]
        assert client.fanout.snapshot(budget).used == 4  # chain[0] and the 3 items, once
        assert next(a.restarts for a in node.owner_statuses() if a.name == "fanout") >= 2
