"""Paused runs (R-RUN-2): checkpoints, interrupt-as-pause, and how a paused run goes on.

Owns the rules, not the state: where a pause is recorded (the run's events, so a restarted
node knows it: `run.pausing` before the children are told to stop, `run.paused` once the run
holds no process), what a restarted node does with a paused run (it is not adopted: it holds no
process; a checkpoint whose execution died is reported to the capacity owner as paused with no
live process, so its slot can move to the run that continues it, SPEC §0.4 / A-2), and the
launch that continues a paused run from its step (a resume of an interrupt-pause, or the
approval of a checkpoint after a restart): the steps still to run, the output the first of
them refers to, the source's absolute deadline (R-TMO-8) and nothing to claim (R-FAN-23).

A paused run keeps its capacity slot until the run that continues it takes it over (R-CAP-18):
`paused` is not terminal (R-RUN-3), so the slot's verdict is "run is still paused".
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from subagents_node.actors.runs import appendrecovery, expansion, runstore
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.recovery import read_recovery
from subagents_node.messages.errors import DeadlineExpired, PauseRefused, RunNotResumable
from subagents_node.messages.supervisor import ChainStep, Launch, PauseKind

PAUSING = "run.pausing"
PAUSED = runstore.PAUSED_EVENT
APPROVED = "checkpoint.approved"
REJECTED = "checkpoint.rejected"
#: R-TMO-8's text.
DEADLINE_EXPIRED = "The source run's absolute deadline expired before recovery could launch."


def refuse(run_id: str, problem: str, reason: str) -> PauseRefused:
    return PauseRefused(f"Run '{run_id}' {problem}", run_id=run_id, reason=reason)


def check_pausable(row: sqlite3.Row, live: LiveRun | None) -> None:
    """Interrupt-as-pause needs a running background run (a foreground caller waits on its
    end; a resume relaunches in the background, R-RES-3)."""
    run_id = str(row["run_id"])
    if live is None or live.stop_state is not None or live.settling or row["state"] != "running":
        # A live run on its way out still reads `running`: "is running; only a running run
        # can be paused" contradicted itself.
        ending = live is not None and row["state"] == "running"
        state = "ending" if ending else str(row["state"])
        raise refuse(run_id, f"is {state}; only a running run can be paused.", "state")
    if not row["background"]:
        raise refuse(run_id, "runs in the foreground; only background runs pause.", "foreground")
    if row["mode"] == "workflow":
        raise refuse(run_id, "is a workflow; stop it instead.", "workflow")


def pausing(db: sqlite3.Connection, row: sqlite3.Row, live: LiveRun | None) -> bool:
    """Whether an interrupt-pause of the run was asked for already: its children are being
    stopped (it still reads `running`), or it settled `paused` by one (a pause sent again)."""
    if live is not None and live.stop_state == "paused":
        return True
    record = pause_record(db, str(row["run_id"])) if row["state"] == "paused" else None
    return row["state"] == "paused" and record is not None and record.get("kind") == "interrupt"


def pause_point(live: LiveRun) -> int:
    """The group a resume continues from: the one running now (its children are stopped and
    run again), else the next one (between steps, or while a step's claim is out)."""
    return live.next_group - 1 if live.running and live.next_group > 0 else live.next_group


def pause_record(db: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The latest pause of the run (`kind`, absolute `step`, `note`), if its last pause event
    is not a decision."""
    row = db.execute(
        "SELECT kind, data FROM run_events WHERE run_id=? AND kind IN (?, ?, ?, ?) "
        "ORDER BY seq DESC LIMIT 1",
        (run_id, PAUSING, PAUSED, APPROVED, REJECTED),
    ).fetchone()
    if row is None or row[0] not in (PAUSING, PAUSED):
        return None
    data: dict[str, Any] = json.loads(row[1])
    data["settled"] = row[0] == PAUSED
    return data


def rejected(db: sqlite3.Connection, run_id: str) -> bool:
    """Whether the run's last checkpoint decision rejected it (it ends, or ended, `rejected`:
    a reject sent again is answered with it, R-RUN-3 makes that state final)."""
    row = db.execute(
        "SELECT kind FROM run_events WHERE run_id=? AND kind IN (?, ?, ?, ?) "
        "ORDER BY seq DESC LIMIT 1",
        (run_id, PAUSING, PAUSED, APPROVED, REJECTED),
    ).fetchone()
    return row is not None and row[0] == REJECTED


def successor(db: sqlite3.Connection, run_id: str) -> str | None:
    """The run that went on with `run_id` and took its slot over. A relaunch that failed or
    was stopped does not count: one that failed at admission gave the slot back (R-RES-5),
    and the source stays paused, resumable again. A chain attached to it (its step 0 is the
    source) or a rerun of one of its children names it as source too, and continues nothing."""
    row = db.execute(
        "SELECT run_id FROM runs WHERE source_run_id=? AND state NOT IN ('failed', 'stopped') "
        "AND COALESCE(source_kind, 'resume') = 'resume' ORDER BY created_at LIMIT 1",
        (run_id,),
    ).fetchone()
    return str(row[0]) if row else None


def parked(db: sqlite3.Connection, run_id: str) -> bool:
    """A paused run holds no process: a restarted node does not adopt it."""
    row = runstore.run_row(db, run_id)
    return row is not None and row["state"] == "paused"


def adopt_pausing(db: sqlite3.Connection, live: LiveRun) -> None:
    """After a restart: a run whose pause was asked for but not settled settles as paused, and
    one that died while an expansion's claim was out, or before it reached a dynamic step,
    fails (the adopted run starts no new step, so those items never start)."""
    record = pause_record(db, live.run_id)
    if record is not None and not record["settled"]:
        live.stop_state = "paused"
        live.failed = False
        live.error = ""
    elif expansion.interrupted(db, live.run_id) or _unopened_dynamic(db, live):
        live.failed = True
        live.error = live.error or expansion.INTERRUPTED
    elif appendrecovery.unfinished(db, live.run_id):  # its appended steps never joined it
        live.failed = True
        live.error = live.error or "The node restarted before every child started."


def _unopened_dynamic(db: sqlite3.Connection, live: LiveRun) -> bool:
    """A restarted node starts no new step (the adopted run has no launch): a chain whose
    expand or checkpoint steps were not all opened must not settle `complete` without them."""
    try:
        launch, _ = read_recovery(live.run_dir, live.run_id)
    except RunNotResumable:
        return False
    dynamic = sum(1 for step in launch.chain if step.kind != "run")
    if not dynamic:
        return False
    (opened,) = db.execute(
        "SELECT COUNT(*) FROM run_events WHERE run_id=? AND kind IN (?, ?)",
        (live.run_id, expansion.EXPANDED, APPROVED),
    ).fetchone()
    return int(opened) < dynamic


def check_deadline(run_id: str, deadline_at: float | None, now: float) -> None:
    """R-TMO-8: a resume inherits the source's absolute deadline; none left, no launch."""
    if deadline_at is not None and deadline_at - now <= 0:
        raise DeadlineExpired(DEADLINE_EXPIRED, run_id=run_id, deadline_at=deadline_at)


def waiting_checkpoint(db: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
    """The checkpoint a run waits at; refused when it waits at none."""
    run_id = str(row["run_id"])
    record = pause_record(db, run_id)
    if row["state"] != "paused" or record is None or record.get("kind") != "checkpoint":
        raise refuse(run_id, f"is {row['state']}, not waiting at a checkpoint.", "no_checkpoint")
    taken = successor(db, run_id)
    if taken is not None:
        raise refuse(run_id, f"was already continued as run {taken}.", "continued")
    return record


def check_continuable(db: sqlite3.Connection, row: sqlite3.Row, kind: PauseKind) -> None:
    """A resume goes on with an interrupt-pause, an approval with a checkpoint; either only
    once (the first run that continued it took its slot over)."""
    run_id = str(row["run_id"])
    taken = successor(db, run_id)
    if taken is not None:
        raise refuse(run_id, f"was already continued as run {taken}.", "continued")
    record = pause_record(db, run_id) or {}
    if record.get("kind") == "checkpoint" and kind == "interrupt":
        raise refuse(
            run_id,
            "is waiting at a checkpoint; approve or reject it instead of resuming it.",
            "checkpoint",
        )
    if not record.get("settled"):
        raise refuse(run_id, "is still pausing; resume it once it is paused.", "pausing")


def continuation(
    db: sqlite3.Connection, row: sqlite3.Row, source: Launch, kind: PauseKind, now: float
) -> Launch:
    """The launch that goes on with a paused run: the steps from its pause point (after the
    checkpoint, for an approval), the output the first of them refers to, the source's
    absolute deadline (R-TMO-8). A single or parallel run runs its unfinished items again."""
    run_id = str(row["run_id"])
    check_deadline(run_id, row["deadline_at"], now)
    record = pause_record(db, run_id)
    if record is None or record.get("kind") != kind:
        raise RunNotResumable(f"Run '{run_id}' has no {kind} pause to go on from.", run_id=run_id)
    update: dict[str, Any] = {"deadline_at": row["deadline_at"]}
    if source.mode == "parallel":
        done = {
            int(r[0])
            for r in db.execute(
                "SELECT idx FROM run_children WHERE run_id=? AND state='complete'", (run_id,)
            ).fetchall()
        }
        left = [item for i, item in enumerate(source.items) if i not in done]
        update["items"] = left or list(source.items)
        return source.model_copy(update=update)
    if source.mode != "chain":
        return source.model_copy(update=update)
    start = int(record["step"]) + (1 if kind == "checkpoint" else 0)
    first = start - source.chain_offset
    if first >= len(source.chain):
        raise RunNotResumable(f"Run '{run_id}' has no step left to run.", run_id=run_id)
    seed = _seed(db, run_id, first, source)
    steps = list(source.chain[first:])
    expanded = _expanded_items(db, run_id, first) or _claimed_expansion(db, run_id, start)
    if steps[0].kind == "expand" and expanded:
        # Its items were claimed already (R-FAN-23: never again): they run as a plain step.
        template = steps[0].items[0]
        items = [
            template.model_copy(update={"task": expansion.item_task(template.task, text)})
            for text in expansion.split_items(seed or "")[: len(expanded)]
        ]
        steps[0] = ChainStep(items=items or [template], parallel=True)
    if all(step.kind == "checkpoint" for step in steps):
        raise RunNotResumable(f"Run '{run_id}' has no step left to run.", run_id=run_id)
    update.update({"chain": steps, "chain_offset": start, "seed_previous": seed})
    return source.model_copy(update=update)


def _seed(db: sqlite3.Connection, run_id: str, first: int, source: Launch) -> str | None:
    """The output of the last step before `first` that ran children (what `{previous}` and an
    expand step's input refer to); None when there is none."""
    row = db.execute(
        "SELECT MAX(step) FROM run_children WHERE run_id=? AND step<?", (run_id, first)
    ).fetchone()
    if row is None or row[0] is None:
        return source.seed_previous
    outputs = db.execute(
        "SELECT output FROM run_children WHERE run_id=? AND step=? ORDER BY idx",
        (run_id, int(row[0])),
    ).fetchall()
    return "\n\n".join(str(o[0]).strip() for o in outputs)


def _claimed_expansion(db: sqlite3.Connection, run_id: str, absolute: int) -> list[str]:
    """A step paused while its batch claim was out: the claims were made (R-FAN-15), so the
    run that goes on must not claim them again."""
    for event in runstore.events_of_kind(db, run_id, expansion.EXPANDING):
        if event.data.get("step") == absolute:
            count = int(str(event.data["items"]))
            return [f"chain[{absolute}].expand[{j}]" for j in range(count)]
    return []


def _expanded_items(db: sqlite3.Connection, run_id: str, group: int) -> list[str]:
    rows = db.execute(
        "SELECT label FROM run_children WHERE run_id=? AND step=? ORDER BY idx", (run_id, group)
    ).fetchall()
    return [str(r[0]) for r in rows]
