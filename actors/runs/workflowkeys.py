"""Workflow children by key (SPEC R-WF-4): one key of a workflow run launches one run.

A workflow host whose node went (stopped and started again for an upgrade, or killed) while it
was launching child `key` cannot know whether that node recorded the launch before it died; it
waits for the next node and sends the same request again. Owns what makes that safe: the run
launched as workflow `parent`'s child `key` carries the digest of the request that launched it
(`runs.launch_digest`), so the same request again is answered with that run (launched once),
and a different one under the same key is `WorkflowKeyConflict`, as the host itself refuses
it (R-WF-4). A run of the key recorded with no digest (by a node from before digests) counts
as the same request: a second run is never launched for a key. A request whose key is still
being admitted is answered with that admission's outcome (`KeyedLaunch.joined`). The key is
also the id of the child's spawn reservation (`spawn_reservation`): a node lost after the
session owner counted the spawn and before the run was recorded leaves no run to answer with,
so the launch sent again is admitted again, and its reservation found counted (R-SPN-5: one
spawn per child launched).

It only reads the runs table and compares; it never launches, stops or changes a run, and it
is consulted only for a request that holds the workflow's token (management.py, R-FAN-24).
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass, field

from subagents_node.actors.owner import ReplyFn
from subagents_node.messages.errors import WorkflowKeyConflict
from subagents_node.messages.supervisor import Launch, Resume

#: (parent workflow run id, workflow key): what names one child of a workflow run.
ChildKey = tuple[str, str]

_LAUNCHED = (
    "SELECT run_id, launch_digest FROM runs WHERE parent_run_id = ? AND workflow_key = ? "
    "ORDER BY created_at, run_id LIMIT 1"
)


@dataclass
class KeyedLaunch:
    """A workflow child's launch (or `resume` item) as it came in: its key, the digest of the
    request, and, once admitted, its run and the requests for the same key that wait on it."""

    key: ChildKey
    digest: str
    run_id: str = ""
    joined: list[ReplyFn] = field(default_factory=list)

    @classmethod
    def of(cls, request: Launch | Resume) -> KeyedLaunch | None:
        """The request's key, None for anything but a workflow host's child launch."""
        if request.workflow_key is None or request.parent_run_id is None:
            return None
        text = request.model_dump_json().encode()  # the same request gives the same bytes
        return cls((request.parent_run_id, request.workflow_key), hashlib.sha256(text).hexdigest())

    @property
    def spawn_reservation(self) -> str:
        """The id of the key's session spawn reservation (session.spawn_reserve): one per key,
        whatever the request (R-WF-4 lets a key launch one run), so a launch sent again, or
        changed after a first attempt that recorded no run, is counted once."""
        text = f"workflow-child\0{self.key[0]}\0{self.key[1]}".encode()
        return hashlib.sha256(text).hexdigest()

    def check_same(self, digest: str | None) -> None:
        """R-WF-4: the key again with different parameters is refused; the same, or a run
        recorded with no digest, is the launch already made."""
        if digest is not None and digest != self.digest:
            raise WorkflowKeyConflict(
                f"Workflow child key '{self.key[1]}' was already used with different "
                "parameters; use a new key.",
                key=self.key[1],
            )


def launched(db: sqlite3.Connection, key: ChildKey) -> tuple[str, str | None] | None:
    """The run workflow child `key` launched (its id and request digest), None if none."""
    row = db.execute(_LAUNCHED, key).fetchone()
    if row is None:
        return None
    return str(row["run_id"]), None if row["launch_digest"] is None else str(row["launch_digest"])
