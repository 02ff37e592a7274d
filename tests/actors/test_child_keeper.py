"""ChildKeeper's per-child tables: nothing is kept for a finished child (issue 10: the node's
RSS grew by about 28 KiB per child it ever ran).

The test sits in the run supervisor's seat around a real ChildKeeper: a real SQLite `children`
table, a real shim template and shims, a real log cap (inotify) and a ROUTER socket where the
node's would be. Children end each way a child can (reported, read back from an exit record
after a restart, a shim killed); then every table the keeper holds per child must be empty.
Every wait has a deadline; nothing sleeps blindly.
"""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

from subagents_node.actors.child import rows
from subagents_node.actors.child.keeper import ChildKeeper
from subagents_node.actors.child.logcap import ChildLogCap
from subagents_node.actors.child.procfs import identity_of
from subagents_node.actors.child.records import SHIM_RECORD
from subagents_node.actors.child.shimtemplate import order_of
from subagents_node.messages.codec import encode
from subagents_node.messages.envelope import REPLY, Envelope
from subagents_node.messages.protocol import parse_request
from subagents_node.messages.runs import ChildEvent, ChildExited, ChildReport, ChildSpec
from tests.support.nodes import short_dir
from tests.support.runs import wait_until

WAIT_S = 30.0
EMPTY = {
    "capped": 0,
    "finishing": 0,
    "watched_shims": 0,
    "escaped": 0,
    "escaped_cgroups": 0,
    "stray_shims": 0,
    "unreported_strays": 0,
}


class Seat:
    """The supervisor's seat: a store, a log cap, a ROUTER, and the keeper under test."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.address = f"ipc://{directory}/runs.sock"
        self.db = sqlite3.connect(directory / "runs.db", isolation_level=None)
        self.db.row_factory = sqlite3.Row
        for migration in rows.MIGRATIONS:
            self.db.executescript(migration)
        self.zctx = zmq.Context()
        self.router = self.zctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(self.address)
        self.cap = ChildLogCap(1 << 20)
        self.gone: queue.Queue[str] = queue.Queue()  # the ShimGone ticks, in order
        self.keeper = self.new_keeper()
        self.exited: dict[str, ChildExited] = {}

    def new_keeper(self) -> ChildKeeper:
        """A keeper as a new node starts it (what the old one was told dies with it)."""
        self.gone = queue.Queue()
        keeper = ChildKeeper(self.address, self.gone.put, self.cap.watch, self.cap.flush)
        keeper.sync_records = False
        return keeper

    def spec(self, n: int, argv: list[str]) -> ChildSpec:
        return ChildSpec(
            child_id=f"c{n}",
            run_id="run-1",
            argv=argv,
            cwd=str(self.dir),
            env={"PATH": os.defpath},
            stdout_path=str(self.dir / f"c{n}.stdout.log"),
            stderr_path=str(self.dir / f"c{n}.stderr.log"),
        )

    def order(self, spec: ChildSpec) -> None:
        self.keeper.order(self.db, spec, 0.0)

    def record(self, events: list[ChildEvent]) -> None:
        """After each keeper call, as the supervisor does once per commit group: its watches
        go to the threads (`flush`)."""
        self.keeper.flush()
        self.exited.update({e.child_id: e for e in events if isinstance(e, ChildExited)})

    def serve(self, until: int, ack: bool = True) -> None:
        """Apply reports and shim exits, as the supervisor does, until `until` children
        settled (`ack`: acknowledge each report once applied)."""
        while len(self.exited) < until:
            while not self.gone.empty():
                self.record(self.keeper.shim_gone(self.db, self.gone.get(), 0.0))
            if not self.router.poll(50):  # the shim-gone queue has no socket to poll
                continue
            identity, frame = self.router.recv_multipart()
            raw = msgpack.unpackb(frame, raw=False)
            report = parse_request(raw["type"], raw["body"])
            assert isinstance(report, ChildReport)
            self.record(self.keeper.apply(self.db, report, 0.0))
            if ack:
                env = Envelope(type=raw["type"], body={}, id=raw["id"], sender=raw["sender"])
                self.router.send_multipart([identity, encode(env.reply(REPLY, {"ok": True}))])

    def drain_gone(self) -> None:
        while not self.gone.empty():
            self.record(self.keeper.shim_gone(self.db, self.gone.get(), 0.0))

    def close(self) -> None:
        self.keeper.close()
        self.cap.stop()
        self.router.close(0)
        self.zctx.term()
        self.db.close()


def wait_gone(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], WAIT_S)[0], f"process {pid} is still alive"
    finally:
        os.close(fd)


@pytest.fixture
def seat() -> Iterator[Seat]:
    directory = short_dir()
    s = Seat(directory)
    yield s
    s.close()
    shutil.rmtree(directory, ignore_errors=True)


def test_no_per_child_bookkeeping_outlives_a_reported_child_and_its_shim(seat: Seat) -> None:
    specs = [seat.spec(n, ["/bin/true"] if n % 2 else ["sh", "-c", "exit 3"]) for n in range(40)]
    for spec in specs:
        seat.order(spec)
        assert seat.keeper.launch(spec) is None
    seat.serve(until=len(specs))
    assert {e.exit_code for e in seat.exited.values()} == {0, 3}

    def settled() -> bool:
        seat.drain_gone()
        return seat.keeper.bookkeeping() == EMPTY

    wait_until(settled, WAIT_S, "every shim to exit and be forgotten")
    assert seat.cap.watched == 0  # no log of a settled child is watched any more


def test_no_per_child_bookkeeping_outlives_children_settled_from_records_after_a_restart(
    seat: Seat,
) -> None:
    """Children that ended while no supervisor acknowledged them: a new keeper reads their
    exit records (their shims are gone) and keeps nothing for them; one whose shim was killed
    is settled from the shim's death, and nothing is kept for it either."""
    specs = [seat.spec(n, ["/bin/sleep", "0.3"]) for n in range(10)]
    for spec in specs:
        seat.order(spec)
        order = {**order_of(spec, seat.address, sync=False), "give_up_s": 0.2}
        seat.keeper._template.order_raw(order)  # a short give-up, for the test
    shims: set[int] = set()
    while len(shims) < len(specs):  # each start is applied and acknowledged; nothing after
        assert seat.router.poll(WAIT_S * 1000), "no report from the shims in time"
        identity, frame = seat.router.recv_multipart()
        raw = msgpack.unpackb(frame, raw=False)
        report = parse_request(raw["type"], raw["body"])
        assert isinstance(report, ChildReport)
        if report.kind == "started" and report.shim_pid not in shims:
            shims.add(report.shim_pid)
            seat.record(seat.keeper.apply(seat.db, report, 0.0))
            env = Envelope(type=raw["type"], body={}, id=raw["id"], sender=raw["sender"])
            seat.router.send_multipart([identity, encode(env.reply(REPLY, {"ok": True}))])
    for pid in shims:  # their children end, nobody acknowledges: they give up and exit
        wait_gone(pid)
    seat.keeper.close()  # the node restarts: a new keeper over the same store
    seat.keeper = seat.new_keeper()
    seat.record(seat.keeper.recover(seat.db, 0.0))
    seat.drain_gone()
    assert sorted(seat.exited) == sorted(s.child_id for s in specs)

    killed = seat.spec(99, ["/bin/sleep", "60"])
    seat.order(killed)
    assert seat.keeper.launch(killed) is None
    started = None
    while started is None or started.child_id != killed.child_id:  # skip the old resends
        assert seat.router.poll(WAIT_S * 1000), "no report from the shim in time"
        _, frame = seat.router.recv_multipart()
        started = parse_request("child.report", msgpack.unpackb(frame, raw=False)["body"])
        assert isinstance(started, ChildReport)
    assert started.pid is not None
    seat.record(seat.keeper.apply(seat.db, started, 0.0))
    os.kill(started.shim_pid, signal.SIGKILL)
    os.kill(started.pid, signal.SIGKILL)

    def settled() -> bool:
        seat.drain_gone()
        return killed.child_id in seat.exited and seat.keeper.bookkeeping() == EMPTY

    wait_until(settled, WAIT_S, "the killed shim's child to settle and be forgotten")
    assert seat.cap.watched == 0


def test_a_live_shim_told_gone_is_watched_again_and_its_child_settles_as_reported(
    seat: Seat,
) -> None:
    """A shim is watched from its announcement on the template's pipe; a template that ends
    with an announcement it never delivered (its pipe was full) tells each order it did not
    announce gone. A shim told gone while it lives was taken for dead: what it runs was
    watched as a dead shim's escaped tree, and that entry outlived the child (issue 10's
    per-child bookkeeping). It is watched again instead, and its child settles as reported."""
    spec = seat.spec(7, ["sh", "-c", "sleep 0.5; exit 4"])
    seat.order(spec)
    assert seat.keeper.launch(spec) is None
    started = None
    while started is None or started.kind != "started":
        assert seat.router.poll(WAIT_S * 1000), "no report from the shim in time"
        identity, frame = seat.router.recv_multipart()
        raw = msgpack.unpackb(frame, raw=False)
        started = parse_request(raw["type"], raw["body"])
        assert isinstance(started, ChildReport)
        seat.record(seat.keeper.apply(seat.db, started, 0.0))
        env = Envelope(type=raw["type"], body={}, id=raw["id"], sender=raw["sender"])
        seat.router.send_multipart([identity, encode(env.reply(REPLY, {"ok": True}))])

    assert seat.keeper.shim_gone(seat.db, spec.child_id, 0.0) == []
    assert seat.keeper.bookkeeping()["escaped"] == 0
    seat.serve(until=1)
    assert seat.exited[spec.child_id].exit_code == 4

    def settled() -> bool:
        seat.drain_gone()
        return seat.keeper.bookkeeping() == EMPTY

    wait_until(settled, WAIT_S, "the shim to exit and be forgotten")


def test_a_shim_that_dies_before_announcing_itself_ends_its_child_not_started(seat: Seat) -> None:
    """Each shim announced itself on the template's pipe, as its first act; one killed between
    its fork and that line (a child SIGKILLing every new process of the template did it to 12
    shims of 20; the OOM killer could) was watched by nobody: its launch waited for good and
    its run stayed `running` until the template ended. The template announces each fork now.
    Here the shim dies at its first line (its order has no record directory): its child ends
    not-started, its launch answered."""
    spec = seat.spec(5, ["/bin/sleep", "60"])
    seat.order(spec)
    order = order_of(spec, seat.address, sync=False)
    del order["record_dir"]  # the shim dies as it reads its order, before a line of its own
    seat.keeper._template.order_raw(order)
    seat.keeper._watch.expect(spec.child_id)  # as `launch` does
    seat.keeper.flush()

    def settled() -> bool:
        seat.drain_gone()
        return spec.child_id in seat.exited

    wait_until(settled, 10.0, "the child of the shim that died to settle")
    assert seat.exited[spec.child_id].proof.state == "not-started", seat.exited[spec.child_id]


def test_a_shim_dead_between_its_claim_and_its_report_with_nothing_left_settles_observed(
    seat: Seat,
) -> None:
    """A shim that claimed its child (shim.json) and died before it reported it (a sibling
    killing each new shim did it to 6 children of 20) left its child failed with proof
    `unknown`: the run's slot was retained for good, though nothing of the tree lived where the
    child would be (its cgroup; without one, the shim's session, which the shim makes first).
    That is the proof a reported child's dead shim gets: `observed`, exit status unknown."""
    spec = seat.spec(6, ["/bin/sleep", "60"])
    seat.order(spec)
    shim = subprocess.Popen(["sleep", "60"])  # stands in for the shim: claims, then dies
    identity = identity_of(shim.pid)
    assert identity is not None
    os.makedirs(spec.records, exist_ok=True)
    claim = {"child_id": spec.child_id, "run_id": spec.run_id, "shim_pid": identity.pid}
    claim["shim_start"] = identity.start_time
    Path(spec.records, SHIM_RECORD).write_text(json.dumps(claim))
    shim.kill()
    shim.wait()
    seat.record(seat.keeper.shim_gone(seat.db, spec.child_id, 0.0))
    exited = seat.exited[spec.child_id]
    assert (exited.state, exited.proof.state) == ("failed", "observed"), exited
