"""What a restarted node does with a chain append whose record outlived its node (R-APP-4).

Owns the steps an append record carries (`run_appends.body`, written with the record, before
its claims are committed) and the two rules that keep such an append from being lost when the
node dies between the record and the steps joining the run: the run that was adopted without
them cannot settle `complete` (it fails as a run with children it never started does, so it
can be resumed), and once the recovered claims are committed the steps join the run's
recovery descriptor, so that resume runs them. An append whose reservation expired instead
was never made: its steps join nothing. Reads and writes only the supervisor's rows and the
run's recovery.json; it sends nothing (the commit is owed through the outbox by restart.py).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

from pydantic import ValidationError

from subagents_node.actors.runs.recovery import read_recovery, write_recovery
from subagents_node.messages.errors import RunNotResumable
from subagents_node.messages.fanout import encode_descriptor
from subagents_node.messages.supervisor import ChainStep

log = logging.getLogger(__name__)

#: Append records whose steps may not have joined their run: recorded, commit not answered.
UNFINISHED = ("pending", "committing")


def body(steps: list[ChainStep]) -> str:
    """The steps as the record keeps them."""
    return json.dumps([step.model_dump(mode="json") for step in steps])


def unfinished(db: sqlite3.Connection, run_id: str) -> bool:
    """The run has an append whose steps it may never have received (a node died first)."""
    row = db.execute(
        f"SELECT 1 FROM run_appends WHERE run_id=? AND state IN {UNFINISHED} LIMIT 1", (run_id,)
    ).fetchone()
    return row is not None


def committed(db: sqlite3.Connection, reservation_id: str) -> None:
    """A recovered append's claims are committed: its steps join the run's recovery
    descriptor (after every step already there), so a resume of the run runs them."""
    row = db.execute(
        "SELECT a.body, r.run_id, r.run_dir FROM run_appends a JOIN runs r USING (run_id) "
        "WHERE a.reservation_id=?",
        (reservation_id,),
    ).fetchone()
    if row is None or row[0] is None:
        return  # pruned since, or recorded before records kept their steps
    try:
        steps = _steps_of(row[0])
        launch, descriptor = read_recovery(Path(row[2]), str(row[1]))
        extended = launch.model_copy(update={"chain": [*launch.chain, *steps]})
        write_recovery(Path(row[2]), extended, encode_descriptor(descriptor))
    except (ValueError, ValidationError, RunNotResumable, OSError) as exc:
        log.error(
            "append %s of run %s: its steps did not join recovery.json: %s",
            reservation_id,
            row[1],
            exc,
        )


def _steps_of(body: str | bytes) -> list[ChainStep]:
    """The steps an append record keeps, read with ChainStep's own validator: a TypeAdapter
    built at import made every supervisor build (and hold, idle) a validator of its own,
    about 2 MiB of pydantic-core pages per owner process."""
    raw = json.loads(body)
    if not isinstance(raw, list):
        raise ValueError(f"an append record's steps are a list, not {type(raw).__name__}")
    return [ChainStep.model_validate(step) for step in raw]
