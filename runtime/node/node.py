"""Node: one OS process hosting the owner actors behind the gateway.

Owns the node's lifetime: the state dir, the store and its migrations, the timer thread, the
actors (started, supervised, stopped), the dispatcher and the gateway, and the pid file that
tells other processes which node serves this state dir. Runs in the foreground (`start`),
detached (`start --detach`, see runtime.daemon) or embedded (`Node.embedded()`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pykka
import zmq

from subagents_node.actors.child.logcap import ChildLogCap
from subagents_node.actors.owner import ActorContext, Outcome, OwnerActor
from subagents_node.client.client import Client
from subagents_node.client.paths import (
    DB_NAME,
    PID_NAME,
    check_endpoint,
    ensure_state_dir,
    ipc_endpoint,
    ipc_path,
    is_loopback_tcp,
    read_pid_file,
    resolve_state_dir,
)
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Ack, Request
from subagents_node.messages.codec import MAX_FRAME_BYTES
from subagents_node.messages.constants import version
from subagents_node.messages.errors import (
    BadAddress,
    BadRequest,
    NodeAlreadyRunning,
    StoreError,
    StoreFull,
)
from subagents_node.messages.keys import REQUESTS as KEY_REQUESTS
from subagents_node.messages.node import (
    ActorStatus,
    NodeStatus,
    NodeStatusResult,
    Ping,
    Pong,
    QuarantinedRecord,
    Shutdown,
)
from subagents_node.node import owners
from subagents_node.node.curve import CurveGuard
from subagents_node.node.dispatch import Dispatcher, mailbox_depth
from subagents_node.node.gateway import Gateway
from subagents_node.node.inprocess import InProcessTransport
from subagents_node.node.store import Store
from subagents_node.node.supervision import RestartIntensity
from subagents_node.node.timers import Timers

log = logging.getLogger(__name__)

#: A child log's cap when the settings name none (config `child_log_max_bytes`).
DEFAULT_CHILD_LOG_MAX_BYTES = 64 << 20


@dataclass
class NodeOptions:
    state_dir: Path | None = None
    #: Extra endpoints besides the state dir's ipc socket (tcp://127.0.0.1:PORT, always CURVE).
    listen: Sequence[str] = ()
    ipc: bool = True
    mailbox_limit: int = 1024
    max_frame: int = MAX_FRAME_BYTES
    synchronous: str = "NORMAL"
    faults: bool = False
    restart_max: int = 3
    restart_window_s: float = 5.0
    settings: dict[str, object] = field(default_factory=dict)


class Node:
    """A node: the process that serves one state dir's owners over its socket(s).

    `Node.embedded()` runs one inside this process for the length of a `with` block (temporary
    state unless `state_dir` is given); `Node(NodeOptions(...))` with `start()`, `wait()` and
    `stop()` is what `subagents-node start` runs. `client()` returns a client that talks to it
    in process, `client("zmq")` one that goes through its socket. A second node for a state dir
    that is already served is refused (`NodeAlreadyRunning`).
    """

    def __init__(self, options: NodeOptions | None = None) -> None:
        self.options = options or NodeOptions()
        self.state_dir = resolve_state_dir(self.options.state_dir)
        self.node_id = f"node-{uuid.uuid4().hex[:12]}"
        self.started_at = 0.0
        self.failure: str | None = None
        self._stop_requested = threading.Event()
        self._stopped = False
        self._zctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._timers: Timers | None = None
        self._refs: dict[str, pykka.ActorRef[OwnerActor]] = {}
        self._gateway: Gateway | None = None
        self._curve: CurveGuard | None = None
        self._log_cap: ChildLogCap | None = None
        self._clients: list[Client] = []
        #: Restarts per actor, counted as crashes are reported: `status` must never ask a busy
        #: actor (the gateway's I/O thread would block behind its mailbox).
        self._restarts: dict[str, int] = {}
        #: Stored records each owner quarantined (replaced whole by the owner's report).
        self._quarantined: dict[str, list[QuarantinedRecord]] = {}
        self._intensity: RestartIntensity | None = None
        self.dispatcher = Dispatcher(self._serve_node, self.options.mailbox_limit)
        self.store = Store(self.state_dir / DB_NAME, self.options.synchronous)

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> Node:
        ensure_state_dir(self.state_dir)
        self.state_dir = self.state_dir.resolve()
        self.store = Store(self.state_dir / DB_NAME, self.options.synchronous)
        endpoints = self._endpoints()
        self._refuse_if_running()
        self.store.migrate(owners.FAMILIES)
        self._timers = Timers()
        self._intensity = RestartIntensity(
            self._fail, self.options.restart_max, self.options.restart_window_s
        )
        cap = self.options.settings.get("child_log_max_bytes", DEFAULT_CHILD_LOG_MAX_BYTES)
        self._log_cap = ChildLogCap(cap if isinstance(cap, int) else DEFAULT_CHILD_LOG_MAX_BYTES)
        ctx = ActorContext(
            open_db=self.store.connect,
            report_crash=self._report_crash,
            report_quarantine=self._report_quarantine,
            schedule=self._timers.schedule,
            faults=self.options.faults,
            settings={
                "runs_dir": str(self.state_dir / "runs"),
                "node_address": endpoints[0],
                **self.options.settings,
            },
            dispatch=self.dispatcher.dispatch,
            cap_log=self._log_cap.watch,
        )
        try:
            self._start_serving(ctx, endpoints)
        except BaseException:
            # Whatever failed (a bind, a full disk under the pid file), nothing may keep
            # running: a half-started node would hold the state dir and hang `start`.
            self.stop()
            raise
        log.info("node %s serving %s", self.node_id, ", ".join(self.endpoints))
        return self

    def _start_serving(self, ctx: ActorContext, endpoints: list[str]) -> None:
        for cls in owners.OWNERS:
            ref = cls.start(ctx)
            self._refs[cls.name] = ref
            self.dispatcher.register(cls.name, ref)
        self._zctx = zmq.Context()
        # The allow-list is the node's own while it runs (keys allow|revoke ask it); a tcp
        # listener is a CURVE server whatever its address (DESIGN §3, runtime/node/curve.py).
        self._curve = CurveGuard(self.state_dir)
        self._gateway = Gateway(
            self._zctx,
            endpoints,
            self.dispatcher,
            self.node_id,
            self.options.max_frame,
            curve=self._curve,
        )
        try:
            self._gateway.start()
        except zmq.ZMQError as exc:
            raise BadAddress(
                f"cannot listen on {endpoints}: {exc}", address=",".join(endpoints)
            ) from None
        self.started_at = time.time()
        for endpoint in self.endpoints:
            path = ipc_path(endpoint)
            if path is not None:
                path.chmod(0o600)  # DESIGN §3: sockets 0600 (the dir is 0700 as well)
        self._write_pid_file()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stop_requested.set()
        for client in self._clients:
            client.close()
        if self._gateway is not None:
            self._gateway.stop()
            for endpoint in self._gateway.bound:
                path = ipc_path(endpoint)
                if path is not None:
                    with suppress(FileNotFoundError):
                        path.unlink()
        for ref in reversed(list(self._refs.values())):
            with suppress(pykka.ActorDeadError):
                ref.stop(block=True, timeout=10)
        if self._timers is not None:
            self._timers.stop()
        if self._log_cap is not None:
            self._log_cap.stop()
        if self._zctx is not None:
            self._zctx.term()
        self._remove_pid_file()

    def request_stop(self) -> None:
        self._stop_requested.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested (signal, `node.shutdown`, or too many crashes)."""
        return self._stop_requested.wait(timeout)

    def _report_crash(self, actor: str, exc: BaseException) -> None:
        # Called from the crashed actor's own thread; each actor only bumps its own entry.
        self._restarts[actor] = self._restarts.get(actor, 0) + 1
        if self._intensity is not None:
            self._intensity.report(actor, exc)

    def _report_quarantine(self, actor: str, records: Sequence[QuarantinedRecord]) -> None:
        self._quarantined[actor] = list(records)  # one entry per actor, set by its own thread

    def _fail(self, reason: str) -> None:
        log.critical("node stopping: %s", reason)
        self.failure = reason
        self._stop_requested.set()

    # -- addresses and clients ----------------------------------------------------------------

    def _endpoints(self) -> list[str]:
        endpoints = [ipc_endpoint(self.state_dir)] if self.options.ipc else []
        for endpoint in self.options.listen:
            check_endpoint(endpoint)
            if endpoint.startswith("tcp://") and not is_loopback_tcp(endpoint):
                raise BadAddress(
                    f"refusing to listen on {endpoint}: tcp is loopback-only until worker "
                    "nodes exist (and always CURVE-authenticated)",
                    address=endpoint,
                )
            endpoints.append(endpoint)
        if not endpoints:
            raise BadAddress("the node has no endpoint to listen on", address="")
        return endpoints

    @property
    def endpoints(self) -> list[str]:
        return list(self._gateway.bound) if self._gateway else []

    @property
    def address(self) -> str:
        """The first endpoint: what children find in $SUBAGENTS_NODE."""
        return self.endpoints[0]

    def client(self, transport: str = "inproc", timeout: float = 10.0) -> Client:
        """A connected client: in-process (no encoding) or over the node's first endpoint."""
        if transport == "inproc":
            client = Client(InProcessTransport(self.dispatcher, self.address), timeout)
        elif transport == "zmq":
            client = Client(ZmqTransport(self.address), timeout)
        else:
            raise ValueError("transport must be 'inproc' or 'zmq'")
        self._clients.append(client)
        return client

    @classmethod
    @contextmanager
    def embedded(
        cls, state_dir: str | os.PathLike[str] | None = None, **options: object
    ) -> Iterator[Node]:
        """Start a node in this process for the duration of the block.

        Without `state_dir`, state lives in a fresh temporary directory removed afterwards.
        """
        with contextmanager(_temporary_state_dir)(state_dir) as directory:
            node = cls(NodeOptions(state_dir=directory, **options))  # type: ignore[arg-type]
            node.start()
            try:
                yield node
            finally:
                node.stop()

    # -- the node's own protocol --------------------------------------------------------------

    def _serve_node(self, request: Request) -> Outcome:
        uptime = time.time() - self.started_at if self.started_at else 0.0
        if isinstance(request, Ping):
            return Pong(node_id=self.node_id, version=version(), pid=os.getpid(), uptime_s=uptime)
        if isinstance(request, NodeStatus):
            return NodeStatusResult(
                node_id=self.node_id,
                version=version(),
                pid=os.getpid(),
                uptime_s=uptime,
                state_dir=str(self.state_dir),
                endpoints=self.endpoints,
                actors=[self._actor_status(name, ref) for name, ref in self._refs.items()],
            )
        if isinstance(request, KEY_REQUESTS) and self._curve is not None:
            return self._curve.serve(request)
        if isinstance(request, Shutdown):
            # Reply first; the owner of the process (start's main loop) performs the stop.
            self.request_stop()
            return Ack()
        return BadRequest(f"the node does not serve {request.type}", reason="wrong_target")

    def _actor_status(self, name: str, ref: pykka.ActorRef[OwnerActor]) -> ActorStatus:
        return ActorStatus(
            name=name,
            mailbox=mailbox_depth(ref),
            mailbox_limit=self.dispatcher.mailbox_limit,
            restarts=self._restarts.get(name, 0),
            quarantined=self._quarantined.get(name, []),
        )

    # -- the pid file: which process serves this state dir ------------------------------------

    @property
    def pid_file(self) -> Path:
        return self.state_dir / PID_NAME

    def _refuse_if_running(self) -> None:
        other = read_pid_file(self.state_dir)
        if other is not None and other.get("pid") != os.getpid():
            raise NodeAlreadyRunning(
                f"a node (pid {other['pid']}) already serves {self.state_dir}; "
                "stop it with `subagents-node stop` or use another --state-dir",
                address=str(other.get("address", "")),
            )
        if other is None and self.options.ipc:
            # A socket left by a node that was killed: nobody owns it, so it is safe to replace.
            sock = ipc_path(ipc_endpoint(self.state_dir))
            if sock is not None:
                with suppress(FileNotFoundError):
                    sock.unlink()

    def _write_pid_file(self) -> None:
        record = {
            "pid": os.getpid(),
            "create_time": psutil.Process().create_time(),
            "node_id": self.node_id,
            "address": self.address,
            "endpoints": self.endpoints,
            "host": socket.gethostname(),
        }
        tmp = self.pid_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(record))
            tmp.replace(self.pid_file)
        except OSError as exc:
            with suppress(OSError):
                tmp.unlink()
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull(
                    f"the disk under {self.state_dir} is full: cannot write {PID_NAME}; "
                    "free some space and start again",
                    actor="node",
                    reason=str(exc),
                ) from None
            raise StoreError(
                f"cannot write {self.pid_file}: {exc}", path=str(self.pid_file)
            ) from None

    def _remove_pid_file(self) -> None:
        record = read_pid_file(self.state_dir)
        if record is not None and record.get("node_id") == self.node_id:
            with suppress(FileNotFoundError):
                self.pid_file.unlink()


def _temporary_state_dir(state_dir: str | os.PathLike[str] | None) -> Iterator[Path]:
    if state_dir is not None:
        yield Path(state_dir)
        return
    with tempfile.TemporaryDirectory(prefix="subagents-") as tmp:
        yield Path(tmp)
