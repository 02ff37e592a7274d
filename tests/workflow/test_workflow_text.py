"""What a workflow's text may hold: a script's str is any sequence of code points, and UTF-8
(result.json, status.json, the aggregate, the host's output) holds no lone surrogate (`"\\ud83d"`,
half of an emoji, as a JS-built string or a cut one carries). The host writes each as U+FFFD,
as a decoder shows bytes that are not UTF-8 (runtime/workflow/report.py `scalar_text`).

Before, a lone surrogate in the value, an emit, a console line or an exception's message ended
the host with a UnicodeEncodeError while it wrote result.json: the run failed with the host's
own traceback as its error, no result.json, and a status.json that still said `running`.

Real host processes under an embedded node; every wait is on the run's end.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from subagents_node.client.client import Client
from subagents_node.workflow.launch import workflow_launch
from subagents_node.workflow.report import STATUS_FILE
from tests.support.run_fixtures import agents as agents
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.runs import Gate, launch_context, new_session
from tests.workflow.test_workflow_limits import result_of, run_workflow
from tests.workflow.test_workflow_limits import work as work

_HALVES = """
def main(runs):
    print("console \\ud800 line")
    emit("emit \\udc80")
    runs.run("one", "echo", "hi")
    return {"key \\ud83d": ["half \\ud83d", "whole \\U0001f600"]}
"""

_RAISES = """
def main(runs):
    raise ValueError("bad \\ud800 value")
"""


def _utf8_json(path: Path) -> dict[str, object]:
    loaded = json.loads(path.read_bytes().decode("utf-8"))  # strict: what any reader takes
    assert isinstance(loaded, dict)
    return loaded


def test_lone_surrogates_in_a_scripts_value_emits_and_console_are_written_as_u_fffd(
    client: Client, agents: Path, work: Path
) -> None:
    run = run_workflow(client, agents, work, _HALVES)

    assert run.state == "complete", run.error
    result = result_of(run)
    assert result["value"] == {"key \ufffd": ["half \ufffd", "whole \U0001f600"]}
    assert result["emits"] == ["emit \ufffd"]
    assert "console \ufffd line" in result["console"]
    assert [step["workflowKey"] for step in result["steps"]] == ["one"]  # the child is kept
    assert _utf8_json(Path(run.run_dir) / STATUS_FILE)["state"] == "complete"
    assert "half \ufffd" in run.output  # the host's own text, as the run's output


def test_a_lone_surrogate_in_a_scripts_exception_fails_it_with_one_line_and_its_files(
    client: Client, agents: Path, work: Path
) -> None:
    run = run_workflow(client, agents, work, _RAISES)

    assert run.state == "failed"
    assert run.error == "ValueError: bad \ufffd value", run.error
    result = result_of(run)
    assert result["error"] == "ValueError: bad \ufffd value"
    assert "Traceback" in str(result["traceback"])
    assert _utf8_json(Path(run.run_dir) / STATUS_FILE)["state"] == "failed"


_ASKS_STDOUT = """
import sys

def main(runs):
    facts = [sys.stdout.isatty(), sys.stdout.encoding, sys.stdout.writable()]
    sys.stdout.writelines(["first\\n", "second\\n"])
    sys.stdout.buffer.write("caf\\u00e9\\n".encode()[:4])  # a character split across writes
    sys.stdout.buffer.write("caf\\u00e9\\n".encode()[4:] + b"raw \\xff\\n")
    sys.stdout.flush()
    return facts
"""


def test_a_script_may_use_its_stdout_as_a_text_stream_bytes_included(
    client: Client, agents: Path, work: Path
) -> None:
    """sys.stdout while a script runs is the workflow's console. It only had write() and
    flush(): `isatty()`, `encoding`, `writelines` and `sys.stdout.buffer` (what `rich`, `tqdm`
    or a script printing bytes asks for) failed the workflow with AttributeError. Bytes are
    read as UTF-8, with U+FFFD for what is not."""
    run = run_workflow(client, agents, work, _ASKS_STDOUT)

    assert run.state == "complete", run.error
    result = result_of(run)
    assert result["value"] == [False, "utf-8", True]
    assert result["console"] == ["first", "second", "caf\u00e9", "raw \ufffd"]


_CLOSES_ITS_STREAMS = """
import os

def main(runs):
    runs.run("one", "echo", "hi")
    os.close(1)
    os.close(2)
    return "the script's value"
"""


def test_a_script_that_closes_descriptors_1_and_2_still_completes_with_its_summary(
    client: Client, agents: Path, work: Path
) -> None:
    """The host printed its summary (the run's output) on descriptor 1: a script that closed it
    (or 2) made that print fail with a traceback nobody saw, and the complete workflow's run
    ended `failed` with "External CLI exited with code 1", although its result.json said
    complete. The host now writes through copies of both it made before the script ran."""
    run = run_workflow(client, agents, work, _CLOSES_ITS_STREAMS)

    assert run.state == "complete", run.error
    assert result_of(run)["value"] == "the script's value"
    assert "the script's value" in run.output


_ASYNC_MAIN = """
async def main(runs):
    return runs.run("one", "echo", "hi").state
"""


def test_an_async_main_fails_the_workflow_saying_the_api_is_synchronous(
    client: Client, agents: Path, work: Path
) -> None:
    """`async def main(runs)` ran nothing: calling it made a coroutine, which the host took for
    the value, so the workflow "completed" with 0 children and `Return: "<coroutine object main
    at 0x…>"` (and a "never awaited" warning on stderr)."""
    run = run_workflow(client, agents, work, _ASYNC_MAIN)

    assert run.state == "failed"
    assert run.error == (
        "TypeError: main(runs) is an async function: the workflow API is synchronous; "
        "define it with `def` (runs.all runs children side by side)"
    )
    assert result_of(run)["steps"] == []


_RAISES_A_BASE_EXCEPTION = """
import asyncio

def main(runs):
    runs.run("one", "echo", "hi")
    emit("kept")
    raise asyncio.CancelledError("a task of the script's was cancelled")
"""


def test_a_script_raising_a_base_exception_fails_in_one_line_with_its_files(
    client: Client, agents: Path, work: Path
) -> None:
    """A BaseException that is no Exception (asyncio's CancelledError, GeneratorExit, a class of
    the script's own) went past the host's handler: the run's error was the host's traceback,
    there was no result.json (the script's emits and trace lost) and status.json still said
    `running`."""
    run = run_workflow(client, agents, work, _RAISES_A_BASE_EXCEPTION)

    assert run.state == "failed"
    assert run.error == "CancelledError: a task of the script's was cancelled"
    result = result_of(run)
    assert result["emits"] == ["kept"]
    assert [step["workflowKey"] for step in result["steps"]] == ["one"]
    assert _utf8_json(Path(run.run_dir) / STATUS_FILE)["state"] == "failed"


_UNPRINTABLE = """
import sys

class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")

def main(runs):
    emit("kept")
    if {exit!r}:
        sys.exit(Unprintable())
    raise Unprintable()
"""


@pytest.mark.parametrize("exits", [False, True], ids=["raised", "sys.exit"])
def test_an_exception_whose_str_raises_fails_the_script_in_one_line_with_its_files(
    client: Client, agents: Path, work: Path, exits: bool
) -> None:
    """The host wrote the run's error as `Type: str(exc)` (or `SystemExit: {code}`): an
    exception of the script's whose __str__ raised ended the host with its own traceback as
    the run's error, no result.json and status.json left `running`."""
    run = run_workflow(client, agents, work, _UNPRINTABLE.format(exit=exits))

    assert run.state == "failed"
    expected = "SystemExit: " if exits else "Unprintable: "
    assert run.error == expected + "<exception str() failed>", run.error
    assert result_of(run)["emits"] == ["kept"]
    assert _utf8_json(Path(run.run_dir) / STATUS_FILE)["state"] == "failed"


_LEAVES_A_THREAD = """
import threading
import time

def main(runs):
    threading.Thread(target=time.sleep, args=(600,), name="left behind").start()
    return "done"
"""


def test_a_thread_the_script_leaves_running_does_not_keep_the_workflow_running(
    client: Client, agents: Path, work: Path
) -> None:
    """The host wrote its files once `main` returned, then the interpreter's exit joined every
    thread the script left: one still sleeping kept the complete workflow `running` until it
    was stopped or its deadline failed it (a background workflow, with no deadline, for good,
    holding its slot). The host now ends without waiting for such threads."""
    run = run_workflow(client, agents, work, _LEAVES_A_THREAD)

    assert run.state == "complete", run.error
    assert result_of(run)["value"] == "done"


_AWAITS_IN_A_THREAD = """
import threading

def main(runs):
    started = threading.Event()
    def late():
        started.set()
        runs.run("late", "gate", {gate!r})
    threading.Thread(target=late).start()
    started.wait()
    while runs.steps.get("late") is None or runs.steps["late"].run_id is None:
        threading.Event().wait(0.01)  # until the child runs: the script's own wait
    return "done"
"""


def test_a_foreground_child_a_left_thread_awaits_ends_before_its_workflow(
    client: Client, agents: Path, work: Path
) -> None:
    """A thread the script left behind that awaits a foreground child: the host, which no
    longer waits for the threads a script leaves, still ends only once that child has, and its
    result has the child's end (no foreground member outlives its workflow)."""
    gate = Gate(work)
    try:
        path = work / "workflow.py"
        path.write_text(textwrap.dedent(_AWAITS_IN_A_THREAD.format(gate=str(gate.path))))
        ctx = launch_context(agents, session=new_session(), cwd=work)
        launch = workflow_launch(ctx, path, background=False, agents_dirs=(str(agents),))
        run_id = client.runs.launch(launch).run_id
        [child] = gate.accept(1, timeout=60)
        assert client.runs.show(run_id).state == "running"  # main returned; the child awaited
        child.release(0)
        run = client.runs.wait(run_id, timeout=60)
    finally:
        gate.close()

    assert run.state == "complete", run.error
    [late] = client.runs.list(parent_run_id=run_id)
    assert late.state == "complete"
    assert late.ended_at is not None and run.ended_at is not None
    assert late.ended_at <= run.ended_at
    [entry] = result_of(run)["results"]
    assert (entry["workflowKey"], entry["state"]) == ("late", "complete")


_NOT_FINITE = """
def main(runs):
    emit(float("inf"))
    return {"x": float("nan"), "y": [float("-inf"), 1.5]}
"""


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is no JSON (RFC 8259)")


def test_a_float_json_cannot_hold_is_kept_as_its_repr_so_result_json_stays_json(
    client: Client, agents: Path, work: Path
) -> None:
    """NaN and the infinities were written as Python's json writes them (`NaN`, `-Infinity`):
    result.json (and `workflow --json`) were no JSON for a strict reader (JavaScript's
    JSON.parse threw). Like anything else JSON cannot hold, they are kept as their repr."""
    run = run_workflow(client, agents, work, _NOT_FINITE)

    assert run.state == "complete", run.error
    text = (Path(run.run_dir) / "result.json").read_text(encoding="utf-8")
    result = json.loads(text, parse_constant=_no_constant)
    assert result["value"] == {"x": "nan", "y": ["-inf", 1.5]}
    assert result["emits"] == ["inf"]
