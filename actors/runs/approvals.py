"""Approvals under their client's approve id (`runs.approve` `approve_id`; docs/api.md,
"Launching again"): an approve whose answer was lost (its client's wait ended, or its node died
once the decision was recorded) sent again is answered with the run that went on past the
checkpoint, never refused as "not waiting at a checkpoint" or "already continued".

Owns what makes that safe. An approval decided in place (the run waits at a checkpoint in this
node's memory) is recorded in `run_approvals` with the request's digest, in the decision's own
transaction; one that goes on in a new run (a node restart ended the paused execution) launches
that run under a launch id made of the run id and the approve id, so the run's record carries
the digest (workflowkeys.py) and the same request sent again finds it, or waits on its
admission. Another approve of the run under the same id is refused in one line and changes
nothing. It never decides a checkpoint itself (pauses.py, steps.py).
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass

from subagents_node.actors.runs import runstore
from subagents_node.actors.runs.workflowkeys import BY_LAUNCH_ID, KeyedLaunch
from subagents_node.messages.errors import BadRequest
from subagents_node.messages.pauses import Approve
from subagents_node.messages.supervisor import LaunchResult


@dataclass(frozen=True)
class Approval:
    """One approve of run `run_id` under its client's `approve_id`, and its request's digest."""

    run_id: str
    approve_id: str
    digest: str

    @classmethod
    def of(cls, run_id: str, request: Approve) -> Approval | None:
        """The approve's id and digest (the run named by its full id, so a prefix sent once
        and the full id sent again are one request); None without an approve id."""
        if request.approve_id is None:
            return None
        text = request.model_copy(update={"run_id": run_id}).model_dump_json().encode()
        return cls(run_id, request.approve_id, hashlib.sha256(text).hexdigest())

    def made(self, db: sqlite3.Connection) -> LaunchResult | None:
        """The answer to this approve when it was decided in place already: the run as it is
        now; None when this id decided nothing in place."""
        row = db.execute(
            "SELECT digest FROM run_approvals WHERE run_id=? AND approve_id=?",
            (self.run_id, self.approve_id),
        ).fetchone()
        if row is None:
            return None
        self.check_same(str(row[0]))
        view = runstore.view(db, self.run_id)
        assert view is not None
        return LaunchResult(run=view)

    def record(self, db: sqlite3.Connection, step: int, now: float) -> None:
        """In the decision's transaction: this approve decided checkpoint `step` in place."""
        db.execute(
            "INSERT INTO run_approvals(run_id, approve_id, digest, step, created_at) "
            "VALUES(?, ?, ?, ?, ?)",
            (self.run_id, self.approve_id, self.digest, step, now),
        )

    def keyed(self) -> KeyedLaunch:
        """The key the run that goes on with a parked checkpoint is launched under: one per
        approve id of the run, so that run's record carries this request's digest."""
        made_of = f"{self.run_id}\0{self.approve_id}".encode()
        launch_id = "approve-" + hashlib.sha256(made_of).hexdigest()[:40]
        return KeyedLaunch((BY_LAUNCH_ID, launch_id), self.digest)

    def check_same(self, digest: str | None) -> None:
        """One approve id names one approve of a run: another request under it is refused."""
        if digest != self.digest:
            raise self.conflict()

    def conflict(self) -> BadRequest:
        return BadRequest(
            f"approve id '{self.approve_id}' was already used for another approve of run "
            f"{self.run_id}; use a new approve id",
            reason="approve_id",
            field="approve_id",
        )
