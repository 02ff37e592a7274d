"""Node: the supervisor of the owner processes, and the node's own small service.

Owns the node's lifetime: the state dir, the owner processes (started in order, watched,
restarted, marked failed: runtime/node/ownersup.py), the address book and the pid file that
tell other processes where each owner listens, the gateway (node.* requests, keys, and tcp
peers) and the forwarder that carries whatever reaches the node's sockets on to the owners.
Each owner is its own process with its own socket and database (DESIGN §1); the node never
opens an owner's database. Runs in the foreground (`start`), detached (`start --detach`, see
runtime.daemon) or embedded (`Node.embedded()`: the same processes, stopped with the block).
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

import zmq

from subagents_node.actors.child import cgroup
from subagents_node.actors.owner import Outcome
from subagents_node.client.client import Client
from subagents_node.client.paths import (
    ADDRESS_BOOK_NAME,
    OWNER_SOCKETS,
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
    ConfigError,
    NodeAlreadyRunning,
    StoreError,
    StoreFull,
)
from subagents_node.messages.keys import REQUESTS as KEY_REQUESTS
from subagents_node.messages.node import (
    ContainmentStatus,
    NodeStatus,
    NodeStatusResult,
    Ping,
    Pong,
    Shutdown,
)
from subagents_node.node import owners
from subagents_node.node.curve import CurveGuard
from subagents_node.node.dispatch import Dispatcher
from subagents_node.node.forwarder import Forwarder
from subagents_node.node.gateway import Gateway
from subagents_node.node.inprocess import InProcessTransport
from subagents_node.node.ownerproc import V1_DB_NAME, OwnerSpec
from subagents_node.node.ownersup import OwnerSupervisor

log = logging.getLogger(__name__)


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
        self._owners: OwnerSupervisor | None = None
        self._forwarder: Forwarder | None = None
        self._gateway: Gateway | None = None
        self._curve: CurveGuard | None = None
        self._clients: list[Client] = []
        self.dispatcher = Dispatcher(self._serve_node, self.options.mailbox_limit)
        self.containment = ContainmentStatus(mode="subreaper", why="not started")

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> Node:
        ensure_state_dir(self.state_dir)
        self.state_dir = self.state_dir.resolve()
        endpoints = self._endpoints()
        self._refuse_if_running()
        self.containment = self._resolve_containment()
        try:
            self._start_serving(self._owner_specs(endpoints[0]), endpoints)
        except BaseException:
            # Whatever failed (a bind, a full disk under the pid file), nothing may keep
            # running: a half-started node would hold the state dir and hang `start`.
            self.stop()
            raise
        log.info("node %s serving %s", self.node_id, ", ".join(self.endpoints))
        return self

    def _resolve_containment(self) -> ContainmentStatus:
        """Setting `containment`: `auto` (cgroup v2 where this process may make cgroups, else
        the subreaper alone), `cgroup` (required: the node does not start without it) or
        `subreaper`."""
        setting = str(self.options.settings.get("containment") or "auto")
        found = cgroup.resolve(setting, str(self.state_dir))
        if setting == "cgroup" and found.mode != "cgroup":
            raise ConfigError(
                f"containment = cgroup, but no cgroup v2 subtree is writable: {found.why}",
                key="containment",
                source="settings",
                reason="cgroup",
            )
        log.info("children's containment: %s", found.mode)
        return ContainmentStatus(mode=found.mode, path=found.path, why=found.why)

    def _owner_specs(self, node_address: str) -> list[OwnerSpec]:
        peers = {name: self._owner_endpoint(name) for name in OWNER_SOCKETS}
        peers["node"] = node_address
        settings = {
            "runs_dir": str(self.state_dir / "runs"),
            "node_address": node_address,
            "runs_address": peers[owners.RUNS.name],
            "node_pid": os.getpid(),
            **self.options.settings,
            "cgroup_base": self.containment.path,
        }
        specs = []
        for cls in owners.OWNERS:
            own = {**settings, "caps_child_logs": cls is owners.RUNS}
            specs.append(
                OwnerSpec(
                    cls=cls,
                    stem=OWNER_SOCKETS[cls.name].removesuffix(".sock"),
                    state_dir=self.state_dir,
                    endpoint=peers[cls.name],
                    families=owners.families_of(cls),
                    peers=peers,
                    synchronous=self.options.synchronous,
                    faults=self.options.faults,
                    max_frame=self.options.max_frame,
                    mailbox_limit=self.options.mailbox_limit,
                    settings=own,
                )
            )
        return specs

    def _owner_endpoint(self, name: str) -> str:
        return f"ipc://{self.state_dir / OWNER_SOCKETS[name]}"

    def _start_serving(self, specs: list[OwnerSpec], endpoints: list[str]) -> None:
        for spec in specs:  # sockets left by owners of a node killed with -9
            path = ipc_path(spec.endpoint)
            if path is not None:
                with suppress(FileNotFoundError):
                    path.unlink()
        self._zctx = zmq.Context()
        self._owners = OwnerSupervisor(
            specs,
            self.options.restart_max,
            self.options.restart_window_s,
            on_change=self._owners_changed,
        )
        self._owners.start(self._zctx)
        self._forwarder = Forwarder(self._zctx, self.node_id, self._route)
        for spec in specs:
            self.dispatcher.register(spec.name, self._forwarder.submit)
        self._retire_v1_state()
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
        self._owners_changed()

    def _route(self, target: str) -> str:
        return self._owner_endpoint(target) if target in OWNER_SOCKETS else self.address

    def _retire_v1_state(self) -> None:
        """Once every owner imported its tables from a version-1 `state.db`, keep the old
        file aside (`state.db.v1`) so it is never imported again."""
        old = self.state_dir / V1_DB_NAME
        if not old.exists() or self._owners is None or self._owners.all_failed():
            return
        if any(s.state != "running" for s in self._owners.status(0)):
            return
        for suffix in ("", "-wal", "-shm"):
            with suppress(FileNotFoundError):
                Path(f"{old}{suffix}").replace(Path(f"{old}.v1{suffix}"))

    def _owners_changed(self) -> None:
        """An owner started, restarted or failed: rewrite the address book; when no owner at
        all can serve any more, the node stops (non-zero) so a service manager restarts it."""
        if self._owners is None:
            return
        if self._owners.all_failed() and not self._stop_requested.is_set():
            self._fail("every owner failed; see node.log")
        if not self.started_at:
            return
        book = {
            "node": {"endpoint": self.address, "pid": os.getpid(), "node_id": self.node_id},
            "owners": self._owners.book(),
        }
        tmp = self.state_dir / (ADDRESS_BOOK_NAME + ".tmp")
        with suppress(OSError):
            tmp.write_text(json.dumps(book, indent=1))
            tmp.replace(self.state_dir / ADDRESS_BOOK_NAME)

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
        if self._owners is not None:
            self._owners.stop()
        if self._forwarder is not None:
            self._forwarder.stop()
        if self._zctx is not None:
            self._zctx.term()
        if self.containment.mode == "cgroup":  # kept while a child's cgroup is in it
            cgroup.remove_empty(self.containment.path)
        self._remove_pid_file()

    def request_stop(self) -> None:
        self._stop_requested.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested (signal, `node.shutdown`, or too many crashes)."""
        return self._stop_requested.wait(timeout)

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
                actors=self._owners.status(self.dispatcher.mailbox_limit) if self._owners else [],
                containment=self.containment,
            )
        if isinstance(request, KEY_REQUESTS) and self._curve is not None:
            return self._curve.serve(request)
        if isinstance(request, Shutdown):
            # Reply first; the owner of the process (start's main loop) performs the stop.
            self.request_stop()
            return Ack()
        return BadRequest(f"the node does not serve {request.type}", reason="wrong_target")

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
        # Here, not at the top: the owners are forked by now, and none of them needs psutil.
        import psutil

        record = {
            "pid": os.getpid(),
            "create_time": psutil.Process().create_time(),
            "node_id": self.node_id,
            "address": self.address,
            "endpoints": self.endpoints,
            "host": socket.gethostname(),
            "owners": self._owners.pids() if self._owners else {},
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
