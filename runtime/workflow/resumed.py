"""What a resumed workflow inherits from the workflow runs it resumes (SPEC R-WF-5, R-FAN-23).

A workflow run resumed with `subagents-node resume RUN` (after its host was killed, a node
kill -9, a failure) is a new workflow run of the same script under the same fan-out budget; its
run names its source (`source_run_id`, `source_kind: resume`). Its host asks the node, once, for
the children of that source and of the source's own sources, newest first: a key the source
finished (or still runs) is not run again, and a key the source admitted keeps its claim.

Owns that read, nothing else: it changes no state and never reads a file of the node's.
"""

from __future__ import annotations

from subagents_node.client.client import Client
from subagents_node.messages.supervisor import RunView

#: How many runs of one budget tree one read covers (the node's `runs.list` cap).
MAX_RUNS = 1000


def prior_steps(client: Client, source_run_id: str | None) -> dict[str, RunView]:
    """The source workflows' children by workflow key; the newest run of a key wins."""
    found: dict[str, RunView] = {}
    seen: set[str] = set()
    while source_run_id and source_run_id not in seen:
        seen.add(source_run_id)
        source = client.runs.show(source_run_id)
        if source.mode != "workflow":
            break
        tree = client.runs.list(root_run_id=source.root_run_id, limit=MAX_RUNS)  # newest first
        for run in tree:
            key = run.workflow_key
            if run.parent_run_id == source.run_id and key and key not in found:
                found[key] = run
        source_run_id = source.source_run_id if source.source_kind == "resume" else None
    return found
