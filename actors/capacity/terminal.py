"""What the capacity ledger answers about a run that ended: its terminal report's verdict
(R-CAP-21/22) and `inspect` (R-CAP-27).

Owns the decision the run supervisor's `capacity.report_terminal` gets: the facts stored on the
run's slot and the verdict computed from them at once (a releasable one deletes the slot: that
is R-CAP-23's reconcile, done at the only moment its inputs change; anything else is retained,
with the facts `inspect` explains it from), and the verdict for a run that owns no slot in the
session (transferred to its resume, owned in another session, or none). A report is idempotent:
the supervisor's outbox resends it until it is answered.

Called inside the ledger's transaction (capacity/ledger.py sequences it); SQL through slots.py
and lending.py; no clock (the ledger passes the time). It never reads run directories, status
files or another owner's tables, and never frees a slot but by a releasable verdict.
"""

from __future__ import annotations

import logging
import sqlite3

from subagents_node.actors.capacity import lending, rules, slots
from subagents_node.actors.capacity.rules import NO_SLOT, foreign, proof_state, verdict_of
from subagents_node.messages.capacity import (
    Inspect,
    Inspection,
    ReportTerminal,
    TerminalFacts,
    Verdict,
)

log = logging.getLogger(__name__)


def report(db: sqlite3.Connection, req: ReportTerminal, now: float) -> Verdict:
    """Store the run supervisor's facts about a run and apply R-CAP-21/22 at once.

    A second copy of a report that released the slot finds no slot and changes nothing
    (`not-owned`, or `transferred`); one that retained it finds the same facts stored and
    changes nothing either, not even their time, unless the slot changed since (its runner
    started: the same proof may match it now)."""
    facts = facts_of(req, now)
    record = slots.held_by(db, req.session_id, req.run_id)
    if record is None:
        lending.source_reported(db, req, facts)
        return unowned(db, req.session_id, req.run_id)
    if foreign(record, req.host):  # a worker reports its own runs' ends, no other host's
        return Verdict(verdict="not-owned", reason=f"the slot is not {req.host!r}'s")
    if req.generation is not None and req.generation != record.generation:
        return Verdict(
            verdict="not-owned",
            reason=f"the run holds generation {record.generation}, "
            f"not the reported {req.generation}",
        )
    stored = record.terminal
    if (
        stored is not None
        and stored.model_copy(update={"reported_at": 0.0})
        == facts.model_copy(update={"reported_at": 0.0})
        and record.proof_state == proof_state(record, req.proof)
    ):
        return verdict_of(record)  # a replay, and the slot is as these facts found it
    reported = rules.reported(record, facts)
    verdict = verdict_of(reported)
    if verdict.verdict == "releasable":
        slots.delete(db, reported)
        log.debug("capacity: released slot %d of %s: %s", record.slot, record.run_id, verdict)
    else:
        slots.update(db, reported)
    return verdict


def inspect(db: sqlite3.Connection, req: Inspect) -> Inspection:
    """R-CAP-27: the slot the run owns, else the slot it was transferred from, else none."""
    owner = slots.find_owner(db, req.run_id, req.session_id)
    if owner is not None:
        return Inspection(relation="current", owner=owner, verdict=verdict_of(owner))
    successor = slots.find_successor(db, req.run_id, req.session_id)
    if successor is not None:
        return Inspection(
            relation="source", owner=successor, verdict=_transferred_to(successor.run_id)
        )
    return Inspection(relation="none", verdict=Verdict(verdict="not-owned", reason=NO_SLOT))


def unowned(db: sqlite3.Connection, session_id: str, run_id: str) -> Verdict:
    """The verdict for a report about a run that owns no slot in the session."""
    successor = slots.find_successor(db, run_id, session_id)
    if successor is not None:
        return _transferred_to(successor.run_id)
    elsewhere = slots.find_owner(db, run_id, None)
    if elsewhere is not None:
        # R-CAP-21 rule 3, A-21: a report never frees a slot owned in another session.
        return Verdict(
            verdict="retained",
            reason=f"status session {session_id} does not match owner session "
            f"{elsewhere.session_id}",
        )
    return Verdict(verdict="not-owned", reason=NO_SLOT)


def facts_of(req: ReportTerminal, now: float) -> TerminalFacts:
    """The facts a report states, as the slot stores them."""
    return TerminalFacts(
        state=req.state,
        live_process=req.live_process,
        proof=req.proof,
        workflow_children_proven=req.workflow_children_proven,
        reason=req.reason,
        reported_at=now,
    )


def _transferred_to(run_id: str) -> Verdict:
    return Verdict(verdict="not-owned", reason=f"slot was transferred to {run_id}")
