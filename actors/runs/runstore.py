"""The RunSupervisor's tables: runs, their children, and their event log.

Owns the SQL of the "supervisor" table family and the mapping between rows and the views sent
to clients (the family's migrations are runs/runschema.py's; `run_outbox`'s SQL is in
runs/outbox.py). Only the RunSupervisor's connection calls these functions (one writer per
family).
Task text is never stored (R-MISC-1): rows hold labels, agent names, states and outputs.
A run or child row that breaks its invariants (checked in SQL: `RUN_CHECKS`, `CHILD_CHECKS`) or
does not parse into its view raises `RecordQuarantined` from `view`, never a bare parse error;
`unreadable` finds every such row of the runs that may still be going for the supervisor's
`recover()` (by index: a finished run's is found when it is first read).
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Callable
from typing import Any, get_args

from subagents_node.actors import quarantine
from subagents_node.messages.errors import RecordQuarantined
from subagents_node.messages.runs import TERMINAL_RUN_STATES, ProofState, RunState
from subagents_node.messages.supervisor import (
    ChildView,
    ChildViewState,
    IntercomMessage,
    RunEvent,
    RunMode,
    RunView,
    Snapshots,
)

#: The owner that reports these tables' quarantined rows (RunSupervisor.name).
OWNER = "supervisor"
RUNS, CHILDREN = "runs", "run_children"


RUN_CHECKS = (
    *(quarantine.text(c) for c in ("session_id", "label", "root_run_id", "run_dir", "runner_id")),
    *(quarantine.text(c) for c in ("error", "output", "fanout")),
    *(quarantine.text(c, nullable=True) for c in ("parent_run_id", "source_run_id")),
    quarantine.one_of("mode", get_args(RunMode)),
    quarantine.one_of("state", get_args(RunState)),
    quarantine.integer("background", 0, 1),
    quarantine.integer("depth", 0),
    quarantine.number("created_at"),
    *(quarantine.number(c, nullable=True) for c in ("started_at", "ended_at", "deadline_at")),
    quarantine.json("snapshots"),
    quarantine.json("capacity", nullable=True),
    quarantine.integer("foreground_pid", 1, nullable=True),
    quarantine.number("foreground_start", nullable=True),
)
CHILD_CHECKS = (
    quarantine.integer("idx", 0),
    *(quarantine.text(c) for c in ("child_id", "label", "agent", "error", "output")),
    quarantine.one_of("state", get_args(ChildViewState)),
    *(quarantine.integer(c, nullable=True) for c in ("pid", "exit_code", "signal")),
    *(quarantine.number(c, nullable=True) for c in ("started_at", "ended_at")),
    quarantine.one_of("proof_state", get_args(ProofState), nullable=True),
)
_RUN_PROBLEM = quarantine.problem(RUN_CHECKS)
_CHILD_PROBLEM = quarantine.problem(CHILD_CHECKS)


def _not_finished(column: str) -> str:
    """`column` holds no terminal state: the ranges between the terminal states (in SQLite's
    order, so an unknown state, a number or a blob falls in one), each answered by an index
    on the column, never by a scan of the finished runs."""
    ends = sorted(TERMINAL_RUN_STATES)
    gaps = [f"{column} < '{ends[0]}'", f"{column} > '{ends[-1]}'"]
    gaps += [f"({column} > '{a}' AND {column} < '{b}')" for a, b in itertools.pairwise(ends)]
    return " OR ".join(gaps)


#: Runs that may still be going: any state but a terminal one (an unreadable one included).
NOT_FINISHED = _not_finished("state")


def unreadable(db: sqlite3.Connection) -> list[RecordQuarantined]:
    """Every row of a run that may still be going (and of its children) that breaks its
    invariants. A finished run holds nothing to adopt, so recovery never reads the history:
    a finished run's broken row is reported when a view or listing first reads it."""
    return [
        RecordQuarantined.of(OWNER, table, key, reason)
        for table, key_sql, checks, where in (
            (RUNS, "run_id", RUN_CHECKS, NOT_FINISHED),
            (
                CHILDREN,
                "run_id || '/' || idx",
                CHILD_CHECKS,
                f"run_id IN (SELECT run_id FROM runs WHERE {NOT_FINISHED})",
            ),
        )
        for key, reason in quarantine.broken_rows(db, table, key_sql, checks, where)
    ]


#: How many of a run's intercom messages its view carries (the latest): a child may send any
#: number, and every view, watch and listing that includes the run would carry them all.
MAX_VIEW_INTERCOM = 100

#: The event a run records once it is paused (R-RUN-2): its kind, step and checkpoint note.
PAUSED_EVENT = "run.paused"

_RUN_COLUMNS = (
    "run_id, session_id, mode, background, state, label, depth, parent_run_id, root_run_id, "
    "run_dir, created_at, started_at, ended_at, deadline_at, error, output, runner_id, fanout, "
    "capacity, snapshots, source_run_id, workflow_key, workflow_token, intercom, source_kind, "
    "superseded_by, foreground_pid, foreground_start"
)


def insert_run(db: sqlite3.Connection, row: dict[str, Any]) -> None:
    row = {
        "error": "",
        "output": "",
        "intercom": "on",
        **row,
        "snapshots": row["snapshots"].model_dump_json(),
    }
    names = _RUN_COLUMNS.split(", ")
    db.execute(
        f"INSERT INTO runs({_RUN_COLUMNS}) VALUES({', '.join('?' for _ in names)})",
        [row.get(n) for n in names],
    )


def update_run(db: sqlite3.Connection, run_id: str, **fields: Any) -> None:
    if "snapshots" in fields:
        fields["snapshots"] = fields["snapshots"].model_dump_json()
    sets = ", ".join(f"{k}=?" for k in fields)
    db.execute(f"UPDATE runs SET {sets} WHERE run_id=?", [*fields.values(), run_id])


def insert_child(db: sqlite3.Connection, row: dict[str, Any]) -> None:
    names = list(row)
    db.execute(
        f"INSERT INTO run_children({', '.join(names)}) VALUES({', '.join('?' for _ in names)})",
        [row[n] for n in names],
    )


def update_child(db: sqlite3.Connection, run_id: str, idx: int, **fields: Any) -> None:
    sets = ", ".join(f"{k}=?" for k in fields)
    db.execute(
        f"UPDATE run_children SET {sets} WHERE run_id=? AND idx=?", [*fields.values(), run_id, idx]
    )


def append_event(
    db: sqlite3.Connection, run_id: str, ts: float, kind: str, data: dict[str, Any]
) -> RunEvent:
    cur = db.execute(
        "INSERT INTO run_events(run_id, ts, kind, data) VALUES(?, ?, ?, ?)",
        (run_id, ts, kind, json.dumps(data)),
    )
    return RunEvent(seq=int(cur.lastrowid or 0), ts=ts, kind=kind, data=data)


def events_after(
    db: sqlite3.Connection, run_id: str, after_seq: int, limit: int = -1
) -> list[RunEvent]:
    """The run's events after `after_seq`, in order, at most `limit` (-1: all)."""
    rows = db.execute(
        "SELECT seq, ts, kind, data FROM run_events WHERE run_id=? AND seq>? ORDER BY seq LIMIT ?",
        (run_id, after_seq, limit),
    ).fetchall()
    return [RunEvent(seq=r[0], ts=r[1], kind=r[2], data=json.loads(r[3])) for r in rows]


def events_of_kind(
    db: sqlite3.Connection, run_id: str, kind: str, last: int = -1
) -> list[RunEvent]:
    """The run's events of `kind` in order; only the `last` ones when given."""
    rows = db.execute(
        "SELECT seq, ts, kind, data FROM run_events WHERE run_id=? AND kind=? "
        "ORDER BY seq DESC LIMIT ?",
        (run_id, kind, last),
    ).fetchall()
    return [RunEvent(seq=r[0], ts=r[1], kind=r[2], data=json.loads(r[3])) for r in reversed(rows)]


def workflows_awaiting_children(db: sqlite3.Connection) -> list[str]:
    """Settled workflows that hold a capacity slot while a child run of theirs is live: found
    from the live runs (by the state index), never by a walk over every run kept."""
    found = dict.fromkeys(  # one per workflow, in SQL's order (several children may be live)
        str(row[0])
        for row in db.execute(
            "SELECT w.run_id FROM runs c CROSS JOIN runs w "
            "ON w.run_id = c.parent_run_id "
            "WHERE c.state IN ('queued', 'running', 'paused') AND w.mode = 'workflow' "
            "AND w.state NOT IN ('queued', 'running', 'paused') "
            "AND w.capacity IS NOT NULL AND w.capacity != ''"
        )
    )
    return list(found)


def child_runs(db: sqlite3.Connection, parent_run_id: str) -> list[sqlite3.Row]:
    rows: list[sqlite3.Row] = db.execute(
        "SELECT run_id, state, background, workflow_key FROM runs WHERE parent_run_id=?",
        (parent_run_id,),
    ).fetchall()
    return rows


def proof_states(db: sqlite3.Connection, run_id: str) -> list[str | None]:
    rows = db.execute("SELECT proof_state FROM run_children WHERE run_id=?", (run_id,))
    return [r[0] for r in rows.fetchall()]


def all_events_after(db: sqlite3.Connection, after_seq: int, limit: int) -> list[RunEvent]:
    rows = db.execute(
        "SELECT seq, ts, kind, data, run_id FROM run_events WHERE seq>? ORDER BY seq LIMIT ?",
        (after_seq, limit),
    ).fetchall()
    return [
        RunEvent(seq=r[0], ts=r[1], kind=r[2], data=json.loads(r[3]), run_id=r[4]) for r in rows
    ]


def last_event_seq(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT MAX(seq) FROM run_events").fetchone()
    return int(row[0] or 0)


def resolve_run_id(db: sqlite3.Connection, run_id_or_prefix: str) -> str | None:
    """An exact id, else a unique prefix; None when nothing matches. Ambiguity is an error.
    The node's ids are lowercase: a prefix typed in uppercase that matches nothing is tried
    in lowercase."""
    row = db.execute("SELECT run_id FROM runs WHERE run_id=?", (run_id_or_prefix,)).fetchone()
    if row:
        return str(row[0])
    rows = _with_prefix(db, run_id_or_prefix)
    if not rows and run_id_or_prefix.lower() != run_id_or_prefix:
        rows = _with_prefix(db, run_id_or_prefix.lower())
    if len(rows) > 1:
        raise LookupError(run_id_or_prefix)
    return rows[0] if rows else None


def _with_prefix(db: sqlite3.Connection, prefix: str) -> list[str]:
    """At most two run ids that start with `prefix`, by a range of the primary key (ids
    compare as UTF-8 bytes, in code point order), never by a scan of every run."""
    last = prefix[-1:]
    if not last or ord(last) >= 0x10FFFF:  # no string just above it: up to the last id
        rows = db.execute(
            "SELECT run_id FROM runs WHERE run_id >= ? ORDER BY run_id LIMIT 2", (prefix,)
        ).fetchall()
    else:
        following = ord(last) + 1
        above = prefix[:-1] + chr(0xE000 if 0xD800 <= following < 0xE000 else following)
        rows = db.execute(
            "SELECT run_id FROM runs WHERE run_id >= ? AND run_id < ? ORDER BY run_id LIMIT 2",
            (prefix, above),
        ).fetchall()
    return [str(r[0]) for r in rows if str(r[0]).startswith(prefix)]


def run_row(db: sqlite3.Connection, run_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = db.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run_id,)
    ).fetchone()
    return row


def paused_deadline(db: sqlite3.Connection, run_id: str) -> float | None:
    """The absolute deadline of run `run_id` if it is `paused` and has one (R-RUN-2)."""
    row = db.execute(
        "SELECT deadline_at FROM runs WHERE run_id=? AND state='paused'", (run_id,)
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def view(db: sqlite3.Connection, run_id: str) -> RunView | None:
    """The run's view, None when there is no such run; `RecordQuarantined` when its row or
    one of its children's rows cannot be read."""
    row = db.execute(
        f"SELECT {_RUN_COLUMNS}, {_RUN_PROBLEM} AS problem FROM runs WHERE run_id=?", (run_id,)
    ).fetchone()
    if row is None:
        return None
    if row["problem"] is not None:
        raise RecordQuarantined.of(OWNER, RUNS, run_id, row["problem"])
    children = db.execute(
        "SELECT child_id, idx, label, agent, state, pid, exit_code, signal, started_at, "
        f"ended_at, error, output, stdout_path, stderr_path, proof_state, {_CHILD_PROBLEM} "
        "FROM run_children WHERE run_id=? ORDER BY idx",
        (run_id,),
    ).fetchall()
    for c in children:
        if c[15] is not None:
            raise RecordQuarantined.of(OWNER, CHILDREN, f"{run_id}/{c[1]}", c[15])
    try:
        return _view(db, row, children)
    except (ValueError, TypeError) as exc:  # pydantic's errors are ValueErrors
        raise RecordQuarantined.of(OWNER, RUNS, run_id, quarantine.reason_of(exc)) from None


def resumed_by(db: sqlite3.Connection, run_id: str) -> str | None:
    """The first run that resumed `run_id` (a rerun or an attach that names it as its source
    is no resume)."""
    row = db.execute(
        "SELECT run_id FROM runs WHERE source_run_id=? AND COALESCE(source_kind, 'resume') "
        "= 'resume' ORDER BY created_at LIMIT 1",
        (run_id,),
    ).fetchone()
    return str(row[0]) if row else None


def _view(db: sqlite3.Connection, row: sqlite3.Row, children: list[sqlite3.Row]) -> RunView:
    run_id = str(row["run_id"])
    paused: dict[str, Any] = {}
    if row["state"] == "paused":
        found = events_of_kind(db, run_id, PAUSED_EVENT)
        paused = found[-1].data if found else {}
    successor = resumed_by(db, run_id)
    return RunView(
        run_id=row["run_id"],
        session_id=row["session_id"],
        mode=row["mode"],
        background=bool(row["background"]),
        state=row["state"],
        label=row["label"],
        depth=row["depth"],
        parent_run_id=row["parent_run_id"],
        root_run_id=row["root_run_id"],
        run_dir=row["run_dir"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        deadline_at=row["deadline_at"],
        error=row["error"],
        output=row["output"],
        snapshots=Snapshots.model_validate_json(row["snapshots"]),
        fanout_descriptor=row["fanout"],
        runner_id=row["runner_id"],
        source_run_id=row["source_run_id"],
        source_kind=row["source_kind"],
        workflow_key=row["workflow_key"],
        superseded_by=row["superseded_by"],
        paused=paused.get("kind"),
        paused_step=paused.get("step"),
        checkpoint_note=str(paused.get("note") or ""),
        resumed_by=successor,
        intercom=[
            IntercomMessage(
                run_id=run_id,
                child_id=str(e.data.get("child") or ""),
                text=str(e.data["text"]),
                ts=e.ts,
            )
            for e in events_of_kind(db, run_id, "intercom", last=MAX_VIEW_INTERCOM)
        ],
        children=[
            ChildView(
                child_id=c[0],
                index=c[1],
                label=c[2],
                agent=c[3],
                state=c[4],
                pid=c[5],
                exit_code=c[6],
                signal=c[7],
                started_at=c[8],
                ended_at=c[9],
                error=c[10],
                output=c[11],
                stdout_path=c[12],
                stderr_path=c[13],
                proof_state=c[14],
            )
            for c in children
        ],
    )


def readable_views(
    db: sqlite3.Connection,
    run_ids: list[str],
    unreadable: Callable[[RecordQuarantined], object] = lambda err: None,
) -> list[RunView]:
    """The views of the runs that exist and can be read; each run left out because it cannot
    be read goes to `unreadable`."""
    views: list[RunView] = []
    for run_id in run_ids:
        try:
            found = view(db, run_id)
        except RecordQuarantined as err:
            unreadable(err)
            continue
        if found is not None:
            views.append(found)
    return views


def list_runs(
    db: sqlite3.Connection,
    session_id: str | None,
    active_only: bool,
    limit: int,
    root_run_id: str | None = None,
    parent_run_id: str | None = None,
    after_run_id: str | None = None,
) -> list[str]:
    """Newest first (run_id breaks ties, so pages never skip or repeat a run); after_run_id,
    an existing run, starts the page after it."""
    clauses: list[str] = []
    args: list[Any] = []
    filters = (("session_id", session_id), ("root_run_id", root_run_id))
    for column, value in (*filters, ("parent_run_id", parent_run_id)):
        if value is not None:
            clauses.append(f"{column}=?")
            args.append(value)
    if active_only:
        clauses.append("state IN ('queued', 'running', 'paused')")
    if after_run_id is not None:
        clauses.append(
            "(created_at, run_id) < (SELECT created_at, run_id FROM runs WHERE run_id=?)"
        )
        args.append(after_run_id)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = db.execute(
        f"SELECT run_id FROM runs {where} ORDER BY created_at DESC, run_id DESC LIMIT ?",
        [*args, limit],
    ).fetchall()
    return [str(r[0]) for r in rows]


def unsettled_runs(db: sqlite3.Connection) -> list[str]:
    rows = db.execute("SELECT run_id FROM runs WHERE state IN ('queued', 'running', 'paused')")
    return [str(r[0]) for r in rows.fetchall()]
