"""The `capacity_slots` table: its schema and the row <-> SlotRecord mapping. SQL only.

Owned by the CapacityLedger: only its connection, inside its transaction, calls these functions
(they take that connection). One row per occupied slot, keyed by (session id, slot index);
releasing a slot deletes its row, so every query here is bounded by the slots occupied now,
never by the history of a pool. The nested parts of a record (the last terminal report and the
pre-transfer record) are stored as JSON so that a rollback restores them exactly. Each row names
the host its run executes on (version 2; rows written before read as "", the home node).
A row that does not parse into a SlotRecord raises `UnreadableSlot` (never a bare parse error):
the ledger quarantines it, and since `occupied` and `used` count rows, not parsed records, such
a slot stays occupied (fail closed).
It must never decide anything: the rules live in `capacity/rules.py` and the ledger.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from subagents_node.actors.quarantine import reason_of
from subagents_node.messages.capacity import SlotRecord

TABLE = "capacity_slots"


class UnreadableSlot(Exception):
    """A stored slot row that does not parse into a SlotRecord (bad JSON, a value out of its
    domain, an unknown kind, a NULL where one is required)."""

    def __init__(self, session_id: object, slot: object, reason: str) -> None:
        super().__init__(f"{TABLE}[{session_id}/{slot}]: {reason}")
        self.key = f"{session_id}/{slot}"
        self.reason = reason


SCHEMA_V1 = """
CREATE TABLE capacity_slots (
    session_id TEXT NOT NULL,
    slot INTEGER NOT NULL CHECK (slot >= 0),
    session_key TEXT NOT NULL,
    token TEXT NOT NULL,
    run_id TEXT NOT NULL,
    source_run_id TEXT,
    generation INTEGER NOT NULL CHECK (generation >= 0),
    kind TEXT NOT NULL CHECK (kind IN ('runner', 'workflow')),
    async_dir TEXT NOT NULL,
    reserved_at REAL NOT NULL,
    expires_at REAL,
    runner_id TEXT,
    runner_started_at REAL,
    pid INTEGER,
    process_start_time REAL,
    terminal_state TEXT,
    proof_state TEXT,
    terminal TEXT,
    prev_record TEXT,
    PRIMARY KEY (session_id, slot)
) WITHOUT ROWID;
CREATE UNIQUE INDEX capacity_slots_session_run ON capacity_slots (session_id, run_id);
CREATE INDEX capacity_slots_run ON capacity_slots (run_id);
CREATE INDEX capacity_slots_source ON capacity_slots (source_run_id)
    WHERE source_run_id IS NOT NULL;
CREATE INDEX capacity_slots_expiry ON capacity_slots (expires_at) WHERE expires_at IS NOT NULL
"""

#: Version 2 (multi-host): the node each slot's run executes on, "" = the home node, which is
#: what every row written before reads as. Indexed: an operator's release and the per-host
#: counts read one host's rows, not the whole table.
HOST_COLUMN = """
ALTER TABLE capacity_slots ADD COLUMN host TEXT NOT NULL DEFAULT '';
CREATE INDEX capacity_slots_host ON capacity_slots (host)
"""

_KEY = ("session_id", "slot")
_COLUMNS: tuple[str, ...] = tuple(SlotRecord.model_fields)
_VALUES = tuple(c for c in _COLUMNS if c not in _KEY)
_JSON = frozenset({"terminal", "prev_record"})

_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM capacity_slots"
_INSERT = (
    f"INSERT INTO capacity_slots ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _COLUMNS)})"
)
_UPDATE = (
    f"UPDATE capacity_slots SET {', '.join(f'{c} = ?' for c in _VALUES)} "
    "WHERE session_id = ? AND slot = ?"
)
_FIRST = "ORDER BY session_id, slot LIMIT 1"


def load(db: sqlite3.Connection, session_id: str, slot: int) -> SlotRecord | None:
    """The record at (session, slot), or None when the slot is free."""
    row = db.execute(f"{_SELECT} WHERE session_id = ? AND slot = ?", (session_id, slot))
    return _first(row)


def held_by(db: sqlite3.Connection, session_id: str, run_id: str) -> SlotRecord | None:
    """The session's slot whose owner is `run_id` (at most one: a unique index says so)."""
    row = db.execute(f"{_SELECT} WHERE session_id = ? AND run_id = ?", (session_id, run_id))
    return _first(row)


def token_run(db: sqlite3.Connection, session_id: str, token: str) -> str | None:
    """The run whose slot in the session carries `token` (an acquire's id), if one does. A scan
    of the session's own slots (at most its limit), by the primary key's prefix."""
    row = db.execute(
        "SELECT run_id FROM capacity_slots WHERE session_id = ? AND token = ? LIMIT 1",
        (session_id, token),
    ).fetchone()
    return None if row is None else str(row[0])


def find_owner(db: sqlite3.Connection, run_id: str, session_id: str | None) -> SlotRecord | None:
    """The first slot owned by `run_id`, in the given session or in any."""
    if session_id is None:
        return _first(db.execute(f"{_SELECT} WHERE run_id = ? {_FIRST}", (run_id,)))
    return held_by(db, session_id, run_id)


def find_successor(
    db: sqlite3.Connection, run_id: str, session_id: str | None
) -> SlotRecord | None:
    """The first slot that was transferred away from `run_id` (its immediate source)."""
    if session_id is None:
        rows = db.execute(f"{_SELECT} WHERE source_run_id = ? {_FIRST}", (run_id,))
    else:
        rows = db.execute(
            f"{_SELECT} WHERE source_run_id = ? AND session_id = ? {_FIRST}",
            (run_id, session_id),
        )
    return _first(rows)


def occupied(db: sqlite3.Connection, session_id: str) -> list[int]:
    """The occupied slot indices of a session pool, ascending (served by the primary key).

    A row whose index is not an integer has no index to list; `used` still counts it."""
    rows = db.execute(
        "SELECT slot FROM capacity_slots WHERE session_id = ? AND typeof(slot) = 'integer' "
        "ORDER BY slot",
        (session_id,),
    )
    return [int(r[0]) for r in rows]


def pool(db: sqlite3.Connection, session_id: str) -> tuple[int, list[int]]:
    """`used` and `occupied` of a session pool in one statement (an acquire needs both)."""
    slots = [r[0] for r in db.execute(_POOL, (session_id,))]
    # SQLite's integers come back as int, its reals as float, its text as str: `type(...) is
    # int` is `typeof(slot) = 'integer'`, and ORDER BY keeps the integers ascending.
    return len(slots), [slot for slot in slots if type(slot) is int]


_POOL = "SELECT slot FROM capacity_slots WHERE session_id = ? ORDER BY slot"


def used(db: sqlite3.Connection, session_id: str) -> int:
    """R-CAP-3: every occupied slot counts, including those at or above a lowered limit."""
    (count,) = db.execute(
        "SELECT COUNT(*) FROM capacity_slots WHERE session_id = ?", (session_id,)
    ).fetchone()
    return int(count)


def due(db: sqlite3.Connection, now: float) -> list[tuple[str, int]]:
    """The keys of the slots whose deadline is `now` or earlier (served by the expiry index;
    a deadline stored as text never compares as due, so such a row is never freed by time)."""
    rows = db.execute(
        "SELECT session_id, slot FROM capacity_slots "
        "WHERE expires_at IS NOT NULL AND expires_at <= ? AND typeof(slot) = 'integer'",
        (now,),
    )
    return [(str(r[0]), int(r[1])) for r in rows]


def next_deadline(db: sqlite3.Connection, after: float = float("-inf")) -> float | None:
    """The earliest numeric deadline later than `after` (by default, past or not), or None
    when no unstarted slot waits."""
    (deadline,) = db.execute(
        "SELECT MIN(expires_at) FROM capacity_slots WHERE expires_at IS NOT NULL "
        "AND expires_at > ? AND typeof(expires_at) IN ('integer', 'real')",
        (after,),
    ).fetchone()
    return None if deadline is None else float(deadline)


#: R-CAP-6 in SQL: a row is started iff it has a runner id or a start time.
_STARTED = "(runner_id IS NOT NULL OR runner_started_at IS NOT NULL)"


def on_host(db: sqlite3.Connection, host: str) -> tuple[list[SlotRecord], list[UnreadableSlot]]:
    """Every slot whose run executes on `host` (served by the host index): those that parse,
    and the rows that do not."""
    return _parsed(db.execute(f"{_SELECT} WHERE host = ? ORDER BY session_id, slot", (host,)))


def of_session(
    db: sqlite3.Connection, session_id: str, after: int | None, limit: int
) -> tuple[list[SlotRecord], list[UnreadableSlot], int | None]:
    """The session's slots after index `after` (None: from the first), ascending, at most
    `limit` (served by the primary key): those that parse, the rows that do not, and, when
    `limit` rows were read, the index of the last (a next page may follow it), else None."""
    rows = db.execute(
        f"{_SELECT} WHERE session_id = ? AND slot > ? AND typeof(slot) = 'integer' "
        "ORDER BY slot LIMIT ?",
        (session_id, -1 if after is None else after, limit),
    ).fetchall()
    records, unreadable = _parsed(rows)
    return records, unreadable, int(rows[-1]["slot"]) if len(rows) == limit else None


def held_per_host(
    db: sqlite3.Connection, host: str | None, limit: int
) -> list[tuple[str, int, int]]:
    """(host, reserved, started) of each host holding slots, by host name, at most `limit`;
    unreadable rows count too, by their stored host (fail closed: they are occupied)."""
    where, args = ("WHERE host = ?", (host, limit)) if host is not None else ("", (limit,))
    rows = db.execute(
        f"SELECT host, SUM(NOT {_STARTED}), SUM({_STARTED}) FROM capacity_slots {where} "
        "GROUP BY host ORDER BY host LIMIT ?",
        args,
    )
    return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]


def scan(db: sqlite3.Connection) -> tuple[list[SlotRecord], list[UnreadableSlot]]:
    """Every stored slot (bounded by the slots occupied now): those that parse, and the rows
    that do not."""
    return _parsed(db.execute(_SELECT))


def insert(db: sqlite3.Connection, record: SlotRecord) -> None:
    data = _row(record)
    db.execute(_INSERT, tuple(data[c] for c in _COLUMNS))


def update(db: sqlite3.Connection, record: SlotRecord) -> None:
    """Replace the record at the same (session, slot) in place."""
    data = _row(record)
    db.execute(_UPDATE, (*(data[c] for c in _VALUES), record.session_id, record.slot))


def postpone(db: sqlite3.Connection, records: list[SlotRecord], until: float) -> None:
    """Move the deadline of every unstarted record among `records` that is due before `until`
    to `until` (rows that do not parse are not among them: they keep theirs)."""
    for record in records:
        if not record.started and record.expires_at is not None and record.expires_at < until:
            update(db, record.model_copy(update={"expires_at": until}))


def delete(db: sqlite3.Connection, record: SlotRecord) -> None:
    db.execute(
        "DELETE FROM capacity_slots WHERE session_id = ? AND slot = ?",
        (record.session_id, record.slot),
    )


def _row(record: SlotRecord) -> dict[str, Any]:
    data = record.model_dump(mode="json")
    for column in _JSON:
        if data[column] is not None:
            data[column] = json.dumps(data[column], separators=(",", ":"))
    return data


def _record(row: sqlite3.Row) -> SlotRecord:
    data = dict(zip(_COLUMNS, row, strict=True))  # every row is read by _SELECT: its columns
    try:
        for column in _JSON:
            if data[column] is not None:
                data[column] = json.loads(data[column])
        return SlotRecord.model_validate(data)
    except (ValueError, TypeError) as exc:  # json and pydantic errors are ValueErrors
        raise UnreadableSlot(data["session_id"], data["slot"], reason_of(exc)) from None


def _parsed(rows: Iterable[sqlite3.Row]) -> tuple[list[SlotRecord], list[UnreadableSlot]]:
    records: list[SlotRecord] = []
    unreadable: list[UnreadableSlot] = []
    for row in rows:
        try:
            records.append(_record(row))
        except UnreadableSlot as err:
            unreadable.append(err)
    return records, unreadable


def _first(cursor: sqlite3.Cursor) -> SlotRecord | None:
    row = cursor.fetchone()
    return None if row is None else _record(row)
