"""The requests that launch a workflow's children (SPEC §12: R-WF-3, R-WF-5, R-FAN-20/24).

Owns how an admitted step becomes the request the node runs: a new member's `Launch` (a single
run, built as the host's launcher builds one, then made a workflow child: its key,
`fanout_admitted`, the workflow's token, the workflow as parent and the descriptor extended by
`workflow[key]`, R-FAN-12) and a `resume` item's `Resume`. Neither carries the host's own
variables: a child gets its own values from the node, or none at all.

It only builds requests: it never talks to a node, never claims and never admits. api.py
builds every member's launch *before* it claims the group, so that a member the node would
refuse (a task over the size cap, a NUL byte in an argv task, a command or a working directory
that is not there) refuses the whole group with its typed error and nothing is claimed (R-WF-5).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from subagents_node.launch.agents import Agent
from subagents_node.launch.launcher import LaunchContext, agent_plan
from subagents_node.messages.constants import (
    ENV_AGENT,
    ENV_CHILD_DIR,
    ENV_CHILD_ID,
    ENV_OUTPUT,
    ENV_TASK_FILE,
    ENV_WORKFLOW_TOKEN,
)
from subagents_node.messages.delivery import (
    argv_task_problem,
    check_command,
    check_working_directory,
)
from subagents_node.messages.errors import RunCwdMissing, TaskUndeliverable, WorkflowCallInvalid
from subagents_node.messages.fanout import encode_descriptor, extend
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import Launch, TaskItem
from subagents_node.workflow.calls import Step, WorkflowEnv

#: The host's own variables: a child gets its own values from the node, or none at all.
_HOST_ONLY = (
    ENV_WORKFLOW_TOKEN,
    ENV_OUTPUT,
    ENV_TASK_FILE,
    ENV_CHILD_ID,
    ENV_CHILD_DIR,
    ENV_AGENT,
)


def member_launch(
    step: Step, agent: Agent, launcher: LaunchContext, workflow: WorkflowEnv
) -> Launch:
    """The launch of member `step` as a child of `workflow` (R-WF-3), checked as the node's
    admission would check it: a typed error names the key."""
    call = step.call
    plan = agent_plan(agent)
    if step.output_path is None:
        plan = plan.model_copy(update={"output": None})  # `output: false`: no file at all
    try:
        item = TaskItem(
            agent=plan,
            task=call.task,
            cwd=call.cwd or agent.cwd,
            output=str(step.output_path) if step.output_path is not None else None,
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "task"
        raise WorkflowCallInvalid(
            f"workflow key {step.key!r}: invalid {where}: {first['msg']}",  # run or all
            key=step.key,
            field=where,
        ) from None
    base = launcher.launch("single", call.async_, items=[item], timeout_ms=call.timeout_ms)
    try:  # the node refuses it after the claim, which is never refunded
        check_working_directory(Path(base.cwd, item.cwd) if item.cwd else Path(base.cwd))
    except RunCwdMissing as err:
        raise RunCwdMissing(f"workflow key '{step.key}': {err.message}", **err.details) from None
    check_command(plan, base.env)  # AgentCommandNotFound
    problem = argv_task_problem(plan, call.task, base.env)
    if problem is not None:
        raise TaskUndeliverable(
            f"Task of workflow key '{step.key}' cannot be passed to agent '{plan.name}' in "
            f"its arguments: {problem}",
            agent=plan.name,
            path=f"workflow[{step.key}]",
        )
    fields_ = base.model_dump()
    fields_.update(
        env={k: v for k, v in (base.env or {}).items() if k not in _HOST_ONLY},
        parent_run_id=workflow.run_id,
        workflow_key=step.key,
        fanout_admitted=True,
        workflow_token=workflow.token,
        inherited_fanout=encode_descriptor(extend(workflow.descriptor, f"workflow[{step.key}]")),
        intercom=call.intercom or workflow.intercom,  # R-ICB-3
    )
    return Launch.model_validate(fields_)


def resume_request(step: Step, launcher: LaunchContext, workflow: WorkflowEnv) -> Resume:
    """R-WF-5 `resume` item: the node relaunches the source as `workflow`'s child."""
    call = step.call
    assert step.source_run_id is not None
    return Resume(
        run_id=step.source_run_id,
        message=call.task,
        depth=launcher.depth,
        env={k: v for k, v in launcher.env.items() if k not in _HOST_ONLY},
        parent_run_id=workflow.run_id,
        workflow_key=step.key,
        workflow_token=workflow.token,
        background=call.async_,
        intercom=call.intercom or workflow.intercom,  # R-ICB-3, as a new member's launch
    )
