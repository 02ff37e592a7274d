"""INV-WF-1 as a property: whatever sequence of admission groups a workflow tries, no two
claimed child output paths are equal and none is the aggregate's, and a group that collides
leaves the fan-out budget and the claimed paths as they were (R-WF-6, R-WF-8).

Each example is one real workflow on a real node: its script tries the generated groups in
order, catching each collision, and returns what the budget said around each group; the
outcome of every group is checked against a model of the rule (the claimed paths so far), and
the steps the host recorded against the invariant itself.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents_node.client.client import Client
from subagents_node.workflow.launch import workflow_launch, workflow_result
from tests.support.nodes import new_state_dir
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.runs import launch_context, new_session

pytestmark = pytest.mark.slow

AGGREGATE = "report.md"
#: What a child may ask for: its default path (beside the aggregate, as report.KEY.md), a
#: path two children may share, the aggregate's own, or no file at all (never collides).
OUTPUTS = (None, "same.md", "other.md", AGGREGATE, False)

_SCRIPT = """
import json
from subagents_node.errors import WorkflowOutputCollision

GROUPS = json.loads(GROUPS_JSON)

def main(runs):
    seen = []
    for group in GROUPS:
        before = runs.budget().used
        try:
            runs.all([{"key": c["key"], "agent": "echo", "task": c["key"],
                       **({} if c["output"] is None else {"output": c["output"]})}
                      for c in group])
            refused = False
        except WorkflowOutputCollision:
            refused = True
        seen.append({"refused": refused, "before": before, "after": runs.budget().used})
    return seen
"""

groups = st.lists(
    st.lists(st.sampled_from(OUTPUTS), min_size=1, max_size=3), min_size=1, max_size=4
)


def _resolved(key: str, output: str | bool | None, work: Path) -> Path | None:
    """The model of R-WF-7 for these outputs: where child `key` writes, if anywhere."""
    if output is False:
        return None
    if output is None:
        return work / f"report.{key}.md"
    assert isinstance(output, str)
    return work / output


def _model_refuses(members: list[Path | None], claimed: set[Path], aggregate: Path) -> bool:
    paths = [p for p in members if p is not None]
    return aggregate in paths or len(set(paths)) < len(paths) or bool(claimed & set(paths))


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=groups)
def test_inv_wf_1_claimed_outputs_stay_distinct_and_a_collision_changes_nothing(
    client: Client, agents: Path, plan: list[list[str | bool | None]]
) -> None:
    work = new_state_dir()
    try:
        keyed = [
            [{"key": f"g{g}c{c}", "output": output} for c, output in enumerate(group)]
            for g, group in enumerate(plan)
        ]
        script = _SCRIPT.replace("GROUPS_JSON", repr(json.dumps(keyed)))
        (work / "workflow.py").write_text(textwrap.dedent(script))
        ctx = launch_context(agents, session=new_session(), cwd=work)
        launch = workflow_launch(
            ctx,
            work / "workflow.py",
            background=False,
            output=AGGREGATE,
            agents_dirs=(str(agents),),
        )
        run = client.runs.wait(client.runs.launch(launch).run_id, timeout=60)
        assert run.state == "complete", run.error
        result = workflow_result(run)
        assert result is not None
        seen: list[dict[str, Any]] = result["value"]

        aggregate = work / AGGREGATE
        claimed: set[Path] = set()
        admitted: set[str] = set()
        for group, outcome in zip(keyed, seen, strict=True):
            members = [_resolved(c["key"], c["output"], work) for c in group]
            assert outcome["refused"] is _model_refuses(members, claimed, aggregate), group
            if outcome["refused"]:
                assert outcome["after"] == outcome["before"]  # nothing claimed
            else:
                assert outcome["after"] == outcome["before"] + len(group)
                claimed |= {p for p in members if p is not None}
                admitted |= {c["key"] for c in group}

        steps = {s["workflowKey"]: s for s in result["steps"]}
        assert set(steps) == admitted  # a refused group left no step
        written = [Path(s["outputPath"]) for s in steps.values() if s.get("outputPath")]
        assert len(written) == len(set(written)) and aggregate not in written
        assert set(written) == claimed
    finally:
        shutil.rmtree(work, ignore_errors=True)
