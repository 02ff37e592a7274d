"""The hosts' side of the capacity ledger (DESIGN §1-3, issue 13): which host holds which
slots (per host, and each slot of a session with its host), an operator's release of a lost
host's slots, and the audit of those releases.

Every slot names the node its run executes on ("" = the home node). When an operator declares
a worker lost, `release` frees every slot of that host, reserved or started, and appends one
audit row per slot (proof state `operator`): the "explicit, audited operator release" that is
the only way a started slot is freed without a terminal report's proof (DESIGN §2). A fresh
grant to a run an operator freed starts above the generation freed (`fresh_generation`), so a
report the lost execution still sends (a worker that comes back replays what it queued) is
fenced even once the run holds a slot again (DESIGN §3).

Functions of the CapacityLedger's connection, called only from its handlers and inside the
request's transaction: a release deletes the slots and writes their audit rows together, or,
when anything fails, neither. It must never commit, never free a slot of another host, and
never free a slot it cannot read (INV-CAP-7): that one stays quarantined and occupied.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from subagents_node.actors.capacity import releases, slots
from subagents_node.actors.capacity.rules import verdict_of
from subagents_node.messages.capacity import MAX_LISTED, Inspection
from subagents_node.messages.capacity_holders import Holders, SessionSlots
from subagents_node.messages.capacity_hosts import (
    HostReleased,
    HostSlotCount,
    HostSlots,
    ListReleases,
    OperatorReleases,
    ReleaseHost,
    SlotsByHost,
)

log = logging.getLogger(__name__)

#: `OwnerActor.quarantine(table, key, reason)`: fail closed for one stored row.
Quarantine = Callable[[str, str, str], object]


def release(
    db: sqlite3.Connection, req: ReleaseHost, at: float, quarantine: Quarantine
) -> HostReleased:
    """Free every slot whose run executes on `req.host`, each with its audit row; a host
    holding none is answered with count 0. A slot of that host that does not parse is
    quarantined and kept (counted in `unreadable`)."""
    freed, unreadable = slots.on_host(db, req.host)
    for bad in unreadable:
        quarantine(slots.TABLE, bad.key, bad.reason)
    for record in freed:
        # A pending TTL tick of a reserved slot then finds its slot gone, or held under
        # another token, and does nothing.
        slots.delete(db, record)
        releases.record(db, record, at=at, reason=req.reason, operator=req.operator)
    if freed or unreadable:
        log.warning(
            "capacity: operator %r released %d slots of host %s (%d unreadable kept): %s",
            req.operator,
            len(freed),
            req.host,
            len(unreadable),
            req.reason,
        )
    return HostReleased(
        host=req.host,
        count=len(freed),
        released=[r.handle() for r in freed[:MAX_LISTED]],
        more=len(freed) > MAX_LISTED,
        unreadable=len(unreadable),
    )


def held(db: sqlite3.Connection, req: HostSlots) -> SlotsByHost:
    """Slots held per host (reserved, started); a named host that holds none reads 0, 0."""
    counts = slots.held_per_host(db, req.host, MAX_LISTED + 1)
    listed = [HostSlotCount(host=h, reserved=r, started=s) for h, r, s in counts]
    if req.host is not None and not listed:
        listed = [HostSlotCount(host=req.host, reserved=0, started=0)]
    return SlotsByHost(hosts=listed[:MAX_LISTED], more=len(listed) > MAX_LISTED)


def holders(db: sqlite3.Connection, req: Holders, quarantine: Quarantine) -> SessionSlots:
    """One page of a session's slots, each as `inspect` shows its owner (its host named); a
    slot that does not parse is quarantined, counted and left out, never a failure."""
    records, unreadable, last = slots.of_session(db, req.session_id, req.after_slot, req.limit)
    for bad in unreadable:
        quarantine(slots.TABLE, bad.key, bad.reason)
    return SessionSlots(
        holders=[Inspection(relation="current", owner=r, verdict=verdict_of(r)) for r in records],
        next_after=last,
        unreadable=len(unreadable),
    )


def audit(db: sqlite3.Connection, req: ListReleases, quarantine: Quarantine) -> OperatorReleases:
    """The audit rows, newest first; a row that does not parse is quarantined and left out,
    never a failure of the listing."""
    rows, unreadable = releases.newest(db, req.host, req.limit)
    for key, reason in unreadable:
        quarantine(releases.TABLE, key, reason)
    return OperatorReleases(releases=rows)


def fresh_generation(db: sqlite3.Connection, session_id: str, run_id: str, at_least: int) -> int:
    """The generation of a new grant to `run_id`: `at_least`, and above every generation an
    operator freed for it in the session."""
    freed = releases.highest_generation(db, session_id, run_id)
    return at_least if freed is None else max(at_least, freed + 1)
