"""OwnerSupervisor: the node's supervision of its owner processes (OTP style, DESIGN §1).

Owns, for each owner: its process (forked from the node, so a start costs a fork, not an
interpreter; each owner then imports its own actor's code and no other's: see `start`), its
pidfd and control pipe, its state (`running`, `restarting`, `failed`), its restart count and
restart-intensity history, and the records it reported quarantined. One thread does all of
it: it forks (so the owners' death signal is tied to a thread that lives as long as the node),
waits in poll() on every pidfd and control pipe at once, restarts a crashed owner from its
database, and past the owner's restart intensity marks it `failed` and binds a stand-in on its
socket (tombstone.py) that answers every request `OwnerUnavailable` at once, while the other
owners keep serving.

It never opens an owner's database and never handles an owner's requests.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence

import zmq

from subagents_node.messages.node import (
    ActorStatus,
    OwnerState,
    QuarantinedRecord,
    TcpListenerStatus,
)
from subagents_node.node.descriptors import abort_cause
from subagents_node.node.heap import release_free_pages
from subagents_node.node.ownerproc import OwnerSpec, run_owner
from subagents_node.node.supervision import RestartIntensity
from subagents_node.node.tombstone import Tombstone

log = logging.getLogger(__name__)

#: How long an owner may take from its fork to `ready` (migrations, recovery of its records).
START_TIMEOUT_S = 60.0
#: How long a stopping owner may take to commit and close before it is killed.
STOP_TIMEOUT_S = 10.0


class _Owner:
    """One owner's supervision state. (A plain slotted class, not a dataclass: on Python 3.11 a
    dataclass compiles its methods when defined, ~1 ms of every node's start.)"""

    __slots__ = (
        "buffer",
        "control",
        "exceeded",
        "gone",
        "intensity",
        "out_of_descriptors",
        "pid",
        "pidfd",
        "quarantined",
        "ready",
        "reason",
        "restarts",
        "spec",
        "state",
        "tcp",
        "tcp_carried",
        "tombstone",
    )

    def __init__(self, spec: OwnerSpec, intensity: RestartIntensity) -> None:
        self.spec = spec
        self.intensity = intensity
        self.state: OwnerState = "restarting"
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.control: int | None = None
        self.buffer = b""
        self.restarts = 0
        self.reason = ""
        self.quarantined: list[QuarantinedRecord] = []
        self.ready = threading.Event()
        #: Set once the process has been reaped (and cleared when another is forked).
        self.gone = threading.Event()
        self.tombstone: Tombstone | None = None
        #: Its last death was most likely libzmq's abort on EMFILE (descriptors.abort_cause).
        self.out_of_descriptors = False
        #: A crash reported but not yet acted on (the intensity tripped while we were busy).
        self.exceeded = ""
        #: Its own tcp port's figures as last reported (a home's ledger owner; None: no port),
        #: and the sheds of its earlier processes (each process counts from zero).
        self.tcp: TcpListenerStatus | None = None
        self.tcp_carried = 0


class OwnerSupervisor:
    def __init__(
        self,
        specs: Sequence[OwnerSpec],
        restart_max: int,
        restart_window_s: float,
        on_change: Callable[[], None] = lambda: None,
        on_exit: Callable[[str], None] = lambda endpoint: None,
    ) -> None:
        """`on_change`: an owner started, restarted or failed. `on_exit(endpoint)`: the process
        of the owner at `endpoint` was reaped (not while stopping), before its successor is
        forked: whatever was in flight to it will never be answered."""
        self._owners: dict[str, _Owner] = {}
        for spec in specs:
            owner = _Owner(spec, RestartIntensity(lambda r: None, restart_max, restart_window_s))
            owner.intensity = RestartIntensity(
                self._exceeded_for(owner), restart_max, restart_window_s
            )
            self._owners[spec.name] = owner
        self._on_change = on_change
        self._on_exit = on_exit
        self._lock = threading.Lock()  # guards the owners' fields read by status()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stopping = False
        self._orders: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="subagents-owners", daemon=True)
        self._zctx: zmq.Context[zmq.Socket[bytes]] | None = None

    # -- lifetime (the node's thread) ---------------------------------------------------------

    def start(self, zctx: zmq.Context[zmq.Socket[bytes]], first: str = "") -> None:
        """Start every owner at once, owner `first` before the others (the one with the most
        to do before it is ready: the node waits for the slowest), and wait until each is
        ready (recovered, serving) or `failed`. Starting together is safe: a request the run
        supervisor's recovery sends to a ledger that is not bound yet waits in its DEALER
        until the ledger binds.

        No owner's actor is imported here: each owner imports its own after the fork
        (ownerproc.py), so the node never holds the actors' code and a ledger owner never holds
        the run supervisor's (1.2 MiB of RSS in each process that had it), and the imports run
        in the owners at once instead of one after another in the node. (What the node itself
        would import after a fork is another matter: it writes to pages it shares with the
        owners already forked, and each page written is copied. The node imports nothing
        after the forks that its requests do not need.)"""
        self._zctx = zctx
        self._thread.start()
        for owner in sorted(self._owners.values(), key=lambda o: o.spec.name != first):
            self._order(functools.partial(self._fork, owner))
        deadline = time.monotonic() + START_TIMEOUT_S
        for owner in self._owners.values():
            # Set by `ready`, or by the give-up once its restarts are spent.
            owner.ready.wait(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """TERM every owner in the reverse of the start order (owners.NAMES), the run
        supervisor first: what it still reports to the ledgers as it stops finds them
        serving. Wait for each to commit and exit, KILL what does not."""
        self._stopping = True
        for owner in reversed(list(self._owners.values())):
            pid = owner.pid
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                self._wait_gone(owner, STOP_TIMEOUT_S)
        self._wake()
        self._thread.join(timeout=STOP_TIMEOUT_S)
        for owner in self._owners.values():
            if owner.tombstone is not None:
                owner.tombstone.stop()
            for fd in (owner.pidfd, owner.control):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _wait_gone(self, owner: _Owner, timeout: float) -> None:
        """Wait until the supervising thread has reaped the owner; KILL it past `timeout`."""
        pid = owner.pid
        if pid is None or owner.gone.wait(timeout):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        owner.gone.wait(timeout)

    def all_failed(self) -> bool:
        return all(o.state == "failed" for o in self._owners.values())

    def endpoints(self) -> list[str]:
        """Where each owner listens (its ipc socket file outlives a process that exits)."""
        return [owner.spec.endpoint for owner in self._owners.values()]

    def pids(self) -> dict[str, int]:
        return {name: o.pid for name, o in self._owners.items() if o.pid is not None}

    def status(self, mailbox_limit: int) -> list[ActorStatus]:
        with self._lock:
            return [
                ActorStatus(
                    name=name,
                    mailbox=0,
                    mailbox_limit=mailbox_limit,
                    restarts=o.restarts,
                    state=o.state,
                    pid=o.pid,
                    reason=o.reason,
                    quarantined=list(o.quarantined),
                )
                for name, o in self._owners.items()
            ]

    def tcp_status(self) -> list[TcpListenerStatus]:
        """Each owner's own tcp port (a home's ledger owners), as it last reported it."""
        with self._lock:
            return [o.tcp for o in self._owners.values() if o.tcp is not None]

    def book(self) -> dict[str, dict[str, object]]:
        """The address book's owner entries: endpoint, pid and state of each."""
        with self._lock:
            return {
                name: {"endpoint": o.spec.endpoint, "pid": o.pid, "state": o.state}
                for name, o in self._owners.items()
            }

    # -- the supervising thread ----------------------------------------------------------------

    def _order(self, work: Callable[[], None]) -> None:
        self._orders.append(work)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\x01")

    def _run(self) -> None:
        while True:
            fds: dict[int, tuple[str, _Owner]] = {}
            for owner in self._owners.values():
                if owner.pidfd is not None:
                    fds[owner.pidfd] = ("exit", owner)
                if owner.control is not None:
                    fds[owner.control] = ("control", owner)
            # poll, not select: the node lifts its descriptor limit (cli/serve.py), and a pidfd
            # numbered past select()'s FD_SETSIZE made select raise, and this loop spin.
            poller = select.poll()
            for fd in (self._wake_r, *fds):
                poller.register(fd, select.POLLIN)
            try:
                readable = [fd for fd, _ in poller.poll()]
            except OSError:
                if self._stopping:
                    return
                continue
            if self._wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 4096):
                        pass
                orders, self._orders = self._orders, []
                for work in orders:
                    work()
            for fd in readable:
                if fd == self._wake_r or fd not in fds:
                    continue
                kind, owner = fds[fd]
                if kind == "control":
                    self._read_control(owner)
            for fd in readable:
                if fd in fds and fds[fd][0] == "exit":
                    self._exited(fds[fd][1])
            if self._stopping and all(o.pid is None for o in self._owners.values()):
                return

    def _fork(self, owner: _Owner) -> None:
        if self._stopping or owner.state == "failed":
            return
        control_r, control_w = os.pipe()
        # What the node freed stays resident in its heap until returned, and the owner would
        # inherit it as its own RSS: returned first (heap.py).
        release_free_pages()
        # Every object alive now is the owner's inheritance: frozen, the child's collector never
        # walks it, so it never writes to (copies) the pages it shares with the node. The node
        # itself unfreezes at once and collects as before.
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # the owner process
            os.close(control_r)
            run_owner(owner.spec, control_w)  # never returns
        gc.unfreeze()
        os.close(control_w)
        os.set_blocking(control_r, False)
        with self._lock:
            owner.pid = pid
            owner.pidfd = os.pidfd_open(pid)
            owner.control = control_r
            owner.buffer = b""
            if owner.tcp is not None:  # the new process counts its sheds from zero
                owner.tcp_carried = owner.tcp.sheds
                owner.tcp = owner.tcp.model_copy(update={"open": 0})
            owner.state = "restarting"
            owner.ready.clear()
            owner.gone.clear()
        self._on_change()

    def _read_control(self, owner: _Owner) -> None:
        assert owner.control is not None
        try:
            data = os.read(owner.control, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            os.close(owner.control)
            owner.control = None
            return
        owner.buffer += data
        *lines, owner.buffer = owner.buffer.split(b"\n")
        for line in lines:
            try:
                said = json.loads(line)
            except ValueError:
                continue
            self._heard(owner, said)

    def _heard(self, owner: _Owner, said: dict[str, object]) -> None:
        kind = said.get("kind")
        if kind == "ready":
            with self._lock:
                owner.state = "running"
                owner.reason = ""
            owner.ready.set()
            self._on_change()
        elif kind == "crash":
            # Restarted in place by the owner itself; it counts against the same intensity.
            owner.restarts += 1
            owner.reason = str(said.get("reason", ""))
            owner.out_of_descriptors = False
            owner.intensity.report(owner.spec.name, RuntimeError(owner.reason))
            if owner.exceeded:
                self._give_up(owner)
        elif kind == "failed":
            owner.reason = str(said.get("reason", ""))
        elif kind == "quarantine":
            records = said.get("records")
            parsed = [
                QuarantinedRecord.model_validate(r)
                for r in (records if isinstance(records, list) else [])
            ]
            with self._lock:
                owner.quarantined = parsed
        elif kind == "tcp":
            self._heard_tcp(owner, said)

    def _heard_tcp(self, owner: _Owner, said: dict[str, object]) -> None:
        """Its tcp port's figures (ownerproc.py); a shed is also in node.log, from the owner."""
        try:
            budget, open_, sheds = (int(str(said[k])) for k in ("budget", "open", "sheds"))
            last = said.get("last_shed")
            last_shed = float(str(last)) if last is not None else None
        except (KeyError, ValueError):
            return
        before = owner.tcp.last_shed if owner.tcp is not None else None
        with self._lock:
            owner.tcp = TcpListenerStatus(
                name=owner.spec.name,
                budget=budget,
                open=open_,
                sheds=owner.tcp_carried + sheds,
                last_shed=last_shed if last_shed is not None else before,
            )

    def _exited(self, owner: _Owner) -> None:
        if owner.pid is None:
            return
        if owner.control is not None:
            self._read_control(owner)  # its last words (why it could not start)
        pid = owner.pid
        status = self._reap(owner)
        if self._stopping:
            return
        how = _how(status)
        cause = "" if status is None else abort_cause(status)
        owner.out_of_descriptors = bool(cause)
        owner.reason = owner.reason or f"the process {how}{cause}"
        log.error("owner %s (pid %d) %s; restarting it", owner.spec.name, pid, how)
        owner.restarts += 1
        owner.intensity.report(owner.spec.name, RuntimeError(owner.reason))
        # Told once the death is counted: a caller answered at once sees it in `status`.
        self._on_exit(owner.spec.endpoint)
        if owner.exceeded:
            self._give_up(owner)
            return
        self._fork(owner)

    def _exceeded_for(self, owner: _Owner) -> Callable[[str], None]:
        def exceeded(reason: str) -> None:
            owner.exceeded = reason

        return exceeded

    def _give_up(self, owner: _Owner) -> None:
        """Past its restart intensity: the owner is `failed`; a stand-in answers its callers."""
        log.critical("owner %s failed: %s", owner.spec.name, owner.exceeded)
        pid = owner.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reason = f"{owner.exceeded}; last: {owner.reason}"
        if self._zctx is not None and owner.tombstone is None:
            if pid is not None:
                self._reap(owner)
            if owner.out_of_descriptors:
                # Its stand-in would listen in this process, under the same limit, to the
                # peers that used up the owner's descriptors: libzmq's abort would take the node.
                log.critical("no stand-in for %s: it ran out of open files", owner.spec.name)
            else:
                owner.tombstone = Tombstone(
                    self._zctx, owner.spec.endpoint, owner.spec.name, reason
                )
                owner.tombstone.start()  # returns once bound
        # `failed` only now: a caller who reads it and calls finds the stand-in's answer
        # (OwnerUnavailable), never a moment with no socket at the owner's endpoint.
        with self._lock:
            owner.state = "failed"
            owner.reason = reason
        owner.ready.set()
        self._on_change()

    def _reap(self, owner: _Owner) -> int | None:
        """Collect the owner's exit (its wait status) and forget its process. None: another
        waiter of this process collected it first (a program that embeds the node and reaps
        every child, or ignores SIGCHLD): how it ended is not known."""
        pid = owner.pid
        status: int | None = None
        if pid is None:
            return status
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(pid, 0)
        if owner.pidfd is not None:
            os.close(owner.pidfd)
        with self._lock:
            owner.pid = None
            owner.pidfd = None
            # Never `running` without a process: a status read between this reap and the
            # restart's fork showed the owner running with no pid.
            if owner.state == "running":
                owner.state = "restarting"
        owner.gone.set()
        return status


def _how(status: int | None) -> str:
    if status is None:  # said "exited with status 0" (hunt-15): a clean exit nobody saw
        return "ended (its exit status was collected by another waiter of this process)"
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"
