"""Run management: chain append and the workflow children verdict (SPEC §11-12; what a resume
launches is relaunch.py's).

Owns the rules, not the state: each function reads the supervisor's tables and the run's
recovery descriptor and returns what the RunSupervisor should do (the paths an append claims,
whether a workflow's background children are proven). The append pipeline is
a generator the supervisor drives like admission, so its fan-out calls never block the actor.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Generator
from typing import Protocol

from subagents_node.actors.pipelines import Durable
from subagents_node.actors.runs import appendrecovery, runplan, runstore
from subagents_node.actors.runs.admission import check_items
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.actors.runs.recovery import write_recovery
from subagents_node.messages.base import Message, Request
from subagents_node.messages.errors import (
    AppendRejected,
    FanoutLimitExceeded,
    InjectedFault,
    OwnerUnavailable,
    SubagentsError,
    WorkflowChildRefused,
)
from subagents_node.messages.fanout import (
    AbortReservation,
    CommitReservation,
    FanoutDescriptor,
    ReservationGrant,
    ReservePaths,
    encode_descriptor,
)
from subagents_node.messages.lineage import AppendResult
from subagents_node.messages.supervisor import ChainStep, Launch, TaskItem

#: How long an append's claims are held while its record becomes durable (R-APP-4).
APPEND_TTL_S = 300.0
#: The fault point (nodes started with faults: tests) at which an append's record fails.
RECORD_APPEND = "record_append"
#: An append's row while its reserve is out: its reservation id, nothing more (no steps, no
#: append id: it is no append until the grant comes and it becomes 'pending').
RESERVING = "reserving"
ACTIVE = ("queued", "running", "paused")


def append_paths(start: int, steps: list[ChainStep]) -> list[str]:
    """R-APP-3: static paths of steps appended at absolute index `start`."""
    paths: list[str] = []
    for offset, step in enumerate(steps):
        index = start + offset
        if step.kind != "run":
            continue  # dynamic and checkpoint steps contribute nothing (R-APP-3)
        if step.parallel:
            paths += [f"chain[{index}].parallel[{j}]" for j in range(len(step.items))]
        else:
            paths.append(f"chain[{index}]")
    return paths


def check_append_items(run_id: str, launch: Launch, start: int, steps: list[ChainStep]) -> None:
    """R-APP-1: appended steps pass the checks a launch's steps pass before anything is
    claimed for them (working directory, command, argv task), so a step that could never
    start is refused instead of claimed and then failing the chain when it comes up."""
    labelled: list[tuple[str, TaskItem]] = []
    for offset, step in enumerate(steps):
        label = f"chain[{start + offset}]"
        for j, item in enumerate(step.items):
            labelled.append((f"{label}.parallel[{j}]" if step.parallel else label, item))
    try:
        check_items(launch, labelled)
    except SubagentsError as err:  # R-APP-5's wording, the check's own type and details
        problem = f"Failed to append step to chain run {run_id}: {err.message}"
        raise type(err)(problem, **err.details) from None


def append_rejected(run_id: str, problem: str, **details: object) -> AppendRejected:
    return AppendRejected(
        f"Failed to append step to chain run {run_id}: {problem}", run_id=run_id, **details
    )


class AppendHost(Protocol):
    @property
    def db(self) -> sqlite3.Connection: ...

    def clock(self) -> float: ...

    def after_commit(self, effect: Callable[[], None]) -> None: ...

    def crash_point(self, point: str) -> None:
        """Tests only: kill the process at `point` (a node started with faults)."""

    @property
    def fault_points(self) -> frozenset[str]:
        """Tests only: steps told to fail with InjectedFault (a node started with faults)."""

    def extend_chain(self, run_id: str, steps: list[ChainStep]) -> str:
        """Add the committed steps to the live run; answers a bookkeeping warning ('' if
        none, R-APP-5)."""

    def owe(self, request: Request, run_id: str) -> None:
        """Put `request` in the outbox, in the current transaction: sent once it commits, and
        again until its owner answers."""


def append_pipeline(
    host: AppendHost,
    run_id: str,
    descriptor: FanoutDescriptor,
    steps: list[ChainStep],
    paths: list[str],
    pending_after: Callable[[], int],
    append_id: str | None = None,
    digest: str | None = None,
) -> Generator[Request | Durable, Message, Message]:
    """R-APP-4: claims (reserved) -> durable append record -> commit the claims -> queue.

    The record is committed before the claims are: a crash in between leaves a record whose
    reservation the recovering supervisor commits, so claims exist iff the append does. It
    carries the client's `append_id` and the request's `digest`, if any (appends.py).
    """
    # Ours, not the owner's: a reserve whose answer was lost with its owner is sent again
    # under it (pipelines.py), and one that stays unanswered can still be ended. It is
    # recorded ('reserving') before the reserve is sent: a node that dies before the append is
    # recorded leaves its restart the id to abort (the reservation held its claims for its
    # TTL, 300 s, counted against the whole run tree's budget).
    reservation_id = uuid.uuid4().hex
    row = host.db.execute(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM run_appends WHERE run_id=?", (run_id,)
    ).fetchone()
    seq = int(row[0])
    host.db.execute(
        "INSERT INTO run_appends(run_id, seq, created_at, steps, reservation_id, state) "
        f"VALUES(?, ?, ?, ?, ?, '{RESERVING}')",
        (run_id, seq, host.clock(), len(steps), reservation_id),
    )
    try:
        grant = yield Durable(
            request=ReservePaths(
                descriptor=descriptor,
                paths=paths,
                ttl_s=APPEND_TTL_S,
                reservation_id=reservation_id,
            )
        )
    except SubagentsError as err:
        host.db.execute("DELETE FROM run_appends WHERE run_id=? AND seq=?", (run_id, seq))
        if isinstance(err, FanoutLimitExceeded):
            raise FanoutLimitExceeded(
                f"Failed to append step to chain run {run_id}: {err.message}", **err.details
            ) from None
        if isinstance(err, OwnerUnavailable):
            # The owner may have recorded it and died before its answer (or is still to read
            # it): the abort is owed until the owner answers (R-APP-4: no append, no claims);
            # unknown there, it was never made.
            host.owe(abort_request(reservation_id), run_id)
        raise
    assert isinstance(grant, ReservationGrant)
    host.db.execute(
        "UPDATE run_appends SET state='pending', body=?, append_id=?, digest=? "
        "WHERE run_id=? AND seq=?",
        (appendrecovery.body(steps), append_id, digest, run_id, seq),
    )
    # Tests: die once the record is durable, before its claims' commit is sent (recovery's).
    host.after_commit(lambda: host.crash_point("append_recorded"))
    try:
        if RECORD_APPEND in host.fault_points:  # as a commit a full disk undid
            raise InjectedFault(f"injected failure at {RECORD_APPEND}", point=RECORD_APPEND)
        yield Durable(request=CommitReservation(reservation_id=grant.reservation_id))
    except SubagentsError as err:
        host.db.execute("DELETE FROM run_appends WHERE run_id=? AND seq=?", (run_id, seq))
        # R-APP-4: a failed write leaves no claims. Its steps never ran, so its reservation
        # is ended now (it was kept to its TTL, 300 s, counted against the whole run tree's
        # budget); one its commit reached is committed, and the abort is refused (R-FAN-15).
        # A fan-out owner that did not answer the commit (sent again already) is not waited
        # for here: the abort is owed through the outbox, sent until that owner answers.
        if isinstance(err, OwnerUnavailable):
            host.owe(abort_request(grant.reservation_id), run_id)
        else:
            with contextlib.suppress(SubagentsError):
                yield abort_request(grant.reservation_id)
        raise err
    host.db.execute(
        "UPDATE run_appends SET state='committed' WHERE run_id=? AND seq=?", (run_id, seq)
    )
    warning = host.extend_chain(run_id, steps)
    pending = pending_after()
    text = (
        f"Append queued for chain run {run_id}: {len(steps)} step(s). It becomes eligible "
        f"after the chain's already-queued steps finish. Pending appends: {pending}."
    )
    if warning:
        text += f" Bookkeeping warning: {warning}"
    return AppendResult(run_id=run_id, steps=len(steps), pending_appends=pending, text=text)


def reserving_appends(db: sqlite3.Connection) -> list[tuple[str, int, str]]:
    """Appends whose reserve was sent (or about to be) and never answered before the node
    died: never recorded, never answered as made (crash recovery aborts their reservation)."""
    rows = db.execute(
        f"SELECT run_id, seq, reservation_id FROM run_appends WHERE state='{RESERVING}'"
    ).fetchall()
    return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]


def drop_reserving(db: sqlite3.Connection, run_id: str, seq: int) -> None:
    db.execute(
        f"DELETE FROM run_appends WHERE run_id=? AND seq=? AND state='{RESERVING}'", (run_id, seq)
    )


def uncommitted_appends(db: sqlite3.Connection) -> list[tuple[str, int, str]]:
    """Append records whose claims were reserved but maybe not committed (crash recovery)."""
    rows = db.execute(
        "SELECT run_id, seq, reservation_id FROM run_appends WHERE state='pending'"
    ).fetchall()
    return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]


def mark_committing(db: sqlite3.Connection, run_id: str, seq: int) -> None:
    """Recovery owes the append's commit through the outbox ('committing'), so a later
    recovery does not owe it twice; the answer makes it 'committed' or 'expired'."""
    db.execute("UPDATE run_appends SET state='committing' WHERE run_id=? AND seq=?", (run_id, seq))


def append_committed(db: sqlite3.Connection, reservation_id: str, committed: bool) -> None:
    """The fan-out owner's final answer to a recovered append's commit."""
    db.execute(
        "UPDATE run_appends SET state=? WHERE reservation_id=? AND state='committing'",
        ("committed" if committed else "expired", reservation_id),
    )
    if committed:
        appendrecovery.committed(db, reservation_id)


def abort_request(reservation_id: str) -> AbortReservation:
    return AbortReservation(reservation_id=reservation_id)


def workflow_children_verdict(db: sqlite3.Connection, run_id: str) -> tuple[bool, str]:
    """R-CAP-22 rule 7: every child finished, and every background child's tree proven."""
    rows = db.execute(
        "SELECT run_id, state, background, workflow_key FROM runs WHERE parent_run_id=? "
        "ORDER BY created_at",
        (run_id,),
    ).fetchall()
    for child in rows:
        label = child["workflow_key"] or child["run_id"]
        if child["state"] in ACTIVE:
            return False, f"workflow child {label} is still {child['state']}"
        if not child["background"]:
            continue  # awaited foreground children are covered by the workflow's settlement
        proofs = [
            r[0]
            for r in db.execute(
                "SELECT proof_state FROM run_children WHERE run_id=?", (child["run_id"],)
            ).fetchall()
        ]
        bad = [p for p in proofs if p not in ("observed", "not-started")]
        if bad:
            return False, (
                f"async workflow child {label} process-terminal proof is {bad[0] or 'missing'}"
            )
    return True, "workflow is terminal, controller is gone, and async children have observed proof"


def new_token() -> str:
    return uuid.uuid4().hex


def check_appendable(row: sqlite3.Row, live: LiveRun | None) -> FanoutDescriptor:
    """R-APP-1/2: the run must be a running background chain with a step still to come."""
    run_id = str(row["run_id"])
    if row["mode"] != "chain" or not row["background"]:
        raise append_rejected(run_id, "it is not a background chain run")
    if live is not None and live.stop_state is not None and row["state"] == "running":
        # Its row says running until the stop settles: "the run is running" read as a retry.
        ending = "pausing" if live.stop_state == "paused" else "stopping"
        raise append_rejected(run_id, f"the run is {ending}")
    if live is None or live.stop_state or live.settling:
        raise append_rejected(run_id, f"the run is {row['state']}")
    busy = live.running or live.queue or live.next_group < len(live.groups)
    if not busy and not live.pending_appends:
        raise append_rejected(run_id, "no step is running or pending")
    if live.launch is None or live.descriptor is None:
        missing = f"Run '{run_id}' is missing its run fan-out budget identity."
        if live.launch is None:
            # Adopted from its rows by a restarted node (liverun.adopt_from_store): it has no
            # launch to extend and no budget to claim against, and starts no new step.
            missing += " A restarted node adopted it and starts none of its steps still to come."
        raise append_rejected(run_id, missing)
    return live.descriptor


def extend_chain(db: sqlite3.Connection, live: LiveRun, steps: list[ChainStep]) -> str:
    """Committed appended steps become the chain's last groups, their children pending, and
    the last steps of its recovery descriptor: a resume of the run (one that goes on from a
    pause, too) runs them as the run would have. Answers the warning when that write fails
    (R-APP-5: the append stands; only a later resume would miss the steps)."""
    assert live.launch is not None and live.descriptor is not None  # check_appendable
    live.launch = live.launch.model_copy(update={"chain": [*live.launch.chain, *steps]})
    index = len(live.labels)
    for step in steps:
        number = len(live.groups)
        group: list[runplan.ChildPlan] = []
        if step.kind != "run":
            live.dynamic[number] = step  # R-FAN-21 / R-RUN-2: opened when the chain gets there
            live.groups.append(group)
            continue
        for j, item in enumerate(step.items):
            label = runplan.step_label(live.absolute_step(number), step, j)
            group.append(runplan.ChildPlan(index, number, label, label, item))
            runstore.insert_child(
                db,
                {
                    "run_id": live.run_id,
                    "idx": index,
                    "child_id": f"{live.run_id}-{index}",
                    "step": number,
                    "label": label,
                    "agent": item.agent.name,
                    "state": "pending",
                },
            )
            live.labels[index] = label
            index += 1
        live.groups.append(group)
    try:
        write_recovery(live.run_dir, live.launch, encode_descriptor(live.descriptor))
    except OSError as exc:
        return f"the run's recovery descriptor was not updated ({exc.strerror or exc})"
    return ""


def check_workflow_child(db: sqlite3.Connection, launch: Launch) -> None:
    """R-FAN-24: only the running workflow's own host (its token) may pass workflow fields."""
    if not (launch.workflow_key or launch.fanout_admitted or launch.workflow_token):
        return
    check_workflow_host(db, launch.parent_run_id, launch.workflow_token, launch.workflow_key)


def check_workflow_host(
    db: sqlite3.Connection, parent_run_id: str | None, token: str | None, key: str | None
) -> None:
    """R-FAN-24: a child `key` of running workflow `parent_run_id`, asked by its host (its
    token), else WorkflowChildRefused."""
    parent = runstore.run_row(db, parent_run_id) if parent_run_id else None
    if (
        parent is None
        or parent["mode"] != "workflow"
        or parent["state"] != "running"
        or not token
        or parent["workflow_token"] != token
        or not key
    ):
        raise WorkflowChildRefused(
            "Public execution does not accept internal run fan-out fields.", workflow_key=key
        )
