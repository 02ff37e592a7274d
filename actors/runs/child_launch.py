"""What one child of a run is started with: its spec, its environment and its budget.

Owns the rules that turn a run's plan into a ChildSpec: `{previous}` substitution in chains,
task delivery (actors.invocation), the child's depth and maximum depth (R-CFG-8), the fan-out
descriptor it inherits, extended by its segment and only for fan-out agents and workflow hosts
(R-FAN-4/12), and its deadline (R-TMO-4..7). Pure apart from the private files task delivery
writes into the child's directory; it starts nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from subagents_node.actors.runs import runplan
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.messages.constants import ENV_CHILD_DIR, ENV_OUTPUT, ENV_WORKFLOW_TOKEN
from subagents_node.messages.delivery import child_environment, prepare_invocation
from subagents_node.messages.fanout import encode_descriptor, extend
from subagents_node.messages.runs import ChildSpec
from subagents_node.messages.supervisor import Launch


def child_depth(launch: Launch, child: runplan.ChildPlan) -> dict[str, int]:
    """R-CFG-8: one level deeper, under the tighter of the two maxima. A workflow host is the
    workflow's controller, not a nested agent: its children launch at the workflow's depth."""
    agent_max = child.item.agent.max_subagent_depth
    max_depth = launch.max_depth if agent_max is None else min(launch.max_depth, agent_max)
    depth = launch.depth if launch.mode == "workflow" else launch.depth + 1
    return {"depth": depth, "max_depth": max_depth}


def child_descriptor(live: LiveRun, child: runplan.ChildPlan) -> str | None:
    """R-FAN-12: the run's descriptor extended by the child's segment (or as is)."""
    if live.descriptor is None:
        return None
    descriptor = extend(live.descriptor, child.segment) if child.segment else live.descriptor
    return encode_descriptor(descriptor)


def child_spec(
    live: LiveRun,
    launch: Launch,
    child: runplan.ChildPlan,
    node_address: str,
    workflow_token: str | None,
) -> ChildSpec:
    """Raises a typed error when the child cannot be prepared (its command or cwd vanished)."""
    item = child.item
    task = item.task
    if launch.mode == "chain":  # the nearest earlier step with children, or a resume's seed
        task = runplan.substitute_previous(task, live.previous_outputs(child.step))
    child_id = f"{live.run_id}-{child.index}"
    child_dir = live.run_dir / f"child-{child.index}"
    base = dict(launch.env if launch.env is not None else os.environ)
    cwd = Path(launch.cwd, item.cwd) if item.cwd else Path(launch.cwd)
    invocation = prepare_invocation(item.agent, task, child_dir, cwd=cwd, environ=base)
    env = child_environment(
        base,
        invocation,
        fanout=item.agent.fanout or launch.mode == "workflow",
        node_address=node_address,
        session_id=live.session_id,
        run_id=live.run_id,
        child_id=child_id,
        **child_depth(launch, child),
        fanout_descriptor=child_descriptor(live, child),
    )
    env[ENV_CHILD_DIR] = str(child_dir)
    if item.output:
        env[ENV_OUTPUT] = str(Path(cwd, item.output))
    if launch.mode == "workflow" and workflow_token:
        env[ENV_WORKFLOW_TOKEN] = workflow_token  # proves its children's admission
    timeout_ms = runplan.child_timeout_ms(launch, item)
    return ChildSpec(
        child_id=child_id,
        run_id=live.run_id,
        session_id=live.session_id,
        argv=list(invocation.argv),
        cwd=str(invocation.cwd),
        env=env,
        stdin_path=str(invocation.stdin_path) if invocation.stdin_path else None,
        stdout_path=str(live.run_dir / f"external-{child.index}.stdout.log"),
        stderr_path=str(live.run_dir / f"external-{child.index}.stderr.log"),
        deadline_s=None if timeout_ms is None else timeout_ms / 1000,
        record_dir=str(child_dir),  # the shim's records sit beside the child's private files
    )
