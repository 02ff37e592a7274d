"""Launches by key: a workflow child's (SPEC R-WF-4: one key of a workflow run launches one
run) and a client's launch id (docs/api.md, "Launching again"): one id launches one run.

A workflow host whose node went (stopped and started again for an upgrade, or killed) while it
was launching child `key` cannot know whether that node recorded the launch before it died; it
waits for the next node and sends the same request again. A client whose launch timed out, or
whose node went, is in the same place, and sends its launch again under the same `launch_id`.
Owns what makes that safe: the run launched under a key carries the digest of the request that
launched it (`runs.launch_digest`), so the same request again is answered with that run
(launched once), and a different one under the same key is `WorkflowKeyConflict`, as the host
itself refuses it (R-WF-4), or `LaunchIdConflict`. A workflow child's run recorded with no
digest (by a node from before digests) counts as the same request: a second run is never
launched for a key. A request whose key is still being admitted is answered with that
admission's outcome (`KeyedLaunch.joined`).

What a lost node may have charged before it recorded the run is charged under ids made of the
key, so the launch sent again, admitted again, finds it charged and charges nothing more: the
session's spawn reservation (`spawn_reservation`, R-SPN-5: one spawn per launch) and, for a
launch id, its fan-out claim on its caller's budget (`claim_id`, R-FAN-15). A launch id's run
has an id made of the launch id too (`run_id_of`), so the attempt sent again claims the same
paths on an inherited route, and its first attempt's capacity slot is found under it
(admission.py frees it).

It only reads the runs table and compares; it never launches, stops or changes a run. A
workflow key is consulted only for a request that holds the workflow's token (management.py,
R-FAN-24); a launch id is the client's own and scoped to the node's whole run table.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass, field

from subagents_node.actors.owner import ReplyFn
from subagents_node.messages.errors import LaunchIdConflict, WorkflowKeyConflict
from subagents_node.messages.lineage import Rerun, Resume
from subagents_node.messages.supervisor import Launch

#: (parent workflow run id, workflow key): what names one child of a workflow run; a launch
#: id's is (BY_LAUNCH_ID, launch id) (no run id is empty).
ChildKey = tuple[str, str]
BY_LAUNCH_ID = ""

_LAUNCHED = (
    "SELECT run_id, launch_digest FROM runs WHERE parent_run_id = ? AND workflow_key = ? "
    "ORDER BY created_at, run_id LIMIT 1"
)
_BY_RUN_ID = "SELECT run_id, launch_digest FROM runs WHERE run_id = ?"


@dataclass
class KeyedLaunch:
    """A launch under a key (a workflow child's launch or `resume` item, a launch id's) as it
    came in: its key, the digest of the request, and, once admitted, its run and the requests
    for the same key that wait on it."""

    key: ChildKey
    digest: str
    run_id: str = ""
    joined: list[ReplyFn] = field(default_factory=list)

    @classmethod
    def of(cls, request: Launch | Resume | Rerun) -> KeyedLaunch | None:
        """The request's key, None for a launch with neither a workflow key nor a launch id."""
        key = key_of(request)
        if key is None:
            return None
        text = request.model_dump_json().encode()  # the same request gives the same bytes
        return cls(key, hashlib.sha256(text).hexdigest())

    @property
    def launch_id(self) -> str | None:
        """The client's launch id, None for a workflow child's key."""
        return self.key[1] if self.key[0] == BY_LAUNCH_ID else None

    @property
    def fixed_run_id(self) -> str | None:
        """The id of the run a launch id launches (the same for every attempt), None for a
        workflow child (its run's id is new: its key finds it)."""
        return None if self.launch_id is None else run_id_of(self.launch_id)

    @property
    def spawn_reservation(self) -> str:
        """The id of the key's session spawn reservation (session.spawn_reserve): one per key,
        whatever the request (R-WF-4 lets a key launch one run), so a launch sent again, or
        changed after a first attempt that recorded no run, is counted once."""
        kind = "workflow-child" if self.launch_id is None else "launch-id"
        return _digest(kind, *self.key)

    def check_same(self, digest: str | None) -> None:
        """R-WF-4: the key again with different parameters is refused; the same, or a run
        recorded with no digest, is the launch already made. A launch id's run always has
        its digest: one without is another launch's."""
        if self.launch_id is not None and digest != self.digest:
            raise LaunchIdConflict(
                f"Launch id '{self.launch_id}' was already used for another launch (run "
                f"{run_id_of(self.launch_id)}); use a new launch id.",
                launch_id=self.launch_id,
                run_id=run_id_of(self.launch_id),
            )
        if digest is not None and digest != self.digest:
            raise WorkflowKeyConflict(
                f"Workflow child key '{self.key[1]}' was already used with different "
                "parameters; use a new key.",
                key=self.key[1],
            )


def key_of(request: Launch | Resume | Rerun) -> ChildKey | None:
    """The key a launch (a resume, an attach, a rerun) is launched once under, if any (a launch
    id with a workflow key is refused when the request is read: messages/supervisor.py,
    lineage.py). A launch id names one run whichever request made it: the same id on a launch
    and on a resume is the same key, and the second request is `LaunchIdConflict`."""
    if isinstance(request, Rerun):
        return None if request.launch_id is None else (BY_LAUNCH_ID, request.launch_id)
    if request.workflow_key is not None and request.parent_run_id is not None:
        return (request.parent_run_id, request.workflow_key)
    if request.launch_id is not None:
        return (BY_LAUNCH_ID, request.launch_id)
    return None


def run_id_of(launch_id: str) -> str:
    """The id of the run launch id `launch_id` launches: what a node made up (12 hex digits),
    so every view and prefix lookup reads it as any other run's."""
    return _digest("launch-run", launch_id)[:12]


def claim_id(launch_id: str, budget_id: str) -> str:
    """The id of a launch id's fan-out claim (fanout.claim `claim_id`) on the inherited budget
    `budget_id` (its caller's): the attempt sent again finds its first claim. A top-level
    launch's budget is new each attempt and its claim takes a fresh id (admission.py)."""
    return _digest("launch-claim", launch_id, budget_id)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def launched(db: sqlite3.Connection, key: ChildKey) -> tuple[str, str | None] | None:
    """The run key `key` launched (its id and request digest), None if none."""
    if key[0] == BY_LAUNCH_ID:
        row = db.execute(_BY_RUN_ID, (run_id_of(key[1]),)).fetchone()
    else:
        row = db.execute(_LAUNCHED, key).fetchone()
    if row is None:
        return None
    return str(row["run_id"]), None if row["launch_digest"] is None else str(row["launch_digest"])
