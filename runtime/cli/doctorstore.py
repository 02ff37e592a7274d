"""`doctor`'s checks of the disk and the store: the state dir's file system (full, read-only)
and each owner's database (every table family at the version this installation knows,
SQLite's integrity check), and what the run supervisor still owes the ledgers. Also the check
record every `doctor` check is (`Check`).

Reads each database without making a file (a database with no `-wal` as immutable: see
`_reading`), and never advises moving a ledger aside for what free space or a remount fixes.
It never changes anything.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from subagents_node.cli.common import plural
from subagents_node.client.fleetrole import last_role
from subagents_node.client.paths import DB_NAME, owner_db
from subagents_node.node import owners
from subagents_node.node.roles import REMOTE_OWNERS

Level = Literal["ok", "warn", "fail"]
#: Less room than this on the state dir's file system is a full disk: a commit of the node's
#: needs a few pages, a checkpoint more.
FULL_BELOW_BYTES = 1 << 20


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    detail: str
    fix: str = ""


def free_bytes(directory: Path) -> int | None:
    """The bytes this user may still write on `directory`'s file system, or None."""
    try:
        info = os.statvfs(directory)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def read_only(directory: Path) -> bool:
    """Whether `directory` is on a file system mounted read-only (EROFS for every write)."""
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_store(state_dir: Path) -> Iterator[Check]:
    """Each owner process's database (`capacity.db`, ..., `runs.db`); a version-1 `state.db`
    that no owner has imported yet is checked as it stands."""
    files = {name: owner_db(state_dir, name) for name in owners.NAMES}
    present = {name: path for name, path in files.items() if path.exists()}
    v1 = state_dir / DB_NAME
    if not present and not v1.exists():
        yield Check(
            "store", "warn", "no owner database exists yet", "they are created on first start"
        )
        return
    if not present:
        yield from _check_db("store", v1, owners.all_families())
        return
    for name, path in present.items():
        yield from _check_db(f"store {path.stem}", path, owners.families_of(name))
    # A worker's ledgers are its home's (DESIGN §1 "Multi-host"): their files are never here,
    # and "start the node once" was advice for a dir whose node had started many times.
    remote = REMOTE_OWNERS if last_role(state_dir) == "worker" else frozenset()
    for name, path in files.items():
        if name in remote and name not in present:
            yield Check(f"store {path.stem}", "ok", "kept on the home (a worker's state dir)")
        elif name not in present:
            yield Check(
                f"store {path.stem}", "warn", f"{path} does not exist yet", "start the node once"
            )


def _reading(path: Path) -> sqlite3.Connection:
    """A read-only connection to an owner's database that creates no file.

    A WAL database is opened read-only (`mode=ro`) only with its -wal and -shm, which SQLite
    makes when they are not there: on a read-only file system it cannot, on a full one it fails
    ("disk I/O error", read as a broken ledger), and anywhere else doctor, which changes
    nothing, left both behind. With no -wal (no node has it open: a clean stop folds it in) the
    file is all there is, so it is read as immutable; one with a -wal is read with the -shm its
    node made."""
    immutable = read_only(path.parent) or not Path(f"{path}-wal").exists()
    mode = "immutable=1" if immutable else "mode=ro"
    return sqlite3.connect(f"file:{path}?{mode}", uri=True, timeout=5)


def _check_db(check: str, path: Path, families: Mapping[str, Sequence[str]]) -> Iterator[Check]:
    expected = {name: len(scripts) for name, scripts in families.items()}
    on_read_only = read_only(path.parent)
    try:
        conn = _reading(path)
        try:
            integrity = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
            rows = conn.execute("SELECT family, version FROM schema_migrations").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        free = free_bytes(path.parent)
        # Never "move it aside" for what a remount or free space fixes: that empties a ledger
        # (fan-out claims are never refunded), for a file that is fine.
        if on_read_only:
            fix = "remount its file system read-write, then run doctor again"
        elif free is not None and free < FULL_BELOW_BYTES:
            fix = "free space on its file system (it is full), then run doctor again"
        else:
            fix = (
                f"move it aside (mv {path} {path}.broken) and restart the node; its ledger "
                "starts empty"
            )
        yield Check(check, "fail", f"{path} cannot be read: {exc}", fix)
        return
    if integrity != "ok":
        yield Check(
            f"{check} integrity",
            "fail",
            f"integrity check: {integrity[:200]}",
            f"stop the node, copy {path} for a post-mortem, then move it aside",
        )
    else:
        yield Check(f"{check} integrity", "ok", "PRAGMA integrity_check: ok")
    found = {str(r[0]): int(r[1]) for r in rows}
    for family, version in sorted(expected.items()):
        have = found.get(family)
        if have is None:
            yield Check(
                f"schema {family}", "warn", "not created yet", "start the node once to migrate"
            )
        elif have > version:
            yield Check(
                f"schema {family}",
                "fail",
                f"version {have} is newer than this installation ({version})",
                "upgrade subagents-node",
            )
        elif have < version:
            yield Check(
                f"schema {family}",
                "warn",
                f"version {have}, will migrate to {version}",
                "restart the node to migrate",
            )
        else:
            yield Check(f"schema {family}", "ok", f"version {have}")


#: An outbox row older than this is worth a warning: an owner that serves answers in
#: milliseconds, so this one has been away (restarting, failed, unreachable) for that long.
OUTBOX_STALE_S = 60.0
#: The run supervisor's outbox table (actors/runs/outbox.py; the CLI does not import actors).
OUTBOX = "run_outbox"


def check_outbox(state_dir: Path, now: float) -> Iterator[Check]:
    """What the run supervisor still owes the ledgers (`run_outbox`, actors/runs/outbox.py):
    run ends whose capacity report or session update their owner has not answered yet. They
    are resent until it does; until then the slots they free stay held."""
    path = owner_db(state_dir, owners.RUNS)
    if not path.exists():
        return
    try:
        conn = _reading(path)
        try:
            owed = conn.execute(
                f"SELECT target, COUNT(*), MIN(created_at), (SELECT last_error FROM {OUTBOX} o "
                f"WHERE o.target = r.target ORDER BY seq LIMIT 1) FROM {OUTBOX} r "
                "GROUP BY target ORDER BY target"
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return  # not migrated yet (no table), or unreadable: check_store says so
    if not owed:
        yield Check("outbox", "ok", "nothing owed to the ledgers")
    for target, count, oldest, error in owed:
        age = max(0.0, now - float(oldest))
        if age < OUTBOX_STALE_S:
            yield Check(f"outbox {target}", "ok", f"{plural(count, 'request')} being delivered")
            continue
        yield Check(
            f"outbox {target}",
            "warn",
            f"{plural(count, 'request')} owed to {target} for {age:.0f}s, resent until it answers "
            f"(last error: {error or 'none'}); the slots and counts they free stay held",
            f"check that owner {target} is running (`subagents-node status`, this doctor's "
            "owner lines); nothing else is needed: they go out as soon as it answers",
        )
