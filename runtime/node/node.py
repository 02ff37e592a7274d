"""Node: the supervisor of the owner processes, and the node's own small service.

Owns the node's lifetime: the state dir, the owner processes (started in order, watched,
restarted, marked failed: runtime/node/ownersup.py, with the specs of runtime/node/ownerspecs.py),
the address book (runtime/node/addressbook.py) and the pid file (runtime/node/pidfile.py) that
tell other processes where each owner listens, the gateway (node.* requests, answered by
runtime/node/noderequests.py, keys, and tcp peers) and the forwarder that carries whatever
reaches the node's sockets on to the owners, and the order in which they start and stop. Its
options are checked first (runtime/node/roles.py), its children's containment next
(runtime/node/containment.py). Each owner is its own process with its own socket and database
(DESIGN §1); the node never opens an owner's database. Runs in the foreground (`start`),
detached (`start --detach`, see runtime.daemon) or embedded (`Node.embedded()`: the same
processes, stopped with the block).

Multi-host (DESIGN §1): a home node (`home`) also listens on tcp beyond loopback, keeps its
workers' membership and fences a forgotten worker at its gateway (runtime/node/home.py), and
tells its ledger owners their tcp peers (runtime/node/ownerpeers.py); a worker node (`join`)
runs only the run supervisor and its shims, joins the home (runtime/node/homejoin.py) and
serves the ledger owners' sockets itself, forwarding every request for them to the home over
CURVE, failing closed while the home is unreachable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from subagents_node.actors.child import cgroup
from subagents_node.actors.outcomes import ReplyFn
from subagents_node.client.client import Client
from subagents_node.client.paths import ensure_state_dir, ipc_path, resolve_state_dir
from subagents_node.client.transport import ZmqTransport
from subagents_node.messages.base import Request
from subagents_node.messages.errors import BadAddress, NodeAlreadyRunning, NodeNotRunning
from subagents_node.messages.members import HOME_NAME
from subagents_node.messages.node import ActorStatus, ContainmentStatus, TcpListenerStatus
from subagents_node.messages.statefiles import restrict_socket
from subagents_node.node import noderequests, owners, ownerspecs, pidfile, roles
from subagents_node.node.addressbook import AddressBook
from subagents_node.node.claim import StateDirClaim
from subagents_node.node.containment import resolve_containment
from subagents_node.node.curve import CurveGuard
from subagents_node.node.dispatch import Dispatcher
from subagents_node.node.homejoin import HomeJoin
from subagents_node.node.homelink import HomeLink
from subagents_node.node.optioncheck import check_options, check_transport
from subagents_node.node.options import NodeOptions
from subagents_node.node.ownerpeers import OwnerPeerTable
from subagents_node.node.ownerproc import OwnerSpec, retire_v1_state
from subagents_node.node.ownersup import OwnerSupervisor
from subagents_node.node.signalmask import threads_started_here_block_signals

if TYPE_CHECKING:
    from subagents_node.node.forwarder import Forwarder
    from subagents_node.node.gateway import Gateway
    from subagents_node.node.home import HomeService

log = logging.getLogger(__name__)


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
        check_options(self.options)  # before anything reads them
        self.state_dir = resolve_state_dir(self.options.state_dir)
        self.node_id = f"node-{uuid.uuid4().hex[:12]}"
        self.started_at = 0.0
        self.failure: str | None = None
        self._stop_requested = threading.Event()
        self._stopped = False
        self._pid = os.getpid()  # the process that serves; a forked child stops nothing
        self._zctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._owners: OwnerSupervisor | None = None
        self._forwarder: Forwarder | None = None
        self._gateway: Gateway | None = None
        self._curve: CurveGuard | None = None
        self._home: HomeService | None = None
        self._book: AddressBook | None = None
        #: A home's ledger owners' tcp endpoints (owner -> endpoint), and the latest word on
        #: their tcp peers (what an owner forked now starts with).
        self._owner_tcp: dict[str, str] = {}
        self._peers = OwnerPeerTable()
        self._clients: list[Client] = []
        self.dispatcher = Dispatcher(self._serve_node, self.options.mailbox_limit)
        self._join = HomeJoin(self.options.join, self.dispatcher, self.node_id)
        self.containment = ContainmentStatus(mode="subreaper", why="not started")
        #: This node's mark in its cgroup directory (cgroup containment), removed at stop.
        self._serving_mark = ""
        self._claim = StateDirClaim(self.state_dir)

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> Node:
        if self._stopped or self._owners is not None:  # a Node serves once: a new one, again
            raise NodeAlreadyRunning(
                f"this Node {'served' if self._stopped else 'serves'} {self.state_dir}: "
                "a Node starts once; create a new one",
                state_dir=str(self.state_dir),
            )
        self._pid = os.getpid()
        # Its endpoints checked before the state dir is made: a `listen` it cannot use left a
        # new, empty state dir behind (docs/api.md: nothing is created for a bad option).
        roles.listen_endpoints(self.options, Path(os.path.abspath(self.state_dir)))
        ensure_state_dir(self.state_dir)
        self.state_dir = self.state_dir.resolve()
        self._owner_tcp = roles.check_role(self.options)
        endpoints = roles.listen_endpoints(self.options, self.state_dir)
        pidfile.refuse_if_serving(self.state_dir)  # at once, before waiting on any claim
        # One node per state dir, decided by the kernel before anything is bound or forked.
        self._claim = StateDirClaim(self.state_dir)
        try:
            self._claim.take(pidfile.recorded_pids(self.state_dir))
        except NodeAlreadyRunning:
            pidfile.refuse_if_serving(self.state_dir, ours_too=True)  # a clearer word, if ours
            raise
        try:
            pidfile.refuse_if_running(self.state_dir, self.options.ipc)
            pidfile.refuse_served_sockets(endpoints[1:] if self.options.ipc else endpoints)
            roles.refuse_taken_ports(self._owner_tcp)
            roles.refuse_role_change(self.options, self.state_dir)
        except BaseException:
            self._claim.release()
            raise
        setting = str(self.options.settings.get("containment") or "auto")
        self.containment, self._serving_mark = resolve_containment(
            setting, self.state_dir, self.options.containment_probe
        )
        try:
            if self.options.join:
                opts = self.options
                self._join.join(self.state_dir, opts.home_key, opts.name, opts.client_key)
            # Its threads leave the process's signals to the caller's (signalmask.py).
            with threads_started_here_block_signals():
                self._start_serving(self._owner_specs(endpoints[0]), endpoints)
        except BaseException:
            # Whatever failed (a bind, a full disk under the pid file), nothing may keep
            # running: a half-started node would hold the state dir and hang `start`.
            self.stop()
            raise
        log.info("node %s serving %s", self.node_id, ", ".join(self.endpoints))
        return self

    # -- multi-host -----------------------------------------------------------------------------

    @property
    def remote_owners(self) -> frozenset[str]:
        """The owners this node forwards to its home (a worker's ledgers), else none."""
        return roles.REMOTE_OWNERS if self.options.join else frozenset()

    def _owner_specs(self, node_address: str) -> list[OwnerSpec]:
        return ownerspecs.owner_specs(
            self.options,
            self.state_dir,
            node_address,
            self.containment.path,
            self.remote_owners,
            self._owner_tcp,
            self._peers.current,
        )

    def _start_serving(self, specs: list[OwnerSpec], endpoints: list[str]) -> None:
        book = self._book = AddressBook(
            self.state_dir,
            self.node_id,
            self.remote_owners,
            self._join.owner_route,
            lambda: self.address,
        )
        # A worker serves its home's owners' sockets itself (its gateway forwards them).
        proxies = [
            ownerspecs.owner_endpoint(self.state_dir, name) for name in sorted(self.remote_owners)
        ]
        for endpoint in [spec.endpoint for spec in specs] + proxies:
            path = ipc_path(endpoint)  # sockets left by a node killed with -9
            if path is not None:
                with suppress(FileNotFoundError):
                    path.unlink()
        endpoints = endpoints[:1] + proxies + endpoints[1:]
        # The node makes the allow-list's changes while it runs (keys allow|revoke ask it); a
        # tcp listener is a CURVE server whatever its address (DESIGN §3, runtime/node/curve.py).
        tcp = bool(self._owner_tcp) or any(e.startswith("tcp://") for e in endpoints)
        self._curve = CurveGuard(self.state_dir, listens_on_tcp=tcp, on_reread=self._reread_keys)
        if self.options.home:
            from subagents_node.node.home import HomeService

            self._home = HomeService(
                self.state_dir,
                self.node_id,
                self.options.heartbeat_s,
                self.options.heartbeat_timeout_s,
                self._submit,
                self._tcp_endpoints,
                owner_ports={n: roles.port_of(e) for n, e in self._owner_tcp.items()},
                allowed=lambda: self._curve.allowed if self._curve is not None else {},
                tell=self._peers.tell,
            )
            # The home's ledger owners know their tcp peers from their first moment (each
            # fork takes the latest table): no handshake is refused while they wait to be told.
            self._home.tell_owners()
        self._zctx = zmq.Context()
        self._owners = OwnerSupervisor(
            specs,
            self.options.restart_max,
            self.options.restart_window_s,
            on_change=self._owners_changed,
            on_exit=self._owner_ended,
        )
        # The run supervisor first: it recovers its runs before it is ready, the ledgers have
        # less to do.
        self._owners.start(self._zctx, first=owners.RUNS)
        # The node's own serving code loads once its owners are forked: none of them runs it,
        # and each would hold it in its resident size (runtime/node/ownersup.py forks them).
        from subagents_node.node.forwarder import Forwarder
        from subagents_node.node.gateway import Gateway
        from subagents_node.node.hostcalls import HostCalls
        from subagents_node.node.relay import Relay

        self._forwarder = Forwarder(
            self._zctx,
            self.node_id,
            book.route,
            remote=self.remote_owners,
            remote_keys=self._join.keys,
            remote_timeout_s=self.options.remote_timeout_s,
            home_state=self._join.state,
        )
        self._peers.carry_to(self._forwarder.submit, self._owner_tcp)
        for name in [spec.name for spec in specs] + sorted(self.remote_owners):
            self.dispatcher.register(name, self._forwarder.submit)
        if not self._owners.all_failed():
            owners_now = self._owners
            retire_v1_state(self.state_dir, lambda: [s.state for s in owners_now.status(0)])
        self._gateway = Gateway(
            self._zctx,
            endpoints,
            self.dispatcher,
            self.node_id,
            self.options.max_frame,
            curve=self._curve,
            home=self._home,
            hosts=HostCalls.serving(self.node_id, self._home, self.options.settings),
            host_name=HOME_NAME if self.options.home else self.options.name,
            relay=Relay(
                self._zctx,
                self.node_id,
                book.route,
                targets=frozenset(spec.name for spec in specs),
                remote=self.remote_owners,
                remote_keys=self._join.keys,
                remote_timeout_s=self.options.remote_timeout_s,
                home_state=self._join.state,
                home=self.options.join,
            ),
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
                restrict_socket(path)  # DESIGN §3: sockets 0600 (the dir is 0700 as well)
        self._write_pid_file()
        self._owners_changed()
        for links in (self._forwarder, self._gateway):
            self._join.when_lost(links.home_lost)
        self._join.start(self._zctx)

    def _reread_keys(self) -> None:
        """The allow-list file was edited by hand: a home's ledger owners take it too."""
        if self._home is not None:
            self._home.tell_owners()

    def _submit(self, request: Request, target: str, reply: ReplyFn) -> None:
        assert self._forwarder is not None, "the home serves nothing before its forwarder runs"
        self._forwarder.submit(request, target, reply)

    def _owner_ended(self, endpoint: str) -> None:
        """An owner process was reaped: what the node's links had in flight to it is lost."""
        for links in (self._forwarder, self._gateway):
            if links is not None and not self._stopped:
                links.owner_ended(endpoint)

    def _owners_changed(self) -> None:
        """An owner started, restarted or failed: rewrite the address book, and tell the home
        join whether the run supervisor is ready; when no owner at all can serve any more, the
        node stops (non-zero) so a service manager restarts it."""
        if self._owners is None:
            return
        if self._owners.all_failed() and not self._stop_requested.is_set():
            self._fail("every owner failed; see node.log")
        if not self.started_at or self._book is None:
            return
        owners_book = self._owners.book()
        # A forgotten worker's pending stop of its runs is sent (again) when its run
        # supervisor becomes ready (runtime/node/homejoin.py): this is that event.
        self._join.runs_ready(owners_book.get(owners.RUNS, {}).get("state") == "running")
        home: dict[str, object] | None = None
        if self._home is not None and self._curve is not None:
            # What a worker needs: where the home's owners answer over tcp, and its key.
            home = {
                "tcp": self._tcp_endpoints(),
                "public_key": self._curve.server.public,
                "owners": dict(self._owner_tcp),
            }
            self._home.tell_owners()  # an owner (re)started: it admits nobody until told
        opts = self.options
        worker: dict[str, object] | None = (
            {"name": opts.name, "home": opts.join} if opts.join else None
        )
        self._book.write(owners_book, home, worker)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stop_requested.set()
        for client in self._clients:
            client.close()
        if os.getpid() != self._pid:  # a forked child: the owners, sockets, pid file and
            return  # the state dir's claim are the parent's (its flock would go with ours)
        self._join.stop()
        bound: list[str] = []
        if self._gateway is not None:
            self._gateway.stop()
            bound += self._gateway.bound
        if self._owners is not None:
            self._owners.stop()
            # Gone with them: a client holding a channel to one is told the node stopped at
            # once (its socket file is gone) instead of waiting out its timeout.
            bound += self._owners.endpoints()
        for endpoint in bound:
            path = ipc_path(endpoint)
            if path is not None:
                with suppress(FileNotFoundError):
                    path.unlink()
        if self._forwarder is not None:
            self._forwarder.stop()
        if self._home is not None:
            self._home.close()
        if self._zctx is not None:
            self._zctx.term()
        if self.containment.mode == "cgroup":  # kept while a child's cgroup is in it
            cgroup.unmark_serving(self.containment.path, self._serving_mark)
        pidfile.remove_pid_file(self.state_dir, self.node_id)
        self._claim.release()  # last: the owners that held it too are gone by now

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

    @property
    def endpoints(self) -> list[str]:
        return list(self._gateway.bound) if self._gateway else []

    @property
    def address(self) -> str:
        """The first endpoint: what children find in $SUBAGENTS_NODE."""
        return self.endpoints[0]

    def client(self, transport: str = "inproc", timeout: float = 10.0) -> Client:
        """A connected client: in-process (no encoding) or over the node's first endpoint; when
        that is tcp (no ipc socket), with the node's own key, which only this process and its
        forks hold (runtime/node/curve.py)."""
        if self._stopped or not self.started_at:  # its dispatcher would still answer node.*
            raise NodeNotRunning(f"this Node does not serve {self.state_dir}", address="")
        tcp = self._curve is not None and self.address.startswith("tcp://")
        own = self._curve.own_credentials() if tcp and self._curve is not None else None
        if check_transport(transport) == "inproc":
            from subagents_node.node.inprocess import InProcessTransport

            client = Client(InProcessTransport(self.dispatcher, self.address, own), timeout)
        else:
            client = Client(ZmqTransport(self.address, credentials=own), timeout)
        self._clients.append(client)
        return client

    @classmethod
    def embedded(
        cls, state_dir: str | os.PathLike[str] | None = None, **options: object
    ) -> AbstractContextManager[Node]:
        """Start a node in this process for the duration of the block.

        Without `state_dir`, state lives in a fresh temporary directory removed afterwards,
        once every run still going in it was stopped (runtime/node/embedding.py).
        """
        from subagents_node.node import embedding  # shutil, tempfile: never in an owner

        return embedding.Embedding(cls, NodeOptions, state_dir, options)

    # -- the node's own protocol (runtime/node/noderequests.py) --------------------------------

    def _serve_node(self, request: Request, principal: str | None, reply: ReplyFn) -> None:
        noderequests.serve(self, request, principal, reply)

    @property
    def curve(self) -> CurveGuard | None:
        return self._curve

    @property
    def home_service(self) -> HomeService | None:
        return self._home

    @property
    def home_link(self) -> HomeLink | None:
        return self._join.link

    def owner_statuses(self) -> list[ActorStatus]:
        return self._owners.status(self.dispatcher.mailbox_limit) if self._owners else []

    def tcp_listeners(self) -> list[TcpListenerStatus]:
        return noderequests.listeners(self._gateway, self._owners)

    def _tcp_endpoints(self) -> list[str]:
        return noderequests.tcp_endpoints(self.endpoints)

    # -- the pid file: which process serves this state dir (runtime/node/pidfile.py) ----------

    @property
    def pid_file(self) -> Path:
        return pidfile.pid_file_of(self.state_dir)

    def _write_pid_file(self) -> None:
        owner_pids = self._owners.pids() if self._owners else {}
        pidfile.write_pid_file(
            self.state_dir, self.node_id, self.address, self.endpoints, owner_pids
        )
