"""Launch planning, pure: children and groups, static paths (R-FAN-19), descriptor segments
(R-FAN-12), spawn counts (R-SPN-3), deadlines (R-TMO-4..6), eligibility (R-TOP-1/2), and
`{previous}` in chains."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subagents_node.actors.runs import runplan
from subagents_node.actors.runs.runplan import DEFAULT_TIMEOUT_MS
from subagents_node.messages.errors import PreviousUnavailable
from subagents_node.messages.supervisor import AgentPlan, ChainStep, Launch, TaskItem

AGENT = AgentPlan(name="a", command=["true"])
SLOW_AGENT = AgentPlan(name="slow", command=["true"], timeout_ms=5_000)


def task(text: str = "t", agent: AgentPlan = AGENT) -> TaskItem:
    return TaskItem(agent=agent, task=text)


def launch(mode: str = "single", background: bool = False, **fields: Any) -> Launch:
    if mode in ("single", "parallel"):
        fields.setdefault("items", [task()])
    if mode == "chain":
        fields.setdefault("chain", [ChainStep(items=[task()])])
    return Launch(session_id="s", mode=mode, background=background, cwd="/", **fields)  # type: ignore[arg-type]


def chain_of(*steps: int) -> list[ChainStep]:
    """A chain from step widths: 0 = a sequential step, n > 0 = a parallel step of n items."""
    return [
        ChainStep(items=[task(f"{i}.{j}") for j in range(max(1, n))], parallel=n > 0)
        for i, n in enumerate(steps)
    ]


# -- R-FAN-19: static paths -----------------------------------------------------------------------


def test_r_fan_19_single_claims_single() -> None:
    assert runplan.static_paths(launch("single")) == ["single"]
    assert runplan.static_paths(launch("single", background=True)) == ["single"]


def test_r_fan_19_tasks_claim_one_path_per_task() -> None:
    tasks = launch("parallel", items=[task(), task(), task()])
    assert runplan.static_paths(tasks) == ["tasks[0]", "tasks[1]", "tasks[2]"]


def test_r_fan_19_chains_claim_sequential_steps_and_each_parallel_item() -> None:
    paths = runplan.static_paths(launch("chain", chain=chain_of(0, 2, 0)))
    assert paths == ["chain[0]", "chain[1].parallel[0]", "chain[1].parallel[1]", "chain[2]"]


# -- R-FAN-12: what each child's descriptor is extended by ----------------------------------------


def segments(plan: Launch) -> list[str | None]:
    return [child.segment for group in runplan.plan_children(plan) for child in group]


def test_r_fan_12_a_foreground_single_child_gets_single_and_an_async_single_child_nothing() -> None:
    assert segments(launch("single")) == ["single"]
    assert segments(launch("single", background=True)) == [None]


def test_r_fan_12_tasks_and_chain_children_get_their_own_path_segment() -> None:
    for background in (False, True):
        tasks = launch("parallel", background, items=[task(), task()])
        assert segments(tasks) == ["tasks[0]", "tasks[1]"]
        chain = launch("chain", background, chain=chain_of(0, 2))
        assert segments(chain) == ["chain[0]", "chain[1].parallel[0]", "chain[1].parallel[1]"]


# -- groups and R-SPN-3 ---------------------------------------------------------------------------


def test_parallel_children_form_one_group_and_chain_steps_one_group_each_in_start_order() -> None:
    [group] = runplan.plan_children(launch("parallel", items=[task("x"), task("y")]))
    assert [(c.index, c.step, c.item.task) for c in group] == [(0, 0, "x"), (1, 0, "y")]

    groups = runplan.plan_children(launch("chain", chain=chain_of(2, 0, 3)))
    assert [[c.index for c in g] for g in groups] == [[0, 1], [2], [3, 4, 5]]
    assert [{c.step for c in g} for g in groups] == [{0}, {1}, {2}]


@pytest.mark.parametrize("attached", [None, "src"])
def test_r_res_6_dynamic_steps_are_keyed_by_the_group_they_open_in(attached: str | None) -> None:
    """An attached chain's steps start at group 1 (group 0 is its live source): its expand
    and checkpoint steps are keyed the same way. They used to be keyed from 0, so each opened
    one group early and took the place of the step before it."""
    chain = [
        ChainStep(items=[task("one")]),
        ChainStep(kind="checkpoint"),
        ChainStep(items=[task("two")]),
        ChainStep(kind="expand", items=[task("got {item}")]),
    ]
    planned = launch("chain", background=True, chain=chain, attached_run_id=attached)
    groups = runplan.plan_children(planned)
    dynamic = runplan.dynamic_steps(planned)

    offset = 1 if attached else 0
    assert sorted(dynamic) == [offset + 1, offset + 3]
    assert [dynamic[offset + 1].kind, dynamic[offset + 3].kind] == ["checkpoint", "expand"]
    assert all(groups[g] == [] for g in dynamic)  # they hold no static child of their own
    assert [g for g, group in enumerate(groups) if group] == [offset, offset + 2]


def test_r_spn_3_requested_spawns_count_singles_tasks_and_every_chain_item() -> None:
    assert runplan.requested_spawns(launch("single")) == 1
    assert runplan.requested_spawns(launch("parallel", items=[task()] * 4)) == 4
    assert runplan.requested_spawns(launch("chain", chain=chain_of(0, 3, 0, 2))) == 7


@given(st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=8))
def test_r_fan_19_and_r_spn_3_agree_with_the_children_a_chain_starts(widths: list[int]) -> None:
    plan = launch("chain", chain=chain_of(*widths))
    children = [c for group in runplan.plan_children(plan) for c in group]
    assert runplan.requested_spawns(plan) == len(children) == sum(max(1, w) for w in widths)
    assert runplan.static_paths(plan) == [c.label for c in children]
    assert [c.index for c in children] == list(range(len(children)))
    assert len(set(runplan.static_paths(plan))) == len(children)


# -- R-TMO-4..6 -----------------------------------------------------------------------------------


def test_r_tmo_4_5_a_single_childs_deadline_is_call_then_agent_then_config_then_default() -> None:
    for background in (False, True):
        agent_item = [task(agent=SLOW_AGENT)]
        every = launch(
            "single", background, items=agent_item, timeout_ms=100, config_timeout_ms=900
        )
        assert runplan.child_timeout_ms(every, every.items[0]) == 100
        no_call = launch("single", background, items=agent_item, config_timeout_ms=900)
        assert runplan.child_timeout_ms(no_call, no_call.items[0]) == 5_000
        config_only = launch("single", background, config_timeout_ms=900)
        assert runplan.child_timeout_ms(config_only, config_only.items[0]) == 900
        nothing = launch("single", background)
        assert runplan.child_timeout_ms(nothing, nothing.items[0]) == DEFAULT_TIMEOUT_MS
        assert runplan.run_deadline_ms(every) is None  # bounded by its one child's deadline


def test_r_tmo_5_an_async_composite_has_no_run_deadline_unless_the_call_gives_one() -> None:
    composite = launch("parallel", True, items=[task(), task()], config_timeout_ms=900)
    assert runplan.run_deadline_ms(composite) is None
    called = launch("chain", True, timeout_ms=1234, config_timeout_ms=900)
    assert runplan.run_deadline_ms(called) == 1234


def test_r_tmo_5_a_foreground_composite_deadline_is_call_then_config_then_30_minutes() -> None:
    assert runplan.run_deadline_ms(launch("parallel", timeout_ms=5, config_timeout_ms=9)) == 5
    assert runplan.run_deadline_ms(launch("chain", config_timeout_ms=9)) == 9
    assert runplan.run_deadline_ms(launch("parallel")) == DEFAULT_TIMEOUT_MS == 1_800_000


def test_r_tmo_6_async_composite_children_get_their_agents_timeout_else_30_minutes() -> None:
    plan = launch(
        "parallel",
        True,
        items=[task(agent=SLOW_AGENT), task()],
        timeout_ms=77,
        config_timeout_ms=900,
    )
    assert [runplan.child_timeout_ms(plan, i) for i in plan.items] == [5_000, DEFAULT_TIMEOUT_MS]


def test_foreground_composite_children_get_their_agents_timeout_else_the_config_default() -> None:
    plan = launch("parallel", items=[task(agent=SLOW_AGENT), task()], config_timeout_ms=900)
    assert [runplan.child_timeout_ms(plan, i) for i in plan.items] == [5_000, 900]


# -- R-TOP-1/2 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "eligible"),
    [
        ({"background": True}, True),
        ({"background": False}, False),
        ({"background": True, "depth": 1}, False),
        ({"background": True, "inherited_fanout": "e30"}, False),
        ({"background": True, "parent_run_id": "r-parent"}, False),
    ],
    ids=["async top-level", "foreground", "nested depth", "inherited route", "child of a run"],
)
def test_r_top_1_2_only_a_top_level_background_launch_takes_capacity(
    fields: dict[str, Any], eligible: bool
) -> None:
    background = fields.pop("background")
    assert runplan.capacity_eligible(launch("single", background, **fields)) is eligible


# -- {previous} -----------------------------------------------------------------------------------


def test_previous_in_the_first_chain_step_or_outside_a_chain_has_nothing_to_refer_to() -> None:
    first = launch("chain", chain=[ChainStep(items=[task("use {previous}")])])
    with pytest.raises(PreviousUnavailable, match="first chain step"):
        runplan.check_previous(first)
    with pytest.raises(PreviousUnavailable, match="a single run"):
        runplan.check_previous(launch("single", items=[task("use {previous}")]))
    later = launch("chain", chain=[*chain_of(0), ChainStep(items=[task("use {previous}")])])
    runplan.check_previous(later)  # refers to step 0: fine


def test_previous_is_replaced_by_the_previous_steps_outputs_joined_and_trimmed() -> None:
    assert runplan.substitute_previous("got {previous}!", [" a \n", "b"]) == "got a\n\nb!"
    assert runplan.substitute_previous("no placeholder", ["ignored"]) == "no placeholder"
    # Braces in an output are text, never a placeholder for another round.
    assert runplan.substitute_previous("{previous}", ["{previous}"]) == "{previous}"


def test_r_fan_8_the_short_run_id_is_eight_characters() -> None:
    assert runplan.short_id("0123456789ab") == "01234567"
