"""`doctor`: checks a person can act on, each with ok / warn / fail and a fix.

Owns the list of checks and nothing else: the state dir (exists, trusted as `start` trusts it,
0700, writable, not full), the hard limit on open files (node/descriptors.py), the store (every
table family at the version this installation knows, SQLite's integrity check), what the run
supervisor still owes the ledgers
(a warning once it is old), the node (reachable, same version, how it contains children, no
stored record quarantined by its owner, no tcp listener that shed a flood in the last hour:
runtime/cli/tcpsheds.py), the configuration (valid; where each value came from) and every
agent file (parses; its command resolves).
It also states how the ledgers count (R-STS-2). It never changes anything.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from subagents_node.cli.tcpsheds import shed_checks
from subagents_node.client.client import Client
from subagents_node.client.paths import (
    DB_NAME,
    OWNER_SOCKETS,
    ipc_endpoint,
    owner_db,
    untrusted_state_dir,
)
from subagents_node.client.transport import ZmqTransport
from subagents_node.launch.agents import Agent, discover_agents
from subagents_node.launch.config import Configuration, load_config
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.node import ClusterStatus, ContainmentStatus, QuarantinedRecord
from subagents_node.node import owners
from subagents_node.node.descriptors import descriptor_warnings

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


def check_state_dir(state_dir: Path) -> Iterator[Check]:
    if state_dir.is_symlink() and not state_dir.exists():  # `start` refuses it (paths.py)
        yield Check(
            "state dir",
            "fail",
            f"{state_dir} is a symlink to {os.readlink(state_dir)}, which does not exist",
            "create the symlink's target or choose another --state-dir",
        )
        return
    if not state_dir.exists():
        blocker = next((p for p in state_dir.parents if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            yield Check(
                "state dir",
                "fail",
                f"{state_dir} cannot be created: {blocker} is not a directory",
                "choose another --state-dir",
            )
            return
        yield Check(
            "state dir",
            "warn",
            f"{state_dir} does not exist yet",
            "it is created (mode 0700) by `subagents-node start`",
        )
        return
    if not state_dir.is_dir():
        yield Check(
            "state dir",
            "fail",
            f"{state_dir} is not a directory",
            "remove it or choose another --state-dir",
        )
        return
    untrusted = untrusted_state_dir(state_dir)
    if untrusted is not None and untrusted.details.get("reason") != "writable":  # mode: below
        yield Check("state dir trust", "fail", untrusted.message, str(untrusted.details["fix"]))
    mode = stat.S_IMODE(state_dir.stat().st_mode)
    if mode != 0o700:
        yield Check(
            "state dir mode",
            "fail",
            f"{state_dir} has mode {mode:o}, not 700",
            f"chmod 700 {state_dir}",
        )
    else:
        yield Check("state dir mode", "ok", f"{state_dir} is 0700")
    if _read_only(state_dir):
        yield Check(
            "state dir writable",
            "fail",
            f"{state_dir} is on a read-only file system",
            "remount that file system read-write (mount -o remount,rw MOUNTPOINT)",
        )
    elif os.access(state_dir, os.W_OK | os.X_OK):
        yield Check("state dir writable", "ok", "writable")
    else:
        yield Check(
            "state dir writable",
            "fail",
            f"{state_dir} is not writable",
            f"fix its ownership: chown $USER {state_dir}",
        )
    free = _free_bytes(state_dir)
    if free is not None and free < FULL_BELOW_BYTES:
        yield Check(
            "state dir space",
            "fail",
            f"the file system holding {state_dir} is full ({free:,} bytes free): the node's "
            "writes are refused (store_full) until space returns",
            "free space on that file system (`subagents-node prune` removes finished runs' "
            "directories); nothing else is needed, the node recovers by itself",
        )
    elif free is not None:
        yield Check("state dir space", "ok", f"{free / (1 << 20):,.0f} MiB free")


def _free_bytes(directory: Path) -> int | None:
    """The bytes this user may still write on `directory`'s file system, or None."""
    try:
        info = os.statvfs(directory)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def _read_only(directory: Path) -> bool:
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
    for name, path in files.items():
        if name not in present:
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
    immutable = _read_only(path.parent) or not Path(f"{path}-wal").exists()
    mode = "immutable=1" if immutable else "mode=ro"
    return sqlite3.connect(f"file:{path}?{mode}", uri=True, timeout=5)


def _check_db(check: str, path: Path, families: Mapping[str, Sequence[str]]) -> Iterator[Check]:
    expected = {name: len(scripts) for name, scripts in families.items()}
    read_only = _read_only(path.parent)
    try:
        conn = _reading(path)
        try:
            integrity = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
            rows = conn.execute("SELECT family, version FROM schema_migrations").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        free = _free_bytes(path.parent)
        # Never "move it aside" for what a remount or free space fixes: that empties a ledger
        # (fan-out claims are never refunded), for a file that is fine.
        if read_only:
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
            yield Check(f"outbox {target}", "ok", f"{count} request(s) being delivered")
            continue
        yield Check(
            f"outbox {target}",
            "warn",
            f"{count} request(s) owed to {target} for {age:.0f}s, resent until it answers "
            f"(last error: {error or 'none'}); the slots and counts they free stay held",
            f"check that owner {target} is running (`subagents-node status`, this doctor's "
            "owner lines); nothing else is needed: they go out as soon as it answers",
        )


def check_node(state_dir: Path, address: str | None, version: str) -> Iterator[Check]:
    try:
        endpoint = address or ipc_endpoint(state_dir)
        client = Client(ZmqTransport(endpoint), timeout=3.0)
    except SubagentsError as err:
        yield Check(
            "node",
            "fail",
            err.message,
            "choose a --state-dir whose socket path is short (under 107 bytes) and printable",
        )
        return
    try:
        pong = client.ping()
        status = client.status()
    except SubagentsError as err:
        yield Check(
            "node",
            "warn",
            f"not reachable at {endpoint}: {err.message}",
            "start one: subagents-node start --detach",
        )
        return
    finally:
        client.close()
    level: Level = "ok" if pong.version == version else "warn"
    yield Check(
        "node",
        level,
        f"{pong.node_id} pid {pong.pid} v{pong.version} at {endpoint}",
        "" if level == "ok" else "restart the node to run this version",
    )
    owners_now = status.actors
    yield check_containment(status.containment)
    if status.cluster is not None:
        yield check_fleet(status.cluster)
    for owner in owners_now:
        if owner.state == "running":
            yield Check(f"owner {owner.name}", "ok", f"running, pid {owner.pid}")
        else:
            yield Check(
                f"owner {owner.name}",
                "fail" if owner.state == "failed" else "warn",
                f"{owner.state} after {owner.restarts} restarts: {owner.reason[:300]}",
                "see node.log; restart the node (`subagents-node stop` then `start`) once "
                "the cause is fixed",
            )
    yield from check_quarantine(state_dir, [q for a in owners_now for q in a.quarantined])
    yield from (Check(*c) for c in shed_checks(status.tcp, time.time()))


def check_containment(containment: ContainmentStatus) -> Check:
    """How the node holds its children's trees: a cgroup v2 cgroup each (the tree's end is
    the cgroup's, a stop kills all it holds), or the shim's subreaper alone."""
    return Check("containment", "ok", containment.describe())


def check_fleet(cluster: ClusterStatus) -> Check:
    """Multi-host: a worker whose home is unreachable fails its admissions closed; one the
    home fenced refuses everything until it is started again with --join."""
    if cluster.role == "home" or cluster.state == "joined":
        return Check("fleet", "ok", cluster.describe())
    if cluster.state == "fenced":
        return Check(
            "fleet",
            "fail",
            cluster.describe(),
            "the home's operator forgot this worker; restart it with `subagents-node start "
            "--join ...` to join again",
        )
    return Check(
        "fleet",
        "warn",
        cluster.describe(),
        "admissions fail closed until the home answers again; check the network and the "
        "home node (`subagents-node nodes` on the home)",
    )


def check_quarantine(state_dir: Path, records: list[QuarantinedRecord]) -> Iterator[Check]:
    """DESIGN §2: a stored record its owner could not parse is failed closed (a slot counts as
    occupied, a budget, session or run is unavailable) until someone repairs it."""
    if not records:
        yield Check("quarantine", "ok", "every stored record parses")
        return
    for record in records:
        yield Check(
            f"quarantine {record.owner}",
            "fail",
            f"{record.table}[{record.key}] does not parse: {record.reason}; it counts as "
            "occupied/unavailable, every other record works",
            f"stop the node, repair or delete that row of {record.table} in "
            f"{_db_of(state_dir, record.owner)}, then start the node again",
        )


def _db_of(state_dir: Path, owner: str) -> Path:
    """The database file the owner keeps its records in."""
    return owner_db(state_dir, owner) if owner in OWNER_SOCKETS else state_dir / DB_NAME


def check_config(config: Configuration) -> Iterator[Check]:
    files = ", ".join(str(f) for f in config.files) or "no config file"
    yield Check("config", "ok", f"valid ({files})")
    for warning in config.warnings:
        yield Check("config", "warn", warning, "fix or unset the value")
    for key, value, source in config.rows():
        if source.kind != "default":  # where every value that is not a default came from
            yield Check(f"config {key}", "ok", f"{value} (from {source})")
    settings = config.settings
    cap = settings.max_active_async_runs_per_session
    origin = config.origins["max_active_async_runs_per_session"]
    yield Check(
        "capacity (R-STS-2)",
        "ok",
        f"usage limit {cap or 'unlimited'} per session (from {origin}); "
        "counts top-level background runs of a session only; foreground runs and workflow "
        "children are not charged; a slot is released only on process-terminal proof",
    )
    yield Check(
        "fan-out (R-STS-2)",
        "ok",
        f"{settings.max_subagent_spawns_per_run} launches per run tree (from "
        f"{config.origins['max_subagent_spawns_per_run']}); claims are never released",
    )


def agent_command_problem(agent: Agent) -> str | None:
    """Why the agent's command cannot start, or None.

    A bare name is looked up the way the child's launch resolves it (messages/delivery.py):
    on the agent's own `env: PATH` when it sets one, else on this process's PATH.
    """
    first = (
        agent.command[0].replace("{python}", sys.executable).replace("{agent_dir}", agent.agent_dir)
    )
    if "/" not in first:
        search = agent.env.get("PATH")
        if shutil.which(first, path=search):
            return None
        where = f"the agent's env PATH ({search})" if search is not None else "PATH"
        return f"{first!r} is not on {where}"
    path = Path(first) if Path(first).is_absolute() else Path(agent.agent_dir, first)
    if path.is_file() and os.access(path, os.X_OK):
        return None
    return f"no executable file at {path}"


def check_agents(cwd: Path, agents_dirs: tuple[str, ...]) -> Iterator[Check]:
    try:
        catalog = discover_agents(cwd, agents_dirs)
    except SubagentsError as err:
        yield Check("agents", "fail", err.message, "fix or remove the --agents-dir")
        return
    except OSError as exc:  # a directory name the system refuses (too long, not readable)
        yield Check("agents", "fail", f"{exc.strerror}", "fix or remove the --agents-dir")
        return
    for problem in catalog.problems:
        yield Check(
            "agent file", "fail", problem.message, "fix the front matter (see docs/agents.md)"
        )
    for name in catalog.names():
        agent = catalog.agents[name]
        missing = agent_command_problem(agent)
        if missing:
            yield Check(
                f"agent {name}",
                "fail",
                f"{agent.path}: {missing}",
                "install the command or fix `command:` in the front matter",
            )
        else:
            yield Check(f"agent {name}", "ok", f"{agent.path} ({agent.scope})")
    if not catalog.agents and not catalog.problems:
        yield Check(
            "agents",
            "warn",
            "no agent files found",
            "add one under ./.subagents/agents/ (see docs/agents.md)",
        )


def run_checks(
    state_dir: Path, address: str | None, cwd: Path, agents_dirs: tuple[str, ...], version: str
) -> list[Check]:
    checks = [*check_state_dir(state_dir), *check_store(state_dir)]
    checks += [Check("open files", "warn", *warning) for warning in descriptor_warnings()]
    checks += check_outbox(state_dir, time.time())
    checks += check_node(state_dir, address, version)
    try:
        config = load_config(cwd=cwd, log_warnings=False)
    except SubagentsError as err:
        checks.append(Check("config", "fail", err.message, "fix the value it names"))
    else:
        checks += check_config(config)
        agents_dirs = (*agents_dirs, *(str(d) for d in config.settings.agent_dirs))
    checks += check_agents(cwd, agents_dirs)
    return checks


_MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


def render(checks: list[Check]) -> list[str]:
    lines = []
    for check in checks:
        lines.append(f"[{_MARK[check.level]}] {check.name}: {check.detail}")
        if check.fix and check.level != "ok":
            lines.append(f"       fix: {check.fix}")
    return lines
