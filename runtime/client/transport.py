"""The transport seam: send a request, get its result or its typed error.

- `ZmqTransport` (here) speaks msgpack envelopes over DEALER sockets to ROUTERs. Given the
  node's ipc socket in a state dir, it sends each request straight to the owner process that
  serves it (the address book's ipc endpoints sit beside the node's socket: `runs.sock`,
  `capacity.sock`, ...; DESIGN §1), and only node.* requests to the node; given any other
  address (tcp, or an ipc path elsewhere) it sends everything there and the node forwards.
  Each calling thread gets its own DEALER per endpoint (sockets are not thread-safe), so many
  threads can call at once with no extra hop; a thread may have many requests outstanding.
  ZeroMQ reconnects by itself after a node restart; when an owner restarts over ipc (a new
  socket file) the thread's next request opens a fresh channel. Over tcp a request in flight
  across a restart times out. A tcp address is always CURVE (DESIGN §3): explicit
  credentials, else `$SUBAGENTS_CLIENT_KEY` / `$SUBAGENTS_SERVER_KEY`, else the state dir's
  key files.
- `InProcessTransport` (subagents_node.node.inprocess) hands the request model to a node in the
  same process: no encoding, used by the embedded node and the fast unit tests.

Thread-safe, `close()` included: it may be called while other threads are inside calls, which
then raise NodeNotRunning("this client is closed"), as does every call after it; it never
closes a socket its thread is using (client/thread_channels.py says how). It may be called from
a signal handler too, whose thread is inside a call: that call ends the context when it returns,
at once (`close` would otherwise wait in `term()` for the very call it interrupted). Every call
is bounded by its deadline, its send included: a full send queue (an owner that stopped
reading) is a NodeTimeout with nothing sent (`Channel.write`), not a send blocked until the
owner reads again. A thread's channels
are released when the thread ends. A forked child that goes on using its parent's transport
gets a fresh zmq context and fresh channels of its own (the parent's are never touched). A
transport dropped without `close()` releases its sockets and context when it is collected
(`_released`), a reference cycle included: left to pyzmq, the cyclic collector finalized the
context before its sockets and the context's `term()` waited for them for good.

Here: which endpoint a request goes to, and opening and renewing each thread's channels.
Beside it: `client/thread_channels.py` (one thread's channels, and when they may be closed),
`client/channel.py` (one channel: replies matched by correlation id, timeouts, a restarted
owner noticed in flight, a refused handshake), `client/curve.py` (the keys a tcp socket
offers), `client/reachability.py` (whether a node is there at all).

It must never import the node or the actors: every child agent imports this module.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Protocol

import zmq

from subagents_node.client.channel import (
    Channel,
    PeerFile,
    PendingReply,
    closed_error,
    dealer_options,
)
from subagents_node.client.curve import (
    HANDSHAKE_REFUSED,
    curve_client,
    default_credentials,
    no_keys,
)
from subagents_node.client.exhaustion import descriptors_needed, exhausted
from subagents_node.client.keys import ClientCredentials
from subagents_node.client.paths import OWNER_SOCKETS, SOCKET_NAME, check_endpoint, ipc_path
from subagents_node.client.reachability import check_reachable, timed_out
from subagents_node.client.thread_channels import ThreadAnchor, ThreadChannels
from subagents_node.messages.base import Message, Request
from subagents_node.messages.codec import request_frame
from subagents_node.messages.envelope import new_message_id
from subagents_node.messages.errors import BadAddress, KeyFileInvalid


def endpoint_for(address: str, target: str) -> str:
    """Where a request for `target` goes: its owner's own socket beside the node's (a state
    dir's ipc socket: the address book's ipc part), else the node's address (which forwards)."""
    path = ipc_path(address)
    if path is None or path.name != SOCKET_NAME or target not in OWNER_SOCKETS:
        return address
    return f"ipc://{path.parent / OWNER_SOCKETS[target]}"


class Transport(Protocol):
    """Send one request and wait for its outcome.

    `target` names the owner for requests that do not fix one themselves (the `debug.*`
    fault-injection requests); a request with its own target ignores an empty one and refuses
    a different one (BadRequest, from the Dispatcher).
    """

    address: str

    def call(self, request: Request, timeout: float, target: str = "") -> Message: ...

    def close(self) -> None: ...


class ZmqTransport:
    def __init__(
        self,
        address: str,
        zctx: zmq.Context[zmq.Socket[bytes]] | None = None,
        sender: str = "",
        credentials: ClientCredentials | None = None,
        state_dir: Path | None = None,
        host: str = "",
    ) -> None:
        self.address = check_endpoint(address)
        #: Multi-host: the worker the home node at `address` carries every request on to
        #: (`Envelope.host`; sent to the node's own socket, which does the carrying).
        self.host = host
        #: tcp only: explicit keys, else those of `state_dir` (else the default state dir's)
        self._credentials = credentials
        self._state_dir = state_dir
        self._own_context = zctx is None
        with descriptors_needed():  # a context is an eventfd and an epoll instance
            self._zctx: zmq.Context[zmq.Socket[bytes]] = zctx or zmq.Context()
        self._sender = sender or f"client-{os.getpid()}"
        self._pid = os.getpid()
        #: Each thread's ThreadAnchor: the thread's channels live as long as the thread.
        self._local = threading.local()
        #: Every thread's channels, for close(); each leaves when its thread ends.
        self._threads: set[ThreadChannels] = set()
        #: In a forked child: what the parent left in this object (`_after_fork`).
        self._parents: tuple[object, ...] = ()
        #: Guards _threads and _closed; reentrant: a signal handler's close() may run while
        #: its thread holds it (client/thread_channels.py).
        self._lock = threading.RLock()
        self._closed = False
        #: Write ends of the pipes a wait of this client's polls (nodewait.py: the next node's):
        #: closed by `close()`, so that wait ends with the client, not 30 s later.
        self._stops: set[int] = set()
        self._endpoints: dict[str, str] = {}
        self._generation = 0
        self._collected = self._on_collection()

    @property
    def closed(self) -> bool:
        return self._closed

    def ends_with_close(self, stopping: int) -> None:
        """Close descriptor `stopping` when this client closes (at once if it is closed),
        unless `release` takes it back first: exactly one of them closes it."""
        with self._lock:
            if not self._closed:
                self._stops.add(stopping)
                return
        os.close(stopping)

    def release(self, stopping: int) -> bool:
        """Take `stopping` back: True when it is the caller's to close (not closed yet)."""
        with self._lock:
            if stopping not in self._stops:
                return False
            self._stops.discard(stopping)
            return True

    def _on_collection(self) -> weakref.finalize[..., ZmqTransport]:
        """What releases this process's sockets and context once the transport is collected
        without `close()`. The finalizer holds them, so they are never part of the transport's
        garbage: a collection clears the weak set a zmq context knows its sockets by, and its
        own finalizer then waited in `term()` for sockets it could no longer close. Not at
        exit: a daemon thread may still be inside a call then, and `term()` would wait on it."""
        collected = weakref.finalize(
            self, _released, os.getpid(), self._zctx, self._threads, self._own_context
        )
        collected.atexit = False
        return collected

    def __reduce__(self) -> tuple[type[ZmqTransport], tuple[object, ...]]:
        """What another process needs to open its own connections to the same node: the
        address, host and keys (sockets and locks are this process's own), unless the keys are
        this process's only (a node's own: the other process needs its own)."""
        keys = self._credentials
        keys = None if keys is not None and keys.process_only else keys
        return (ZmqTransport, (self.address, None, "", keys, self._state_dir, self.host))

    def reset(self) -> None:
        """Open fresh connections for the next requests (each thread replaces its own idle
        ones). After a peer's restart, a request written to the old connection before its
        DEALER saw it close would be lost; a fresh connection queues until it connects."""
        self._generation += 1

    def _thread_channels(self) -> ThreadChannels:
        """This thread's channels: registered on first use, refused once the client closed."""
        if os.getpid() != self._pid:
            self._after_fork()
        anchor: ThreadAnchor | None = getattr(self._local, "anchor", None)
        if anchor is not None:
            return anchor.channels
        with self._lock:
            # Neither callback holds the transport: its channels (kept by `_released` too)
            # must not keep it from being collected.
            forget = functools.partial(_forget, self._threads, self._lock)
            channels = ThreadChannels(self.address, forget)
            self._threads.add(channels)
            # After the add: a close from a signal handler landing before it saw no channels
            # of this thread (and ended the context), one landing after it closes them.
            if self._closed:
                self._threads.discard(channels)
                raise closed_error(self.address)
        self._local.anchor = channels.anchor()
        return channels

    def _after_fork(self) -> None:
        """In a forked child: a context and channels of its own. The parent's context has no
        I/O threads here (a request on it would wait forever, whatever its timeout), and its
        sockets are the parent's: they are left alone, never closed from the child."""
        # Kept, untouched, as long as this transport: collecting them would close sockets of
        # a context whose I/O threads this process does not have (and warn about each).
        self._parents = (self._zctx, self._threads, self._local, self._parents)
        if self._sender == f"client-{self._pid}":
            self._sender = f"client-{os.getpid()}"
        self._pid = os.getpid()
        self._lock = threading.RLock()  # the parent's may have been held by another thread
        self._threads = set()
        self._local = threading.local()
        self._zctx = zmq.Context()
        self._own_context = True
        self._collected = self._on_collection()  # the inherited one does nothing here

    def endpoint_for(self, target: str) -> str:
        # Computed once per target: path parsing on every request shows in a claim's CPU.
        endpoint = self._endpoints.get(target)
        if endpoint is None:
            direct = endpoint_for(self.address, target) if not self.host else self.address
            endpoint = self._endpoints[target] = direct
        return endpoint

    def on_host(self, host: str) -> ZmqTransport:
        """A transport whose requests the home node at this address carries on to its worker
        `host` (the node's ipc socket only: a home carries nothing for a tcp peer)."""
        return ZmqTransport(
            self.address,
            sender=self._sender,
            credentials=self._credentials,
            state_dir=self._state_dir,
            host=host,
        )

    def _open_channel(self, threads: ThreadChannels, endpoint: str) -> Channel:
        channel = threads.current.get(endpoint)
        if channel is not None and (
            channel.generation != self._generation
            or (channel.peer is not None and channel.peer.changed())
        ):
            # After `reset`, or its owner restarted (a new socket file): a fresh connection,
            # so nothing more is written to one the peer closed. The old one is closed here,
            # by its own thread, once no request of this thread waits on it.
            del threads.current[endpoint]
            channel.retire(threads.drop)
            channel = None
        if channel is not None:
            return channel
        self._check_reachable(stale=True)
        if endpoint != self.address:
            check_reachable(endpoint, stale=True)
        with descriptors_needed():
            sock = self._zctx.socket(zmq.DEALER)
        for option, value in dealer_options(endpoint):
            sock.setsockopt(option, value)
        monitor = None
        try:
            if self.address.startswith("tcp://"):
                curve_client(sock, self._credentials or default_credentials(self._state_dir))
                monitor = sock.get_monitor_socket(HANDSHAKE_REFUSED)
            sock.connect(endpoint)
        except zmq.ContextTerminated:
            sock.close(linger=0)
            raise
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            if (typed := exhausted(exc)) is not None:
                raise typed from exc
            raise BadAddress(
                f"cannot connect to {self.address}: {exc}", address=self.address
            ) from None
        except KeyFileInvalid as err:
            sock.close(linger=0)
            raise no_keys(self.address, err) from None
        except BaseException:  # anything else: the socket is not left to the collector
            sock.close(linger=0)
            raise
        path = ipc_path(endpoint)
        peer = None if path is None else PeerFile(str(path))
        silent = functools.partial(timed_out, self.address)
        channel = Channel(sock, threads, self.address, silent, monitor, endpoint, peer)
        channel.generation = self._generation
        threads.add(channel)
        return channel

    def _check_reachable(self, stale: bool = False) -> None:
        check_reachable(self.address, stale)

    def submit(
        self, request: Request, target: str = "", deadline: float | None = None
    ) -> PendingReply:
        """Put `request` on the wire now; resolve the returned PendingReply later, same thread.
        A full send queue is waited on until `deadline` (time.monotonic(); None: as long as
        it takes), then NodeTimeout with nothing sent."""
        channel, msg_id = self.send(request, target, deadline)
        return PendingReply(self, channel, request, msg_id, target or request.target)

    def send(
        self, request: Request, target: str = "", deadline: float | None = None
    ) -> tuple[Channel, str]:
        """Put `request` on this thread's channel to its owner (opened or renewed here), by
        `deadline` at the latest (`submit`).

        The one stat per request is the channel's check of its socket file: a file gone or
        replaced opens a fresh channel, which checks the node is there (NodeNotRunning). It
        stays before every write: a write into a connection whose owner already restarted is
        lost, and for a request that is not resendable that would be an unknown outcome.
        Opening the channel and writing happen under one `enter` of the thread's guard.
        Returns the channel and the request's message id (its replies' correlation id)."""
        threads = self._thread_channels()
        target = target or request.target
        endpoint = self.endpoint_for(target)
        threads.enter()  # NodeNotRunning once closed; from here on close() leaves these be
        try:
            channel = self._open_channel(threads, endpoint)
            msg_id = new_message_id()
            body = request.to_body()
            # FrameTooLarge, BadRequest before anything is sent
            frame = request_frame(request.type, body, msg_id, self._sender, target, self.host)
            channel.write(frame, msg_id, request, deadline)
        except zmq.ZMQError as exc:  # ETERM: closed from another thread during this call
            threads.leave(terminated=exc.errno == zmq.ETERM)  # NodeNotRunning once closed
            raise
        except BaseException:  # the call's own error (or a signal handler's): it goes on
            threads.leave(passing=True)
            raise
        threads.leave()  # NodeNotRunning if the client closed meanwhile
        return channel, msg_id

    def call(self, request: Request, timeout: float, target: str = "") -> Message:
        deadline = time.monotonic() + timeout  # the send's too: a full queue waits no longer
        pending = self.submit(request, target, deadline)
        return pending.result(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Close every thread's channels. Safe while other threads are inside calls: theirs
        are closed by those threads as their calls return, at once (`term()` cuts a blocked
        call short), and those calls raise NodeNotRunning("this client is closed"). Safe from
        a signal handler whose thread is inside a call: the context is ended by that call as
        it returns, at once, instead of here (`term()` would wait for it for good)."""
        if os.getpid() != self._pid:
            self._after_fork()  # a forked child closes what is its own, never the parent's
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
            stops, self._stops = self._stops, set()
        for stopping in stops:  # a wait for the next node polls its other end: it ends now
            os.close(stopping)
        self._collected.detach()
        end = self._zctx.term if self._own_context else None
        here = threading.get_ident()
        interrupted = False  # this thread is inside a call of ours: a handler called close()
        for channels in threads:
            if not channels.close(then=end) and channels.thread_id == here:
                interrupted = True
        if end is not None and not interrupted:
            end()  # returns once each thread inside a call closed its sockets


def _forget(threads: set[ThreadChannels], lock: threading.RLock, channels: ThreadChannels) -> None:
    """A thread's channels, released as the thread ended: no longer the transport's to close."""
    with lock:
        threads.discard(channels)


def _released(
    pid: int, zctx: zmq.Context[zmq.Socket[bytes]], threads: set[ThreadChannels], own: bool
) -> None:
    """A collected transport's sockets closed and its own context ended. Nothing can be inside
    a call on them (a call holds its transport), so nothing waits; `destroy` closes with no
    linger any socket no thread registered. A forked child never touches its parent's."""
    if os.getpid() != pid:
        return
    for channels in list(threads):
        channels.close()
    if own:
        zctx.destroy(linger=0)
