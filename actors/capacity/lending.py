"""A slot lent to an unstarted transfer: what a resume sent again and a report about its source
do with it (R-CAP-16, R-CAP-18..20).

Owns the lent record's shape (`lent_record`) and two decisions of the capacity ledger about a
transfer whose run has not started: until it starts, or its grant is rolled back or expires,
the source's record lives on as the lent record's `prev_record`, and that is what a rollback or
TTL gives back. The transfer's answer may
have been lost (its owner restarted between commit and reply, or answered past the run
supervisor's call deadline): that run is never recorded. Before, two things then leaked the
slot for good: the resume sent again found no slot of its source, took a second one, and the
TTL later gave the first back to a source that had gone on (`stopped`, "continued as"); and a
stop of the paused source was answered "transferred" and dropped, so the TTL restored it as
paused. Now a transfer sent again takes the lent slot over (one generation up, which fences the
lost handle), and a report about the source is stored on the record the slot gives back (or,
when its verdict releases the slot, nothing is left to give back: the slot is freed then).

It must never free or grant a slot itself, and never act on a started record (a rollback after
a start is refused forever, R-CAP-17). Called inside the ledger's transaction; no clock (the
ledger passes the times).
"""

from __future__ import annotations

import sqlite3

from subagents_node.actors.capacity import hosts, rules, slots
from subagents_node.messages.capacity import ReportTerminal, SlotRecord, TerminalFacts, Transfer


def pending_transfer(db: sqlite3.Connection, session_id: str, run_id: str) -> SlotRecord | None:
    """The slot an unstarted transfer took from `run_id` (its `prev_record` is `run_id`'s)."""
    record = slots.find_successor(db, run_id, session_id)
    if record is None or record.started or record.prev_record is None:
        return None
    return record if record.prev_record.run_id == run_id else None


def lent_record(
    db: sqlite3.Connection,
    req: Transfer,
    source: SlotRecord,
    lent: SlotRecord | None,
    reserved_at: float,
    expires_at: float,
) -> SlotRecord:
    """The record of `source`'s slot lent to the resume `req`: the source's record is kept as
    its `prev_record` (what a rollback or the TTL gives back), and its generation is one above
    the slot's last (`lent`'s, when a transfer sent again takes the lent slot over), which
    fences every earlier handle."""
    generation = (lent or source).generation + 1
    return SlotRecord(
        session_id=source.session_id,
        session_key=source.session_key,
        slot=source.slot,
        token=source.token,
        run_id=req.run_id,
        source_run_id=source.run_id,
        generation=hosts.fresh_generation(db, req.session_id, req.run_id, generation),
        kind="runner",
        async_dir=req.async_dir,
        host=req.host,  # the resume's node, where it is launched, not the source's
        reserved_at=reserved_at,
        expires_at=expires_at,
        prev_record=source,
    )


def source_reported(db: sqlite3.Connection, req: ReportTerminal, facts: TerminalFacts) -> None:
    """Store `facts` about a run whose slot is lent on the record its rollback gives back; one
    whose verdict releases the slot leaves nothing to give back (the rollback frees it)."""
    lent = pending_transfer(db, req.session_id, req.run_id)
    source = lent.prev_record if lent is not None else None
    if lent is None or source is None or rules.foreign(source, req.host):
        return
    if req.generation is not None and req.generation != source.generation:
        return
    source = rules.reported(source, facts)
    keep = None if rules.verdict_of(source).verdict == "releasable" else source
    slots.update(db, lent.model_copy(update={"prev_record": keep}))
