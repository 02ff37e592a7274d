"""`doctor`: checks a person can act on, each with ok / warn / fail and a fix.

Owns the list of checks and nothing else: the state dir (exists, trusted as `start` trusts it,
0700, writable, not full), the hard limit on open files (node/descriptors.py), the store and
what the run supervisor still owes the ledgers (runtime/cli/doctorstore.py), the keys dir
(each keypair file and the allow-list), the node (reachable, same version, how it contains
children, no stored record quarantined by its owner, no tcp listener that shed a flood in the
last hour: runtime/cli/tcpsheds.py), the configuration (valid; where each value came from)
and every agent file (parses; its command resolves). It also states how the ledgers count
(R-STS-2). It never changes anything.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from subagents_node.cli.common import plural
from subagents_node.cli.doctorstore import (
    FULL_BELOW_BYTES,
    Check,
    Level,
    check_outbox,
    check_store,
    free_bytes,
    read_only,
)
from subagents_node.cli.tcpsheds import shed_checks
from subagents_node.client.client import Client
from subagents_node.client.fleetrole import last_role, start_advice
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
from subagents_node.launch.envnames import unknown_warnings
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.node import ClusterStatus, ContainmentStatus, QuarantinedRecord
from subagents_node.node.descriptors import descriptor_warnings


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
    foreign = untrusted is not None and untrusted.details.get("reason") == "foreign"
    if mode != 0o700:
        yield Check(
            "state dir mode",
            "fail",
            f"{state_dir} has mode {mode:o}, not 700",
            # chmod 700 on a dir in use for other things (`/`, a home) locks others out of it
            "choose a new or empty directory" if foreign else f"chmod 700 {state_dir}",
        )
    else:
        yield Check("state dir mode", "ok", f"{state_dir} is 0700")
    if read_only(state_dir):
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
    free = free_bytes(state_dir)
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


def check_node(state_dir: Path, address: str | None, version: str) -> Iterator[Check]:
    try:
        endpoint = address or ipc_endpoint(state_dir)
        client = Client(ZmqTransport(endpoint), timeout=3.0)
    except SubagentsError as err:
        yield Check(
            "node",
            "fail",
            err.message,
            "choose a --state-dir that is short (at most 93 bytes) and printable",
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
            # A home's or a worker's dir is started in its role again (a plain start is refused).
            start_advice(endpoint)
            if last_role(state_dir)
            else "start one: subagents-node start --detach",
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
    if cluster.key_refused:
        return Check(
            "fleet",
            "fail",
            cluster.describe(),
            "the home refused this worker's key: its operator revoked it or allows it under "
            "another name (`subagents-node keys show` on the home); admissions fail closed "
            "until the key is allowed again (`keys allow --name NAME -- KEY` on the home), and "
            "the worker then heartbeats again by itself",
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
    unused = config.unused_state_dir()
    if unused:
        yield Check("config state_dir", "warn", unused, "remove the key, or pass --state-dir")
    for key, value, source in config.rows():
        if unused and key == "state_dir":
            continue
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


def check_keys(state_dir: Path) -> Iterator[Check]:
    """The keys dir, when there is one: each keypair file and the allow-list, read as a node
    (or a tcp client) reads them. A broken allow-list stops every start, ipc alone included,
    and a broken key file every tcp listener, while doctor said nothing of either."""
    from subagents_node.client.keys import (
        ALLOWED,
        CLIENT_KEY,
        SERVER_KEY,
        keys_dir,
        read_allowed,
        read_keypair,
    )

    directory = keys_dir(state_dir)
    if not directory.is_dir():
        return
    for name in (SERVER_KEY, CLIENT_KEY):
        if (directory / name).exists():
            try:
                read_keypair(directory / name)
            except SubagentsError as err:
                fix = str(err.details.get("fix") or "")
                yield Check(f"keys {name}", "fail", err.message, fix or _NEW_KEYS)
    try:
        allowed = read_allowed(directory / ALLOWED)
    except SubagentsError as err:
        yield Check(
            f"keys {ALLOWED}",
            "fail",
            err.message,
            f"mend or move aside {directory / ALLOWED} (with no node running), then allow the "
            "keys again with `subagents-node keys allow`",
        )
    else:
        yield Check("keys", "ok", f"{plural(len(allowed), 'client key')} allowed")


#: The fix for a key file that cannot be used: new keys, which tcp clients must then be given.
_NEW_KEYS = "stop the node, make new keys with `subagents-node keys generate --force`"


def run_checks(
    state_dir: Path, address: str | None, cwd: Path, agents_dirs: tuple[str, ...], version: str
) -> list[Check]:
    checks = [*check_state_dir(state_dir), *check_store(state_dir)]
    checks += [Check("open files", "warn", *warning) for warning in descriptor_warnings()]
    checks += check_outbox(state_dir, time.time())
    checks += check_keys(state_dir)
    checks += check_node(state_dir, address, version)
    try:
        config = load_config(cwd=cwd, log_warnings=False)
    except SubagentsError as err:
        checks.append(Check("config", "fail", err.message, "fix the value it names"))
    else:
        checks += check_config(config)
        agents_dirs = (*agents_dirs, *(str(d) for d in config.settings.agent_dirs))
    checks += check_environment(os.environ)
    checks += check_agents(cwd, agents_dirs)
    return checks


def check_environment(env: Mapping[str, str]) -> list[Check]:
    """A `SUBAGENTS_*` variable nothing reads: a typo of a setting's name, ignored."""
    fix = "correct its name (docs/configuration.md lists them) or unset it"
    return [Check("environment", "warn", warning, fix) for warning in unknown_warnings(env)]


_MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


def render(checks: list[Check]) -> list[str]:
    lines = []
    for check in checks:
        lines.append(f"[{_MARK[check.level]}] {check.name}: {check.detail}")
        if check.fix and check.level != "ok":
            lines.append(f"       fix: {check.fix}")
    return lines
