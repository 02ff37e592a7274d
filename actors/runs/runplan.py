"""Launch planning: pure functions from a `Launch` request to what the pipeline needs.

Owns no state and does no I/O. It decides which children a launch has and in which groups they
start, the static fan-out paths claimed at admission (R-FAN-19), the descriptor segment each
child inherits (R-FAN-12), the spawn count the session budget is charged (R-SPN-3), the
deadlines (R-TMO-4..6), capacity eligibility (R-TOP-1/2) and `{previous}` substitution in chains.
"""

from __future__ import annotations

from dataclasses import dataclass

from subagents_node.messages.errors import PreviousUnavailable
from subagents_node.messages.supervisor import ChainStep, Launch, TaskItem

DEFAULT_TIMEOUT_MS = 30 * 60 * 1000  # R-TMO-2
PREVIOUS = "{previous}"


@dataclass(frozen=True, slots=True)
class ChildPlan:
    index: int  # position among all the run's children, in start order
    step: int  # the group it starts in (chain step; 0 for single and parallel)
    label: str  # its static fan-out path, also its display label
    segment: str | None  # appended to the run's descriptor for the child (None: as is)
    item: TaskItem


def plan_children(launch: Launch) -> list[list[ChildPlan]]:
    """The run's children, grouped: each group starts after the previous one completed."""
    if launch.mode == "workflow":
        # The host passes the workflow's descriptor as is (R-FAN-9) and claims per batch.
        return [[ChildPlan(0, 0, "workflow", None, launch.items[0])]]
    if launch.mode == "single":
        item = launch.items[0]
        # R-FAN-12: an async single passes its descriptor as is; a workflow host already
        # extended a workflow child's by `workflow[key]`.
        segment = None if launch.background or launch.fanout_admitted else "single"
        return [[ChildPlan(0, 0, "single", segment, item)]]
    if launch.mode == "parallel":
        return [
            [
                ChildPlan(i, 0, f"tasks[{i}]", f"tasks[{i}]", item)
                for i, item in enumerate(launch.items)
            ]
        ]
    # R-RES-6: an attached chain's step 0 is its live source run, a step with no child of its
    # own: the chain's steps are chain[1], chain[2], ... and start once the source ended.
    offset = 1 if launch.attached_run_id else 0
    groups: list[list[ChildPlan]] = [[]] * offset
    index = 0
    for i, step in enumerate(launch.chain, start=offset):
        group = []
        if step.kind == "run":  # expand and checkpoint steps have no static children
            for j, item in enumerate(step.items):
                label = step_label(launch.chain_offset + i, step, j)
                group.append(ChildPlan(index, i, label, label, item))
                index += 1
        groups.append(group)
    return groups


def step_label(absolute: int, step: ChainStep, j: int) -> str:
    """R-FAN-12: a run step's path; `absolute` is its index in the chain as first launched."""
    return f"chain[{absolute}].parallel[{j}]" if step.parallel else f"chain[{absolute}]"


def dynamic_steps(launch: Launch) -> dict[int, ChainStep]:
    """The expand and checkpoint steps of a chain, by group index (R-FAN-19: no static path).
    Group indices are `plan_children`'s: an attached chain's steps start at group 1 (R-RES-6),
    so its checkpoints and expands open where the file puts them, not one step early."""
    offset = 1 if launch.attached_run_id else 0
    return {i: step for i, step in enumerate(launch.chain, start=offset) if step.kind != "run"}


def static_paths(launch: Launch) -> list[str]:
    """R-FAN-19: one claim per child, labelled with its static path. None for a workflow
    (its host claims `workflow[key]` per admission batch, R-WF-6) or for a child the
    workflow host already admitted (R-FAN-20)."""
    if launch.mode == "workflow" or launch.fanout_admitted:
        return []
    return [child.label for group in plan_children(launch) for child in group]


def requested_spawns(launch: Launch) -> int:
    """R-SPN-3: the children this launch will start (chains: sum over steps). A workflow host
    is not a spawn; each workflow child counts when it is launched."""
    if launch.mode == "workflow":
        return 0
    dynamic = sum(s.max_items or 0 for s in launch.chain if s.kind == "expand")
    return dynamic + sum(len(group) for group in plan_children(launch))


def capacity_eligible(launch: Launch) -> bool:
    """R-TOP-1 and R-TOP-2: a top-level background launch takes a capacity slot."""
    return (
        launch.background
        and launch.depth == 0
        and launch.inherited_fanout is None
        and launch.parent_run_id is None
    )


def check_previous(launch: Launch) -> None:
    """A `{previous}` in the first chain step (or outside a chain) has nothing to refer to."""
    if launch.mode == "chain" and (launch.attached_run_id or launch.seed_previous is not None):
        # R-RES-6: step 0 is the attached run, whose output is the first step's {previous};
        # a resumed chain's first step refers to its source's last output.
        return
    if launch.mode == "chain":
        if launch.chain[0].kind == "expand":
            raise PreviousUnavailable(
                "an expand step needs an earlier step whose output it splits",
                agent=launch.chain[0].items[0].agent.name,
            )
        first = launch.chain[0].items
        offenders = [item for item in first if PREVIOUS in item.task]
    else:
        offenders = [item for item in launch.items if PREVIOUS in item.task]
    if offenders:
        where = "the first chain step" if launch.mode == "chain" else f"a {launch.mode} run"
        raise PreviousUnavailable(
            f"{PREVIOUS} in {where} has no earlier step to refer to",
            agent=offenders[0].agent.name,
        )


def substitute_previous(task: str, previous_outputs: list[str]) -> str:
    """Replace `{previous}` with the previous step's output (parallel steps: joined)."""
    if PREVIOUS not in task:
        return task
    return task.replace(PREVIOUS, "\n\n".join(o.strip() for o in previous_outputs))


def run_deadline_ms(launch: Launch) -> int | None:
    """R-TMO-5: the run-level deadline. Singles and workflows are bounded by their child's."""
    if launch.mode in ("single", "workflow"):
        return None
    if launch.background:
        return launch.timeout_ms  # async composites: none unless the call gives one
    return launch.timeout_ms or launch.config_timeout_ms or DEFAULT_TIMEOUT_MS


def deadline_at(launch: Launch, now: float) -> float | None:
    """The run's absolute deadline: a resume's inherited one (R-TMO-8), else now + R-TMO-5's."""
    if launch.deadline_at is not None:
        return launch.deadline_at
    deadline_ms = run_deadline_ms(launch)
    return now + deadline_ms / 1000 if deadline_ms else None


def child_timeout_ms(launch: Launch, item: TaskItem) -> int | None:
    """R-TMO-4..7: call > agent > config > 30 min for singles; agent > 30 min in composites;
    a workflow's script: the call's value, else config or 30 min in the foreground and no
    deadline in the background (R-TMO-7)."""
    if launch.mode == "workflow":
        if launch.background:
            return launch.timeout_ms
        return launch.timeout_ms or launch.config_timeout_ms or DEFAULT_TIMEOUT_MS
    if launch.mode == "single":
        return (
            launch.timeout_ms
            or item.agent.timeout_ms
            or launch.config_timeout_ms
            or DEFAULT_TIMEOUT_MS
        )
    if launch.background:
        return item.agent.timeout_ms or DEFAULT_TIMEOUT_MS  # R-TMO-6: config does not apply
    return item.agent.timeout_ms or launch.config_timeout_ms or DEFAULT_TIMEOUT_MS


def short_id(run_id: str) -> str:
    """The 8-character id used as a fan-out path segment (R-FAN-8)."""
    return run_id[:8]
