"""The run supervisor's watch on its shims, and the signals and waits it sends them.

Owns what the supervisor starts once, whatever the number of children (the template that forks
the shims is shimtemplate.py's):
- `ShimWatch`: one thread that blocks in poll() on a pidfd per shim (readable when the shim
  exits, whether or not we are its parent) and tells the supervisor which shim is gone. A shim
  that ends normally has reported `tree_ended` first; one seen gone without it died. Each shim
  is watched from its announcement on the template's stdout (the announce pipe), written by the
  template right after the fork; the pipe's end proves an order never announced forked no shim
  at all, and orders left unannounced for a second are how a stopped template is found (and
  ended).

It never writes a table, never decides an outcome, and never signals a process it has not just
verified by pid and start time (`signal_shim`).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import select
import signal
import threading
import time
from collections.abc import Callable

from subagents_node.actors.child.announces import AnnouncePipe, Unreported, disowned
from subagents_node.actors.child.procfs import (
    ProcessIdentity,
    identity_of,
    is_alive,
    is_alive_or_unknown,
)

log = logging.getLogger(__name__)


def signal_shim(identity: ProcessIdentity, signum: int = signal.SIGTERM) -> bool:
    """Signal the shim if `identity` still names it (a pidfd closes the pid-reuse window
    between the check and the signal). False when it is gone."""
    try:
        fd = os.pidfd_open(identity.pid)
    except OSError:
        return False
    try:
        if not is_alive(identity):
            return False
        signal.pidfd_send_signal(fd, signum)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def wait_exits(shims: list[ProcessIdentity], timeout: float) -> None:
    """Block until every shim in `shims` has exited, or `timeout` passed (pidfds, no polling)."""
    fds = []
    for identity in shims:
        try:
            fd = os.pidfd_open(identity.pid)
        except OSError:
            continue
        if is_alive(identity):
            fds.append(fd)
        else:
            os.close(fd)
    deadline = time.monotonic() + timeout
    # poll, not select: with the node's lifted descriptor limit a pidfd can be numbered past
    # select()'s FD_SETSIZE (1024), where select raises ValueError.
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(math.ceil(left * 1000)):
                poller.unregister(fd)
                fds.remove(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


#: How soon a shim whose pidfd could not be opened (no descriptor left) is tried again.
RETRY_OPEN_S = 1.0
#: How long orders wait on a template that announces nothing before it is looked at (a
#: healthy one forks a thousand in about a second, and only a stopped one is ended).
STALLED_S = 1.0


class ShimWatch:
    """One thread for every shim: `watch(key, identity)`, then `flush()` (once per batch: the
    supervisor's commit group); `on_gone(key)` runs on the thread when that shim exits (at
    once if it is already gone)."""

    #: Watches taken before the thread is woken anyway (a batch never waits long).
    WAKE_BATCH = 64

    def __init__(
        self, on_gone: Callable[[str], None], on_template_gone: Callable[[int], None] | None = None
    ) -> None:
        """`on_template_gone(pid)` runs on the thread when a template's announce pipe ends (the
        template, `pid` (0: unknown), is gone or exiting, and with it what continued its shims
        when a child stopped them)."""
        self._on_gone = on_gone
        self._on_template_gone = on_template_gone
        self._lock = threading.Lock()
        self._add: list[tuple[str, ProcessIdentity, bool]] = []
        #: Announce pipes (`listen`) and orders sent (`expect`) not yet handed to the thread;
        #: an order belongs to the newest pipe (its template's), named by its generation.
        self._listen: list[tuple[int, int, ProcessIdentity | None]] = []
        self._expect: list[tuple[int, str]] = []
        self._generation = 0
        #: The thread's own: per generation, its pipe state (`AnnouncePipe`); the live pipes by
        #: descriptor; the shims watched, so one announced and then reported is watched once.
        self._pipes: dict[int, AnnouncePipe] = {}
        self._pipe_fds: dict[int, AnnouncePipe] = {}
        self._watching: set[tuple[str, ProcessIdentity]] = set()
        self._unreported = Unreported()  # announced shims not yet watched from a report
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closed = False
        self._count = 0  # shims the thread holds a pidfd for (read under the lock)
        #: Shims alive but not watched yet: no descriptor was left to open their pidfd.
        self._retry: list[tuple[str, ProcessIdentity]] = []
        self._thread = threading.Thread(target=self._run, name="shim-watch", daemon=True)
        self._thread.start()

    def watch(self, key: str, identity: ProcessIdentity, reported: bool = True) -> None:
        """Watch `key`'s shim; `reported`: False for one known from its claim alone (it never
        reported), which is ended if it is found stopped (`_unstall`)."""
        with self._lock:
            if self._closed:
                return
            self._add.append((key, identity, reported))
            if len(self._add) >= self.WAKE_BATCH:
                os.write(self._wake_w, b"+")

    def listen(self, fd: int, template: int = 0) -> None:
        """A new shim template's announce pipe (its read end, now this watch's to close): each
        shim announces itself there before it starts its child, and is watched from then on;
        its end (EOF: the template and every shim it forked closed it) proves that an order
        sent to it and never announced forked no shim, so no child: that child is gone.
        `template`: its pid (0: unknown); a live process announced there that is not its child
        is ignored (a forged line)."""
        with self._lock:
            self._generation += 1
            if self._closed:
                os.close(fd)
                return
            found = identity_of(template) if template else None
            self._listen.append((self._generation, fd, found))

    def expect(self, key: str) -> None:
        """An order for `key` was written to the newest template: a shim is to announce it."""
        with self._lock:
            if not self._closed and self._generation:
                self._expect.append((self._generation, key))

    def flush(self) -> None:
        """Hand the watches taken since the last flush to the thread: one wake-up (a thread
        woken per shim cost the supervisor more than the watch itself)."""
        with self._lock:
            if (self._add or self._listen or self._expect) and not self._closed:
                os.write(self._wake_w, b"+")

    @property
    def watched(self) -> int:
        """Shims watched now or about to be (a shim leaves the table when it exits)."""
        with self._lock:
            return len(self._add) + self._count + len(self._retry)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        fds: dict[int, tuple[str, ProcessIdentity]] = {}
        try:
            while True:
                if self._retry:  # descriptors ran out: try those again, now and then
                    with self._lock:
                        again, self._retry = self._retry, []
                        for key, identity in again:
                            self._open(key, identity, poller, fds)
                        self._count = len(fds)
                waiting = poller.poll(self._poll_ms())
                self._unstall()
                for fd, _ in waiting:
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        if not self._take(poller, fds):
                            return
                        continue
                    if (pipe := self._pipe_of(fd)) is not None:
                        if not self._take(poller, fds):  # orders sent before its end
                            return
                        self._announced(pipe, poller, fds)
                        continue
                    poller.unregister(fd)
                    os.close(fd)
                    key, identity = fds.pop(fd)
                    self._watching.discard((key, identity))
                    self._unreported.drop(key, identity)
                    with self._lock:
                        self._count = len(fds)
                    self._gone(key)
        finally:
            for fd in fds:
                os.close(fd)
            for fd in self._pipe_fds:
                os.close(fd)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _poll_ms(self) -> int | None:
        """How long the thread may wait: for good, unless descriptors ran out or orders wait
        on a template's announcement (then until it is STALLED_S late)."""
        due = [p.progress_at + STALLED_S for p in self._pipe_fds.values() if p.waiting]
        if (unreported := self._unreported.due(STALLED_S)) is not None:
            due.append(unreported)
        if self._retry:
            due.append(time.monotonic() + RETRY_OPEN_S)
        if not due:
            return None
        return max(0, math.ceil((min(due) - time.monotonic()) * 1000))

    def _unstall(self) -> None:
        """End each template that orders waited STALLED_S on and that a child stopped
        (announces.py `stopped_template`): its pipe ends, and the orders it never forked end
        their children not-started (they waited for the next order, which replaces a stopped
        template, and with no next order for good)."""
        for pipe in self._pipe_fds.values():
            if (template := pipe.stopped_template(STALLED_S)) is not None:
                log.warning("the shim template (pid %d) is stopped; ending it", template.pid)
                signal_shim(template, signal.SIGKILL)  # pid and start time checked on a pidfd
        # A shim a child stopped before its first report (the launch waits for it, and a stop
        # signalled nobody): killed, its child is found as a dead shim's (keeper.shim_gone).
        for shim in self._unreported.stopped(STALLED_S):
            log.warning("the shim (pid %d) is stopped before its first report; ending it", shim.pid)
            signal_shim(shim, signal.SIGKILL)

    def _take(self, poller: select.poll, fds: dict[int, tuple[str, ProcessIdentity]]) -> bool:
        """Hand what was added since to the thread (False: the watch is closed)."""
        with self._lock:
            if self._closed:
                return False
            listens, self._listen = self._listen, []
            expects, self._expect = self._expect, []
            added, self._add = self._add, []
            for generation, fd, template in listens:
                self._pipes[generation] = self._pipe_fds[fd] = AnnouncePipe(fd, template)
                poller.register(fd, select.POLLIN)
            for generation, key in expects:
                pipe = self._pipes[generation]
                if pipe.expect(key):
                    self._gone(key)  # sent to a template that ended: no shim took it
            for key, identity, reported in added:  # in the lock: `watched` counts
                self._open(key, identity, poller, fds, unreported=not reported)  # each once
            self._count = len(fds)
        return True

    def _pipe_of(self, fd: int) -> AnnouncePipe | None:
        return self._pipe_fds.get(fd)

    def _announced(
        self, pipe: AnnouncePipe, poller: select.poll, fds: dict[int, tuple[str, ProcessIdentity]]
    ) -> None:
        """Read the announce pipe: watch each shim announced; at its end, every order it never
        announced forked no shim (and so no child): gone."""
        try:
            data = os.read(pipe.fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            for key, identity in pipe.lines(data):
                if identity is not None:
                    self._open(key, identity, poller, fds, pipe.template, unreported=True)
            with self._lock:
                self._count = len(fds)
            return
        poller.unregister(pipe.fd)
        del self._pipe_fds[pipe.fd]
        os.close(pipe.fd)
        for key in pipe.end():
            self._gone(key)
        if self._on_template_gone is not None:
            try:
                self._on_template_gone(0 if pipe.template is None else pipe.template.pid)
            except Exception:
                log.exception("shim watch: reporting a shim template gone failed")

    def _open(
        self,
        key: str,
        identity: ProcessIdentity,
        poller: select.poll,
        fds: dict[int, tuple[str, ProcessIdentity]],
        template: ProcessIdentity | None = None,
        unreported: bool = False,
    ) -> None:
        """Watch `identity` as `key`'s shim; `template`: the template that announced it (None:
        it reported itself, or unknown), whose child it must be while that template lives;
        `unreported`: it has not reported yet (announced, or known from its claim)."""
        if (key, identity) in self._watching:
            if not unreported:
                self._unreported.drop(key, identity)
            return  # watched already (announced, then reported)
        try:
            fd = os.pidfd_open(identity.pid)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                self._gone(key)
            else:  # EMFILE, ENFILE, ENOMEM: that says nothing of the shim, only of us
                log.warning("shim watch: cannot watch shim %s yet (%s); retrying", key, exc)
                self._retry.append((key, identity))
            return
        alive = is_alive_or_unknown(identity)  # opened first, checked second: no pid reuse
        if not alive:
            os.close(fd)
            if alive is None:
                self._retry.append((key, identity))
            else:
                self._gone(key)
            return
        if template is not None and disowned(identity, template):
            os.close(fd)
            log.warning("shim watch: ignored an announcement of pid %d for %s", identity.pid, key)
            return
        fds[fd] = (key, identity)
        self._watching.add((key, identity))
        if unreported:
            self._unreported.add(key, identity)
        poller.register(fd, select.POLLIN)

    def _gone(self, key: str) -> None:
        try:
            self._on_gone(key)
        except Exception:
            log.exception("shim watch: reporting shim %s gone failed", key)
