"""One thread's channels of a sync transport, and when their sockets may be closed.

A zmq socket must only ever be used by one thread at a time, and closing it while its thread
is inside a call on it aborts the process (libzmq asserts). `ThreadChannels` holds one thread's
channels (the current one per endpoint, and retired ones a request still waits on) and knows
whether its thread is inside a socket call right now (`enter` ... `leave`, around every call).
Closing (the transport's `close()`, from any thread) therefore never races the thread:

- a thread outside a call has its sockets closed at once, under the lock `enter` takes, and its
  next call raises NodeNotRunning("this client is closed");
- a thread inside a call is only marked: `ctx.term()` makes its blocked call return (ETERM),
  and it closes its own sockets in `leave` before raising the same NodeNotRunning.
- a close from the thread that is inside a call (a signal handler, which runs on the main
  thread between two steps of its call; a finalizer) can neither close those sockets (the
  interrupted call goes on using them once the handler returns) nor wait in `ctx.term()` for
  them (they close only after it returned): `close()` says so (False), and the transport hands
  the context's end to `leave` (`then`). The sockets' receive timeout is cut to nothing, so the
  interrupted call returns at once when the handler did, closes them and ends the context.

Both locks here and the transport's are reentrant for the same reason: a handler may run
while its thread holds one, and its `close()` takes it again (a plain lock waited forever). Each
step under them leaves the state consistent at every point a handler could see it.

Its channels are also released when the thread ends: the thread-local `ThreadAnchor` is the
only strong reference to the thread's slot, and its weak reference's callback closes the
sockets (a client shared by many short-lived threads keeps no descriptor of theirs). In a
forked child nothing of the parent's is ever touched: those sockets belong to a zmq context
whose I/O threads the child does not have.

It must never choose an endpoint or open a socket (the transport does both) and never close a
socket whose thread is inside a call on it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable

import zmq

from subagents_node.client.channel import Channel, closed_error
from subagents_node.messages.errors import NodeNotRunning


class ThreadAnchor:
    """Kept in the thread-local of one thread; when the thread ends it goes, and so do the
    thread's channels."""

    __slots__ = ("__weakref__", "channels")

    def __init__(self, channels: ThreadChannels) -> None:
        self.channels = channels


class ThreadChannels:
    """One thread's open channels of one transport, closed by whoever may close them."""

    def __init__(self, address: str, on_released: Callable[[ThreadChannels], None]) -> None:
        self.address = address
        #: The channel each endpoint's next request goes on (this thread only).
        self.current: dict[str, Channel] = {}
        self._open: list[Channel] = []  # current and retired ones still awaited
        self._lock = threading.RLock()  # reentrant: a signal handler's close() (docstring)
        self._in_call = False
        self._closing = False
        self._pid = os.getpid()
        self._thread_id = threading.get_ident()  # made on its own thread (the transport's)
        #: What runs once a call's `leave` closed these sockets: the context's end, when the
        #: close came from this very thread inside that call (`close`, `then`).
        self._then: Callable[[], None] | None = None
        self._on_released = on_released
        self._anchor_ref: weakref.ref[ThreadAnchor] | None = None

    def anchor(self) -> ThreadAnchor:
        """The object the thread keeps in its thread-local; its end releases these channels."""
        anchor = ThreadAnchor(self)
        self._anchor_ref = weakref.ref(anchor, self._thread_ended)
        return anchor

    @property
    def closing(self) -> bool:
        """The client closed: a call of this thread that waits in slices stops waiting."""
        return self._closing

    def enter(self) -> None:
        """Before any call on a socket of this thread (opening one included). In the call from
        its first step: a close that lands after it leaves the sockets be."""
        with self._lock:
            self._in_call = True
            if not self._closing:
                return
        self.leave()  # closed: release what a close landing inside `enter` left, and raise

    def leave(self, terminated: bool = False, passing: bool = False) -> None:
        """After the call. If the client closed meanwhile (or the context was terminated
        under it: `terminated`), close this thread's sockets and raise NodeNotRunning; not
        when the call ends with an exception of its own (`passing`: a signal handler's
        `sys.exit()`, say), which goes on."""
        with self._lock:
            self._in_call = False
            self._closing = self._closing or terminated
            if not self._closing:
                return
            self._close_sockets()
            then, self._then = self._then, None
        self._on_released(self)
        if then is not None:
            then()
        if not passing:
            raise self.closed_error()

    def add(self, channel: Channel) -> None:
        """A channel just opened (between `enter` and `leave`) to its endpoint."""
        self.current[channel.endpoint] = channel
        self._open.append(channel)

    def drop(self, channel: Channel) -> None:
        """Close a retired channel (its thread only, outside a call: nothing else uses it)."""
        with self._lock:
            if channel in self._open:
                self._open.remove(channel)
                close_channel(channel)

    def close(self, then: Callable[[], None] | None = None) -> bool:
        """From any thread: close the sockets now (True), or mark them for their thread to
        close when its call returns (False). Called from that very thread inside its call (a
        signal handler), it also cuts the call's wait short, and `then` runs once the call
        closed them (the transport's `term()` could not wait for them here)."""
        with self._lock:
            self._closing = True
            if self._in_call:
                if threading.get_ident() == self._thread_id:
                    self._then = then
                    for channel in self._open:
                        with contextlib.suppress(zmq.ZMQError):
                            channel.cut_short()
                return False
            self._close_sockets()
        self._on_released(self)
        return True

    @property
    def thread_id(self) -> int:
        return self._thread_id

    def closed_error(self) -> NodeNotRunning:
        return closed_error(self.address)

    def _close_sockets(self) -> None:
        channels, self._open = self._open, []
        self.current.clear()
        for channel in channels:
            close_channel(channel)

    def _thread_ended(self, _anchor: weakref.ref[ThreadAnchor]) -> None:
        if os.getpid() != self._pid:
            # A forked child dropping its copy of the parent's thread-local: those sockets are
            # the parent's (and its lock may have been held by a thread the child lacks).
            return
        self.close()


def close_channel(channel: Channel) -> None:
    if channel.monitor is not None:
        channel.sock.disable_monitor()
        channel.monitor.close(linger=0)
    channel.sock.close(linger=0)
