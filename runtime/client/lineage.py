"""What makes a run from an existing one, as the client sends it (`client.runs.resume`,
`attach`, `rerun`) and a chain's append (`client.runs.append`): each request built with
`validate_request` (a bad argument is a typed `BadRequest`), and its one send (shared with the
asyncio client). Sending each again under its id when its answer is lost is launchagain.py's.

It owns no state and never sends anything itself; the rules these requests follow are the run
supervisor's (messages/lineage.py has their shapes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from subagents_node.client.arguments import listed
from subagents_node.client.plans import Plan, build, one
from subagents_node.messages.lineage import Append, AppendResult, Rerun, Resume
from subagents_node.messages.supervisor import ChainStep, LaunchResult, RunView


def attach_request(
    run_id: str,
    steps: Sequence[ChainStep],
    capacity_limit: int = 0,
    depth: int = 0,
    env: Mapping[str, str] | None = None,
    inherited_fanout: str | None = None,
) -> Resume:
    return build(
        Resume,
        run_id=run_id,
        attach=listed(steps, "steps", "ChainStep"),
        capacity_limit=capacity_limit,
        depth=depth,
        env=dict(env) if env is not None else None,
        inherited_fanout=inherited_fanout,
    )


def resume_request(
    run_id: str,
    message: str = "",
    depth: int = 0,
    capacity_limit: int = 0,
    env: Mapping[str, str] | None = None,
    inherited_fanout: str | None = None,
    intercom: str | None = None,
) -> Resume:
    return build(
        Resume,
        run_id=run_id,
        message=message,
        depth=depth,
        capacity_limit=capacity_limit,
        env=dict(env) if env is not None else None,
        inherited_fanout=inherited_fanout,
        intercom=intercom,
    )


def append_request(run_id: str, steps: Sequence[ChainStep]) -> Append:
    return build(Append, run_id=run_id, steps=listed(steps, "steps", "ChainStep"))


def append_plan(request: Append) -> Plan[AppendResult]:
    return one(request, AppendResult)


def relaunch_plan(request: Resume | Rerun) -> Plan[RunView]:
    """A resume, an attach or a rerun: the run it made."""
    result: LaunchResult = yield from one(request, LaunchResult)
    return result.run


def rerun_request(
    run_id: str,
    task: str,
    child: int = 0,
    env: Mapping[str, str] | None = None,
    foreground_pid: int | None = None,
) -> Rerun:
    fields = {"run_id": run_id, "task": task, "child": child, "foreground_pid": foreground_pid}
    return build(Rerun, **fields, env=dict(env) if env is not None else None)
