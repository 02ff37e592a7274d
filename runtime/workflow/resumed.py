"""What a resumed workflow inherits from the workflow runs it resumes (SPEC R-WF-5, R-FAN-23).

A workflow run resumed with `subagents-node resume RUN` (after its host was killed, a node
kill -9, a failure) is a new workflow run of the same script under the same fan-out budget; its
run names its source (`source_run_id`, `source_kind: resume`). Its host asks the node for every
child of that source and of the source's own sources, newest first and a page at a time (a
source may have more children than one listing holds: client/listing.py), and reads the keys
each source's host recorded as admitted (its `status.json`): a key the source finished (or
still runs) is not run again, and a key the source admitted, launched or not, keeps its claim.

Owns that read, nothing else: it changes no state and reads only the hosts' own status files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from subagents_node.client.client import Client
from subagents_node.client.listing import every_run_plan
from subagents_node.messages import statefiles
from subagents_node.messages.supervisor import RunView
from subagents_node.workflow.report import STATUS_FILE


@dataclass(frozen=True)
class Prior:
    """What a resumed workflow's sources did: their children by key (the newest run of a key
    wins) and every key they admitted, launched or not (A-6: admitted, then refused)."""

    runs: dict[str, RunView] = field(default_factory=dict)
    claimed: frozenset[str] = frozenset()


def prior_steps(client: Client, source_run_id: str | None) -> Prior:
    """Walk the chain of resumed workflows from `source_run_id`, nearest first."""
    found: dict[str, RunView] = {}
    claimed: set[str] = set()
    seen: set[str] = set()
    while source_run_id and source_run_id not in seen:
        seen.add(source_run_id)
        source = client.runs.show(source_run_id)
        if source.mode != "workflow":
            break
        claimed |= admitted_keys(Path(source.run_dir))
        for run in children(client, source.run_id):  # newest first: the newest of a key wins
            key = run.workflow_key
            if key and key not in found:
                found[key] = run
        source_run_id = source.source_run_id if source.source_kind == "resume" else None
    return Prior(found, frozenset(claimed | set(found)))


def children(client: Client, run_id: str) -> list[RunView]:
    """Every run `run_id` launched, newest first, read page by page. Unbounded: a child left
    out would have its finished key run again."""
    return client.perform(every_run_plan(parent_run_id=run_id, bound=None)).runs


def admitted_keys(run_dir: Path) -> set[str]:
    """The keys a workflow's host recorded as admitted in its status.json (its own file, in
    its run dir); none when the host left none."""
    try:
        # A regular file only, never through a symlink (messages/statefiles.py): a FIFO a
        # child of the source put in its place made the resumed host wait for a writer for
        # good, its run `running` with its slot held.
        doc = json.loads(statefiles.read_file(run_dir / STATUS_FILE).decode("utf-8"))
    except (OSError, ValueError):
        return set()
    steps = doc.get("steps") if isinstance(doc, dict) else None
    if not isinstance(steps, list):
        return set()
    return {
        str(step["workflowKey"])
        for step in steps
        if isinstance(step, dict) and isinstance(step.get("workflowKey"), str)
    }
