"""Intercom: a child's messages to the run that launched it, and the per-run `off` (R-ICB-1..4).

A child sends with `subagents-node intercom send TEXT` or with the client API, addressed by the
$SUBAGENTS_RUN_ID and $SUBAGENTS_CHILD_ID the node gave it; the run's view (its result, and the
fleet's event feed) shows each message with the child that sent it. A run launched with
`intercom: off` refuses them (IntercomOff) and records nothing, and the override is that run's
only: another run of the same session still hears its children (R-ICB-1). A resume applies its
source's setting again to the agent the source recorded as it was found (R-ICB-4).

Embedded node; the children are real processes that reach the node through $SUBAGENTS_NODE.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from subagents_node.actors.runs.recovery import read_recovery
from subagents_node.actors.runs.runstore import MAX_VIEW_INTERCOM
from subagents_node.client.client import Client
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import IntercomOff, RunNotFound, RunNotResumable
from subagents_node.messages.lineage import Resume
from subagents_node.messages.supervisor import (
    ChainStep,
    Intercom,
    IntercomMessage,
    IntercomMode,
    LaunchResult,
    RunView,
    TaskItem,
)
from subagents_node.workflow.launch import workflow_launch
from tests.support.manage import talker_agents
from tests.support.nodes import new_state_dir
from tests.support.run_fixtures import client as client
from tests.support.run_fixtures import embedded_run_node as embedded_run_node
from tests.support.run_fixtures import gate as gate
from tests.support.runs import (
    Gate,
    events_of,
    launch_context,
    new_session,
    script_agents,
    wait_view,
)


@pytest.fixture
def agents() -> Iterator[Path]:
    directory = new_state_dir()
    yield talker_agents(script_agents(directory / "agents"))
    shutil.rmtree(directory, ignore_errors=True)


def test_r_icb_children_message_their_run_with_the_cli_and_the_api_and_the_run_view_shows_both(
    client: Client, agents: Path
) -> None:
    ctx = launch_context(agents)
    items = [
        TaskItem(agent=ctx.plan("talker"), task="found 3 TODOs"),
        TaskItem(agent=ctx.plan("api_talker"), task="need more time"),
    ]
    run = client.runs.launch(ctx.launch("parallel", True, items=items))

    done = client.runs.wait(run.run_id, timeout=30)

    assert done.state == "complete", [c.error for c in done.children]
    by_child = {m.child_id: m for m in done.intercom}
    assert {c: m.text for c, m in by_child.items()} == {
        f"{run.run_id}-0": "found 3 TODOs",
        f"{run.run_id}-1": "need more time",
    }
    assert all(m.run_id == run.run_id for m in done.intercom)
    assert done.children[0].output == f"sent to run {run.run_id}"
    assert done.children[1].output == "sent need more time"
    # The fleet view is fed by the node-wide event stream: the messages are in it.
    fleet = client.runs.watch_all(0, wait_s=0, limit=5000)
    texts = [e.data["text"] for e in fleet.events if e.kind == "intercom"]
    assert sorted(texts) == ["found 3 TODOs", "need more time"]
    assert any(r.run_id == run.run_id and len(r.intercom) == 2 for r in fleet.runs)


def test_r_icb_2_a_run_with_intercom_off_refuses_its_childs_message_and_records_nothing(
    client: Client, agents: Path
) -> None:
    session = new_session()
    ctx = launch_context(agents, session=session)
    quiet = client.runs.launch(ctx.single("talker", "hello?", True, None, intercom="off"))
    heard = client.runs.launch(ctx.single("talker", "hello!", True, None))

    quiet_done = client.runs.wait(quiet.run_id, timeout=30)
    heard_done = client.runs.wait(heard.run_id, timeout=30)

    # The child's `intercom send` failed with the typed error's text and exit code 1.
    [child] = quiet_done.children
    assert (quiet_done.state, child.exit_code) == ("failed", 1)
    assert child.error == f"error: Intercom is off for run {quiet.run_id}."
    assert quiet_done.intercom == []
    assert [e for e in events_of(client, quiet.run_id) if e.kind == "intercom"] == []
    # R-ICB-1: the override is this run's only.
    assert heard_done.state == "complete"
    assert [m.text for m in heard_done.intercom] == ["hello!"]


def test_r_icb_2_the_api_refuses_a_message_to_a_run_with_intercom_off_with_a_typed_error(
    client: Client, agents: Path
) -> None:
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("echo", "quiet", True, None, intercom="off"))
    done = client.runs.wait(run.run_id, timeout=20)

    with pytest.raises(IntercomOff) as refused:
        client.ask(Intercom(run_id=run.run_id, text="anyone?"), IntercomMessage)

    assert refused.value.details["run_id"] == run.run_id
    assert client.runs.show(run.run_id) == done


def test_r_icb_a_message_to_an_unknown_run_is_refused(client: Client) -> None:
    with pytest.raises(RunNotFound):
        client.ask(Intercom(run_id="0123456789ab", text="hello"), IntercomMessage)


def test_a_runs_view_carries_its_latest_intercom_messages_only(
    client: Client, agents: Path, gate: Gate
) -> None:
    """A child may send any number of messages; every view, watch and listing that includes
    the run carried them all (20 MB per view after 5,000 of 4,000 characters). A view
    carries the latest MAX_VIEW_INTERCOM, in order; the event log keeps every one."""
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)
    sent = MAX_VIEW_INTERCOM + 5
    for n in range(sent):
        client.ask(Intercom(run_id=run.run_id, text=f"m{n}"), IntercomMessage)
    child.release(0)
    client.runs.wait(run.run_id, timeout=30)
    view = client.runs.show(run.run_id)
    assert [m.text for m in view.intercom] == [f"m{n}" for n in range(5, sent)]
    assert len([e for e in events_of(client, run.run_id) if e.kind == "intercom"]) == sent


def test_r_icb_a_message_to_a_run_that_ended_is_refused_and_kept_nowhere(
    client: Client, agents: Path
) -> None:
    """Any local client could send any number of messages to a run that had ended (no child
    is left to send one): 5,000 grew its events.jsonl and the store by 20 MB each, unread."""
    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("echo", "hi", True, None))
    done = client.runs.wait(run.run_id, timeout=30)
    before = (Path(done.run_dir) / "events.jsonl").read_bytes()

    with pytest.raises(IntercomOff) as refused:
        client.ask(Intercom(run_id=run.run_id, text="after the end"), IntercomMessage)

    assert refused.value.details == {"run_id": run.run_id, "reason": "run_ended"}
    assert refused.value.message == (
        f"Run {run.run_id} has ended (complete): intercom reaches a run only while it goes on."
    )
    assert (Path(done.run_dir) / "events.jsonl").read_bytes() == before
    assert client.runs.show(run.run_id) == done


def test_r_icb_a_run_keeps_at_most_its_bound_of_intercom_messages(
    client: Client, agents: Path, gate: Gate
) -> None:
    """No bound either while it goes on: a flood grew its events and the store for good."""
    from subagents_node.actors.runs.runrequests import MAX_INTERCOM_PER_RUN

    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)
    try:
        for n in range(MAX_INTERCOM_PER_RUN):
            client.ask(Intercom(run_id=run.run_id, text=f"m{n}"), IntercomMessage)
        with pytest.raises(IntercomOff) as refused:
            client.ask(Intercom(run_id=run.run_id, text="one too many"), IntercomMessage)
    finally:
        child.release(0)
    done = client.runs.wait(run.run_id, timeout=30)
    assert refused.value.details["reason"] == "intercom_full"
    assert done.intercom[-1].text == f"m{MAX_INTERCOM_PER_RUN - 1}"


def test_a_run_with_more_events_than_a_frame_lists_is_watched_in_pages_and_waited_to_its_end(
    client: Client, agents: Path, gate: Gate
) -> None:
    """A watch answered every event after its `after_seq` in one reply: past 10,000 (a frame's
    longest list) no decoder took it, the reply was dropped as garbled, and every `wait` on
    the run timed out. A watch answers a page (`more` says the rest follow); a wait sees every
    event, in order, before it tells the end."""
    from subagents_node.messages.supervisor import MAX_WATCH_EVENTS

    ctx = launch_context(agents)
    run = client.runs.launch(ctx.single("gate", str(gate.path), True, None))
    [child] = gate.accept(1)
    sent = 2 * MAX_WATCH_EVENTS + 500
    try:
        for n in range(sent):
            client.ask(Intercom(run_id=run.run_id, text=f"m{n}"), IntercomMessage)
        first = client.runs.watch(run.run_id, 0, wait_s=0)
    finally:
        child.release(0)
    assert len(first.events) == MAX_WATCH_EVENTS and first.more
    seen: list[int] = []
    done = client.runs.wait(run.run_id, timeout=60, on_event=lambda e, _: seen.append(e.seq))
    assert done.state == "complete"
    assert seen == sorted(set(seen)) and len(seen) >= sent + 3  # started, exited, complete


# -- resume (R-RES-7) -------------------------------------------------------------------------


def _finished(client: Client, ctx: LaunchContext, task: str, intercom: IntercomMode) -> RunView:
    run = client.runs.launch(ctx.single("talker", task, True, None, intercom=intercom))
    return client.runs.wait(run.run_id, timeout=30)


def _resumed(client: Client, run_id: str, **fields: Any) -> RunView:
    run = client.ask(Resume(run_id=run_id, **fields), LaunchResult).run
    return client.runs.wait(run.run_id, timeout=30)


def _heard(view: RunView) -> bool:
    """Whether the run's talker child got its message through (else intercom refused it)."""
    if view.state == "complete":
        return True
    [child] = view.children
    assert child.error == f"error: Intercom is off for run {view.run_id}.", child.error
    assert view.intercom == []
    return False


def test_r_res_7_a_resume_keeps_its_sources_intercom_setting_and_its_child_talks_to_the_new_run(
    client: Client, agents: Path
) -> None:
    """R-RES-7: with no override a resume takes the setting persisted with its source, and the
    relaunched child's messages reach the new run, not the source."""
    ctx = launch_context(agents)
    quiet = _finished(client, ctx, "hush", "off")
    heard = _finished(client, ctx, "again", "on")
    assert (_heard(quiet), _heard(heard)) == (False, True)

    quiet_again = _resumed(client, quiet.run_id)
    heard_again = _resumed(client, heard.run_id)

    assert _heard(quiet_again) is False
    assert _heard(heard_again) is True
    assert [m.run_id for m in heard_again.intercom] == [heard_again.run_id]
    assert [m.text for m in client.runs.show(heard.run_id).intercom] == ["again"]


@pytest.mark.parametrize(("source", "override"), [("off", "on"), ("on", "off")])
def test_r_res_7_a_resumes_own_intercom_setting_wins_and_is_what_a_later_resume_keeps(
    client: Client, agents: Path, source: IntercomMode, override: IntercomMode
) -> None:
    """R-RES-7: the call's setting overrides the persisted one, and the relaunch persists it
    for its own resumes; the source keeps its own."""
    ctx = launch_context(agents)
    first = _finished(client, ctx, "hello", source)

    second = _resumed(client, first.run_id, intercom=override)
    third = _resumed(client, second.run_id)

    assert _heard(second) is (override == "on")
    assert _heard(third) is (override == "on")
    assert _heard(_resumed(client, first.run_id)) is (source == "on")


def test_r_res_7_a_paused_run_goes_on_with_the_resumes_intercom_setting(
    client: Client, agents: Path, gate: Gate
) -> None:
    """R-RES-7 for a resume of an interrupt-paused chain: the continuation takes the call's
    setting too."""
    ctx = launch_context(agents)
    chain = [
        ChainStep(items=[TaskItem(agent=ctx.plan("gate"), task=str(gate.path))]),
        ChainStep(items=[TaskItem(agent=ctx.plan("talker"), task="after {previous}")]),
    ]
    run = client.runs.launch(
        ctx.launch("chain", True, chain=chain, timeout_ms=600_000, intercom="off")
    )
    [child] = gate.accept(1)
    client.runs.pause(run.run_id)
    wait_view(client, run.run_id, lambda v: v.state == "paused")
    child.wait_exit()

    resumed = client.ask(Resume(run_id=run.run_id, intercom="on"), LaunchResult).run
    [again] = gate.accept(1)
    again.release(0)
    done = client.runs.wait(resumed.run_id, timeout=30)

    assert _heard(done) is True
    assert [m.text for m in done.intercom] == ["after released 0"]


def test_r_res_7_a_workflow_whose_host_fixed_its_setting_refuses_an_override_and_changes_nothing(
    client: Client, agents: Path
) -> None:
    """A workflow's host reads its intercom setting from its own arguments: a resume that asks
    for another one is refused in one line, not silently run with the old one."""
    script = agents / "flow.py"
    script.write_text("def main(runs):\n    return 1\n")
    ctx = launch_context(agents, cwd=agents)
    flow = client.runs.launch(workflow_launch(ctx, script, background=True, intercom="off"))
    done = client.runs.wait(flow.run_id, timeout=30)
    assert done.state == "complete", done.error
    before = client.runs.list(limit=100)

    with pytest.raises(RunNotResumable) as refused:
        client.ask(Resume(run_id=flow.run_id, intercom="on"), LaunchResult)

    assert refused.value.details["reason"] == "workflow"
    assert "with its own intercom setting" in refused.value.message
    assert client.runs.list(limit=100) == before


@pytest.mark.parametrize("mode", ["on", "off"])
def test_r_icb_4_a_resume_applies_its_runs_intercom_setting_to_the_agent_recorded_as_found(
    client: Client, agents: Path, mode: IntercomMode
) -> None:
    """The recovery descriptor keeps the agent as it was discovered, with nothing of the
    bridge in it, and the run's own setting beside it; the resume applies that setting again
    (this `Resume` asks for no override of its own, R-RES-7): `off` stays off, `on` stays on."""
    ctx = launch_context(agents)
    source = client.runs.launch(ctx.single("talker", "first", True, None, intercom=mode))
    source = client.runs.wait(source.run_id, timeout=30)
    recorded, _ = read_recovery(Path(source.run_dir), source.run_id)
    assert recorded.items[0].agent == ctx.plan("talker")
    assert recorded.intercom == mode

    request = Resume(run_id=source.run_id, message="again", capacity_limit=0)
    resumed = client.ask(request, LaunchResult).run
    done = client.runs.wait(resumed.run_id, timeout=30)

    if mode == "off":
        assert (source.state, done.state) == ("failed", "failed")
        assert done.children[0].error == f"error: Intercom is off for run {done.run_id}."
        assert done.intercom == []
    else:
        assert (source.state, done.state) == ("complete", "complete")
        assert [m.text for m in done.intercom] == ["first\n\nagain"]
