"""Helpers shared by the run-management tests: resume, rerun, append, intercom, debug-run.

What it owns: embedded nodes whose runs are stopped before the node stops, the agents these
tests write for themselves (`talker` and `api_talker` send intercom messages from inside a
child, `leaky` plants secrets in its stdout and stderr), the one way these tests make a finished
run keep its capacity slot, the refusals every request that launches from inside a run must
give (`NESTED_REFUSALS`: depth limit, no route, a bad route), and read-only queries of the
node's store for the "claims exist iff the append exists" checks. It never mocks ZeroMQ,
SQLite or processes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from subagents_node.client.client import Client
from subagents_node.client.paths import owner_db
from subagents_node.messages.capacity import Inspection, RunnerProof
from subagents_node.messages.errors import (
    FanoutBudgetUnavailable,
    FanoutDescriptorInvalid,
    FanoutNotAuthorized,
    NestedCallBlocked,
)
from subagents_node.messages.fanout import FanoutDescriptor, encode_descriptor
from subagents_node.messages.supervisor import RunView
from subagents_node.node.node import Node
from tests.support.runs import stop_active_runs, wait_until, write_agent

_API_TALKER = """\
import os, sys
from subagents_node.messages.supervisor import Intercom, IntercomMessage
from subagents_node.client.client import connect

with connect() as client:
    sent = client.ask(
        Intercom(
            run_id=os.environ["SUBAGENTS_RUN_ID"],
            child_id=os.environ["SUBAGENTS_CHILD_ID"],
            text=sys.argv[1],
        ),
        IntercomMessage,
    )
print(f"sent {sent.text}")
"""

_LEAKY = """\
import os, socket, sys

print({stdout!r}, flush=True)
sys.stderr.write({stderr!r})
sys.stderr.flush()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1].split()[0])
sock.sendall(f"{{os.getpid()}}\\n".encode())
reply = sock.recv(64).decode().strip()
sys.exit(int(reply) if reply else 3)
"""


@contextmanager
def embedded(state_dir: Path, **options: Any) -> Iterator[Node]:
    """An embedded node on `state_dir`; whatever a failed test left running is stopped first."""
    with Node.embedded(state_dir=state_dir, **options) as node:
        try:
            yield node
        finally:
            stop_active_runs(node.client())


def talker_agents(directory: Path) -> Path:
    """`talker` runs `subagents-node intercom send TASK`; `api_talker` sends TASK with the
    client API, addressed by its own $SUBAGENTS_RUN_ID and $SUBAGENTS_CHILD_ID."""
    write_agent(
        directory,
        "talker",
        "Sends its task to its run with the CLI.",
        '["{python}", "-m", "subagents_node", "intercom", "send", "{task}"]',
    )
    write_agent(
        directory,
        "api_talker",
        "Sends its task to its run with the client API.",
        '["{python}", "{agent_dir}/api_talker.py", "{task}"]',
    )
    (directory / "api_talker.py").write_text(_API_TALKER)
    return directory


def leaky_agent(directory: Path, stdout_secret: str, stderr_secret: str) -> Path:
    """`leaky GATE_PATH ...`: prints one secret, writes another to stderr, then waits at the gate
    (a runs_support.Gate; the first word of its task) and exits with the code it is sent."""
    write_agent(
        directory,
        "leaky",
        "Writes secrets to stdout and stderr, then waits at a gate.",
        '["{python}", "{agent_dir}/leaky.py", "{task}"]',
    )
    (directory / "leaky.py").write_text(_LEAKY.format(stdout=stdout_secret, stderr=stderr_secret))
    return directory


_GONE = encode_descriptor(FanoutDescriptor(root_run_id="gone", budget_id="gone-1", limit=5))

#: (depth, route, error, message) of a launch asked from inside a run that must be refused:
#: at max depth (R-CFG-8), without the caller's route (R-FAN-4: not a `fanout: true` agent), with
#: a route that does not decode or names no budget (R-FAN-5). "valid" stands for a real route.
NESTED_REFUSALS = [
    (2, "valid", NestedCallBlocked, "Nested subagent call blocked (depth=2, max=2)."),
    (1, None, FanoutNotAuthorized, "may not launch subagents (its agent needs `fanout: true`)"),
    (1, "not a descriptor!", FanoutDescriptorInvalid, "Invalid inherited run fan-out budget"),
    (1, _GONE, FanoutBudgetUnavailable, "unknown budget gone-1"),
]
NESTED_REFUSAL_IDS = ["at max depth", "no route", "undecodable route", "unknown budget"]


def a_route(client: Client) -> str:
    """A caller's own run tree's budget, encoded as a `fanout: true` child is given it."""
    return encode_descriptor(client.fanout.create("caller00", 8))


def assert_nested_continuation(
    client: Client, going: RunView, source_run_id: str, session_id: str, limit: int
) -> None:
    """`going` continues paused run `source_run_id` as a nested launch: at depth 1 and with no
    slot of its own (R-RES-3, R-TOP-7), the source ended `stopped` and linked to it, and the
    slot the source held freed by that end (R-CAP-25), not moved."""
    assert (going.source_run_id, going.depth) == (source_run_id, 1)
    assert going.snapshots.capacity_used is None
    assert client.capacity.inspect(going.run_id, session_id).relation == "none"
    source = client.runs.show(source_run_id)
    assert (source.state, source.resumed_by) == ("stopped", going.run_id)
    wait_until(
        lambda: client.capacity.snapshot(session_id, limit).used == 0,
        what="the paused source's slot to be freed",
    )


def hold_with_unknown_proof(client: Client, run: RunView, limit: int) -> Inspection:
    """Leave finished `run` holding a started runner slot whose proof is `unknown`.

    This is the ledger state R-CAP-20 names ("the source has not been released yet ... its
    proof is missing or unknown", retained by R-CAP-21 rule 8). A real child cannot produce it
    on demand (it takes a process that survives SIGKILL), so the test writes the same facts
    through the capacity API: the slot the run's own execution held (released when it ended
    with observed proof) is taken again under the run's id and runner id and reported terminal
    with `unknown` proof. Returns the ledger's inspection of the held slot.
    """
    wait_until(
        lambda: client.capacity.inspect(run.run_id, run.session_id).relation == "none",
        what=f"run {run.run_id}'s own slot to be released",
    )
    handle = client.capacity.acquire(run.session_id, limit, run.run_id, async_dir=run.run_dir)
    assert handle is not None, "hold_with_unknown_proof needs a capacity limit"
    handle.mark_started(runner_id=run.runner_id)
    proof = RunnerProof(state="unknown", runner_id=run.runner_id, reason="process-tree-unverified")
    verdict = client.capacity.report_terminal(run.session_id, run.run_id, run.state, proof=proof)
    assert (verdict.verdict, verdict.reason) == ("retained", "process-terminal proof is unknown")
    return client.capacity.inspect(run.run_id, run.session_id)


def store_rows(
    state_dir: Path, sql: str, *args: object, owner: str = "supervisor"
) -> list[tuple[Any, ...]]:
    """Rows of one owner's database, read on a read-only connection of our own (WAL: a
    consistent snapshot of what the owner has committed)."""
    uri = f"file:{owner_db(state_dir, owner)}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        return db.execute(sql, args).fetchall()
