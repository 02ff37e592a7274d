"""One owner process: what runs in the child after the node forks it (DESIGN §1).

Owns the process's side of an owner: its process group (its own: a signal sent to its node's
group is not its) and its signals (TERM stops it cleanly, INT and HUP are the node's to handle,
the node's death kills it), its own database file (migrated here, imported once from a
version-1 `state.db`, set aside once every owner runs), its timers, its links to the other
owners, its log cap (the run supervisor's children's logs) and the control pipe on which it
tells the node `ready`, a crash it restarted from in place, the records it quarantined, or why
it could not start.

It inherits every owner's code from the node (runtime/node/ownersup.py) and imports only the
store, which the node never opens, once it is forked. It never returns into the node's code: the
forked child leaves with `os._exit`, so nothing the parent registered (atexit handlers,
pytest's machinery, the parent's zmq context) runs twice.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import logging
import os
import re
import signal
import sqlite3
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import zmq

from subagents_node.actors.child.logcap import ChildLogCap
from subagents_node.actors.context import ActorContext
from subagents_node.actors.links import DEFAULT_TIMEOUT_S, OwnerLinks
from subagents_node.actors.loop import OwnerLoop
from subagents_node.actors.peergate import PeerGate
from subagents_node.actors.records import Record, init_fields
from subagents_node.messages.node import QuarantinedRecord
from subagents_node.messages.peers import OwnerPeers
from subagents_node.node import owners
from subagents_node.node.claim import claim_name
from subagents_node.node.heap import release_free_pages
from subagents_node.node.inherited import close_inherited
from subagents_node.node.timers import Timers

log = logging.getLogger(__name__)

#: A child log's cap when the settings name none (config `child_log_max_bytes`).
DEFAULT_CHILD_LOG_MAX_BYTES = 64 << 20
_PR_SET_PDEATHSIG = 1
_CREATE_TABLE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)


class OwnerSpec(Record):
    """What the node tells a forked owner: which owner it is (runtime/node/owners.py), where it
    lives, with which settings."""

    __slots__ = (
        "claim",
        "endpoint",
        "faults",
        "initial_peers",
        "mailbox_limit",
        "max_frame",
        "owner",
        "peers",
        "remote",
        "server_secret",
        "settings",
        "state_dir",
        "stem",
        "synchronous",
        "tcp_endpoint",
    )
    #: The owner's name (`capacity`, ..., `supervisor`: runtime/node/owners.py).
    owner: str
    #: Its file stem: `<stem>.sock` and `<stem>.db` in the state dir.
    stem: str
    state_dir: Path
    endpoint: str
    #: Where each other owner listens (for cross-owner requests), by owner name.
    peers: Mapping[str, str]
    synchronous: str
    faults: bool
    max_frame: int
    mailbox_limit: int
    settings: Mapping[str, Any]
    #: A home's ledger owner: its own tcp endpoint (a CURVE server with the node's secret
    #: key, admitting the peers the node names in `owner.peers`); "" on any other node.
    tcp_endpoint: str
    server_secret: str
    #: Called in the forked owner: the node's latest `owner.peers` at the fork (None: none).
    initial_peers: Callable[[], OwnerPeers | None] | None
    #: The owners another host answers (a worker's home's ledgers): their replies are read
    #: as a client reads a node's, tolerating fields a newer home added (actors/links.py).
    remote: frozenset[str]
    #: The state dir's claim (runtime/node/claim.py), which the owner keeps open: named here,
    #: in the node, since naming it hashes the path, and a first hash in a forked owner pages
    #: OpenSSL's set-up code into it (0.7 MiB of RSS in every owner).
    claim: bytes

    def __init__(
        self,
        owner: str,
        stem: str,
        state_dir: Path,
        endpoint: str,
        peers: Mapping[str, str],
        synchronous: str = "NORMAL",
        faults: bool = False,
        max_frame: int = 0,
        mailbox_limit: int = 1024,
        settings: Mapping[str, Any] | None = None,
        tcp_endpoint: str = "",
        server_secret: str = "",
        initial_peers: Callable[[], OwnerPeers | None] | None = None,
        remote: frozenset[str] = frozenset(),
    ) -> None:
        init_fields(
            self,
            owner=owner,
            stem=stem,
            state_dir=state_dir,
            endpoint=endpoint,
            peers=peers,
            synchronous=synchronous,
            faults=faults,
            max_frame=max_frame,
            mailbox_limit=mailbox_limit,
            settings={} if settings is None else settings,
            tcp_endpoint=tcp_endpoint,
            server_secret=server_secret,
            initial_peers=initial_peers,
            remote=remote,
            claim=claim_name(state_dir),
        )

    def __repr__(self) -> str:
        shown = super().__repr__()  # the secret key never reaches a log line
        return shown.replace(repr(self.server_secret), "'***'") if self.server_secret else shown

    @property
    def name(self) -> str:
        return self.owner

    @property
    def db_path(self) -> Path:
        return self.state_dir / f"{self.stem}.db"


class _Control:
    """The owner's end of its control pipe: one JSON object per line (a lock keeps lines whole
    when they exceed the pipe's atomic size)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def say(self, kind: str, **fields: object) -> None:
        line = (json.dumps({"kind": kind, **fields}) + "\n").encode()
        with self._lock:
            view = memoryview(line)
            while view:
                try:
                    written = os.write(self._fd, view)
                except BrokenPipeError:
                    return  # the node is gone; PDEATHSIG ends us next
                view = view[written:]


def run_owner(spec: OwnerSpec, control_fd: int) -> None:
    """The forked child's whole life. Never returns: leaves with os._exit."""
    code = 0
    control = _Control(control_fd)
    try:
        _become_owner(spec)
        # Before anything of its own is opened: none of the node's connections, pidfds or
        # pipes lives on in this process (runtime/node/inherited.py).
        close_inherited(spec.claim, (control_fd,))
        _serve(spec, control)
    except BaseException as exc:
        code = 1
        with _suppress_all():
            control.say("failed", reason=f"{type(exc).__name__}: {exc}"[:2000])
            log.error("%s could not serve: %r\n%s", spec.name, exc, traceback.format_exc())
    finally:
        with _suppress_all():
            logging.shutdown()
        os._exit(code)


def _become_owner(spec: OwnerSpec) -> None:
    # A process group of its own: what is sent to the node's group is the node's command's to
    # handle, never its owners'. Ctrl-C and the hangup of a terminal go to its foreground group,
    # and `timeout N subagents-node run …` (a CI job's timeout) or a shell's `kill -TERM -PGID`
    # sends SIGTERM to the command's whole group: the owners of the node that command embeds
    # (or of a `start` in a terminal) were in it and ended at once, the foreground run's stop
    # then found no run supervisor ("supervisor ended with runs.stop in flight"), exit 1 not
    # 143. The node stops its owners itself, in order (TERM to each pid, ownersup.py), and an
    # owner dies with its node (the death signal below). Still blocked here: every signal
    # (forked from a node thread, runtime/node/signalmask.py), so one sent to the old group
    # before this call is pending, not taken.
    os.setpgid(0, 0)
    # INT and HUP: a shell passes a hangup on to every job it had, this group too. (The shim
    # template, started by the run supervisor, inherits these as ignored; a child starts with
    # every signal at its default.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Out of the terminal's foreground group, a write to it (a log line on the stderr of a
    # node embedded in a foreground command) would stop the owner under `stty tostop`.
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    signal.signal(signal.SIGTTIN, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    parent = int(spec.settings.get("node_pid", 0) or os.getppid())
    _drop_a_term_for_the_group(parent)
    # An owner, its threads and every process it starts begin with nothing blocked.
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    # Die with the node (SIGKILL: every acknowledged write is already committed).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the node died before the death signal was armed
        os._exit(1)
    # Nothing set in os.environ here: a launch without an environment gives its children the
    # node's own (Launch.env None), and an owner's internals are no part of it.


def _drop_a_term_for_the_group(node_pid: int) -> None:
    """A SIGTERM pending here (still blocked) came between the fork and `setpgid`: sent to the
    node's group, not to this owner, unless the node itself sent it (its stop began meanwhile).
    The node's stops the owner now, before it serves; any other is dropped."""
    if signal.SIGTERM not in signal.sigpending():
        return
    info = signal.sigtimedwait((signal.SIGTERM,), 0)
    if info is not None and info.si_pid == node_pid:
        os._exit(0)


def _serve(spec: OwnerSpec, control: _Control) -> None:
    # Imported here, not at the top: the store module is the node's, and only owners open it.
    from subagents_node.node.checkpointer import BACKSTOP_PAGES, WalCheckpointer
    from subagents_node.node.store import Store

    cls = owners.actor_class(spec.name)
    families = owners.families_of(spec.name)
    store = Store(spec.db_path, spec.synchronous)
    import_v1_state(spec, families, store)
    store.migrate(families)
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    timers = Timers()
    log_cap: ChildLogCap | None = None
    settings = spec.settings  # checked by the node as it composed the spec (ownerspecs.py)
    cap = settings.get("child_log_max_bytes", DEFAULT_CHILD_LOG_MAX_BYTES)
    if settings.get("caps_child_logs"):
        log_cap = ChildLogCap(cap if isinstance(cap, int) else DEFAULT_CHILD_LOG_MAX_BYTES)

    def endpoint_of(target: str) -> str:
        return spec.peers.get(target, spec.peers.get("node", ""))

    # The node setting `owner_call_timeout_s` (not a user config key: tests shorten it so a
    # request lost with a killed owner is retried in seconds, not after the default 15 s).
    timeout_s = float(settings.get("owner_call_timeout_s") or DEFAULT_TIMEOUT_S)
    links = OwnerLinks(
        zctx, spec.name, endpoint_of, timeout_s, other_host=spec.remote, peer_check_s=1.0
    )

    def report_crash(name: str, exc: BaseException) -> None:
        control.say("crash", reason=repr(exc)[:2000])

    def report_quarantine(name: str, records: Sequence[QuarantinedRecord]) -> None:
        control.say("quarantine", records=[r.model_dump(mode="json") for r in records])

    checkpointer = WalCheckpointer(store.connect, spec.name)
    ctx = ActorContext(
        open_db=functools.partial(store.connect, autocheckpoint=BACKSTOP_PAGES),
        report_crash=report_crash,
        report_quarantine=report_quarantine,
        schedule=timers.schedule,
        faults=spec.faults,
        settings=settings,
        dispatch=links.send,
        cap_log=log_cap.watch if log_cap is not None else None,
        cap_flush=log_cap.flush if log_cap is not None else None,
        on_commit=checkpointer.committed,
    )
    actor = cls(ctx)
    # What the node and this owner's start-up made (modules, schemas, the actor) lives as long
    # as the process: out of the collector's sight, a full collection walks only what the
    # requests made (and the pages shared with the node stay shared). A node starting from the
    # command line forks its owners with the collector off; from here on it runs.
    gc.freeze()
    gc.enable()
    gate = PeerGate(spec.server_secret) if spec.tcp_endpoint else None
    table = spec.initial_peers() if spec.initial_peers is not None else None
    if gate is not None and table is not None:
        gate.update(table)  # the fork's copy of the node's latest word: no refusal window
    loop = OwnerLoop(
        actor,
        zctx,
        spec.endpoint,
        links,
        spec.max_frame or 1 << 20,
        spec.mailbox_limit,
        gate=gate,
        tcp_endpoint=spec.tcp_endpoint,
        report_tcp=lambda budget, open_, sheds, last: control.say(
            "tcp", budget=budget, open=open_, sheds=sheds, last_shed=last
        ),
    )
    loop.bind()
    loop.stop_on_signal(signal.SIGTERM)
    try:
        loop.run(on_ready=functools.partial(_ready, control))
    finally:
        timers.stop()
        checkpointer.stop()
        if log_cap is not None:
            log_cap.stop()
        # Not `term()`: it waits for good for a socket left open (the loop closes its own,
        # but an owner that must end should end), and the node restarts an owner that ended.
        zctx.destroy(linger=0)


def _ready(control: _Control) -> None:
    # The start-up's garbage (imports, recovery's reads, migrations) is freed, its pages still
    # resident: returned before the owner idles (heap.py), then the node is told.
    release_free_pages()
    control.say("ready", pid=os.getpid())


def import_v1_state(spec: OwnerSpec, families: Mapping[str, Sequence[str]], store: Any) -> bool:
    """First start after version 1: copy this owner's tables out of the shared `state.db`.

    The copy is SQLite's online backup of the whole file, then every table that is not this
    owner's is dropped, so its rows, indexes and migration versions come across exactly. The
    old file is left in place for the other owners; the node renames it once all have started.
    """
    old = spec.state_dir / V1_DB_NAME
    if spec.db_path.exists() or not old.exists():
        return False
    mine = {
        m.group(1)
        for scripts in families.values()
        for s in scripts
        for m in _CREATE_TABLE.finditer(s)
    }
    tmp = spec.db_path.with_suffix(".importing")
    tmp.unlink(missing_ok=True)
    source = sqlite3.connect(f"file:{old}?mode=ro", uri=True)
    target = sqlite3.connect(tmp, isolation_level=None)
    try:
        source.backup(target)
        tables = [
            r[0]
            for r in target.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        target.execute("BEGIN")
        for table in tables:
            if table != "schema_migrations" and table not in mine:
                target.execute(f'DROP TABLE "{table}"')
        if "schema_migrations" in tables:
            names = list(families)
            marks = ",".join("?" * len(names))
            target.execute(f"DELETE FROM schema_migrations WHERE family NOT IN ({marks})", names)
        target.execute("COMMIT")
        target.execute("VACUUM")
    finally:
        source.close()
        target.close()
    tmp.replace(spec.db_path)
    log.info("%s: imported its tables from %s", spec.name, old)
    return True


def retire_v1_state(state_dir: Path, owner_states: Callable[[], Sequence[str]]) -> None:
    """Once every owner imported its tables from a version-1 `state.db` (all are running), keep
    the old file aside (`state.db.v1`) so it is never imported again. The owners' states are
    asked only when there is such a file: building them costs the node a MiB of pydantic's
    code pages at every start."""
    old = state_dir / V1_DB_NAME
    if not old.exists() or any(state != "running" for state in owner_states()):
        return
    for suffix in ("", "-wal", "-shm"):
        with suppress(FileNotFoundError):
            Path(f"{old}{suffix}").replace(Path(f"{old}.v1{suffix}"))


#: The version-1 database every owner shared (imported from once, then renamed).
V1_DB_NAME = "state.db"


class _suppress_all:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
