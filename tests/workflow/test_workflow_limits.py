"""How large a workflow's record may grow (docs/workflows.md, R-RUN-7, R-WF-9).

- A script returning more than the record limit (1 MiB as JSON) fails its workflow with one
  line naming the size and the limit; the value is kept nowhere, so result.json stays small.
- An emit past the limit raises WorkflowResultTooLarge in the script and adds nothing: a
  script that catches it goes on and completes with what it emitted before.
- Console output past the limit is cut, as a child's log is: one marker line says how much.

Real host processes under an embedded node; every wait is on the run's end.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from subagents_node.client.client import Client
from subagents_node.messages.supervisor import RunView
from subagents_node.workflow.launch import RESULT_FILE, workflow_launch, workflow_result
from subagents_node.workflow.limits import RECORD_MAX_BYTES
from tests.support.nodes import new_state_dir
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.runs import launch_context, new_session

WAIT_S = 60.0
#: result.json holds the value once as data and twice in the text (`summary`, `output`).
RESULT_FILE_BOUND = 8 * RECORD_MAX_BYTES


@pytest.fixture
def work() -> Iterator[Path]:
    directory = new_state_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def run_workflow(client: Client, agents: Path, work: Path, script: str) -> RunView:
    path = work / "workflow.py"
    path.write_text(textwrap.dedent(script))
    ctx = launch_context(agents, session=new_session(), cwd=work)
    launch = workflow_launch(ctx, path, background=False, agents_dirs=(str(agents),))
    return client.runs.wait(client.runs.launch(launch).run_id, timeout=WAIT_S)


def result_of(run: RunView) -> dict[str, Any]:
    result = workflow_result(run)
    assert result is not None
    assert (Path(run.run_dir) / RESULT_FILE).stat().st_size < RESULT_FILE_BOUND
    return result


_BIG_RETURN = """
def main(runs):
    emit("e" * 1000)
    return "v" * 10_000_000
"""


def test_a_return_value_over_the_record_limit_fails_the_workflow_naming_size_and_limit(
    client: Client, agents: Path, work: Path
) -> None:
    done = run_workflow(client, agents, work, _BIG_RETURN)

    assert done.state == "failed"
    expected = (
        "WorkflowResultTooLarge: the workflow's return value is 10,000,002 bytes as JSON, "
        f"over the {RECORD_MAX_BYTES:,}-byte limit"
    )
    assert done.error is not None and done.error.strip() == expected
    result = result_of(done)
    assert (result["success"], result["value"], result["error"]) == (False, None, expected)
    assert result["emits"] == ["e" * 1000]


_BIG_EMITS = """
from subagents_node.errors import WorkflowResultTooLarge

def main(runs):
    refused = None
    for i in range(5):
        try:
            emit(str(i) * 400_000)
        except WorkflowResultTooLarge as err:
            refused = (i, err.size, err.limit, err.message)
    return refused
"""


def test_an_emit_over_the_record_limit_raises_in_the_script_and_adds_nothing(
    client: Client, agents: Path, work: Path
) -> None:
    done = run_workflow(client, agents, work, _BIG_EMITS)

    assert done.state == "complete", done.error
    result = result_of(done)
    assert result["emits"] == ["0" * 400_000, "1" * 400_000]
    index, size, limit, message = result["value"]
    assert (index, size, limit) == (4, 3 * 400_002, RECORD_MAX_BYTES)
    assert message == (
        "emit() of 400,002 bytes as JSON would bring the workflow's emitted values to "
        f"1,200,006 bytes, over the {RECORD_MAX_BYTES:,}-byte limit"
    )


_UNCAUGHT_EMIT = """
def main(runs):
    for _ in range(5):
        emit("x" * 1_000_000)
"""


def test_an_uncaught_emit_over_the_record_limit_fails_the_workflow_with_one_line(
    client: Client, agents: Path, work: Path
) -> None:
    done = run_workflow(client, agents, work, _UNCAUGHT_EMIT)

    assert done.state == "failed"
    assert done.error is not None
    assert done.error.strip().startswith("WorkflowResultTooLarge: emit() of 1,000,002 bytes")
    assert "\n" not in done.error.strip()
    assert result_of(done)["emits"] == ["x" * 1_000_000]


_LOUD = """
import sys

def main(runs):
    for i in range(3000):
        print("p" * 1000)
    sys.stdout.write("n" * 3_000_000)  # a line that never ends
    return "done"
"""


def test_console_output_past_the_record_limit_is_cut_with_one_marker_line(
    client: Client, agents: Path, work: Path
) -> None:
    done = run_workflow(client, agents, work, _LOUD)

    assert done.state == "complete", done.error
    console = result_of(done)["console"]
    kept = RECORD_MAX_BYTES // 1001
    assert console[:-1] == ["p" * 1000] * kept
    dropped = (3000 - kept) * 1001 + 3_000_001
    assert console[-1] == (
        f"[subagents-node: {dropped} bytes of console output were dropped here "
        f"(the console limit is {RECORD_MAX_BYTES} bytes)]"
    )


_OVER_ONE_CLAIM = """
def main(runs):
    batch = [{"key": f"k{i}", "agent": "echo", "task": "x"} for i in range(10_001)]
    try:
        runs.all(batch)
    except Exception as exc:
        return [type(exc).__name__, exc.message, runs.budget().used]
"""


def test_a_batch_over_one_claims_path_cap_is_refused_naming_the_cap_not_the_owners_schema(
    client: Client, agents: Path, work: Path
) -> None:
    """A `runs.all` of more new keys than one fan-out claim carries (10,000) was sent to the
    budget's owner, whose request schema refused it: the script read `BadRequest: invalid
    fanout.claim request: paths: List should have at most 10000 items after validation, not
    10001`. It is the script's mistake, named as such, and nothing is claimed."""
    run = run_workflow(client, agents, work, _OVER_ONE_CLAIM)

    assert run.state == "complete", run.error
    assert result_of(run)["value"] == [
        "WorkflowCallInvalid",
        "runs.all admits at most 10,000 new keys in one batch (one fan-out claim), not 10,001; "
        "split the batch",
        0,
    ]
