"""A node's role among hosts (DESIGN §1 "Multi-host"): alone, a home, or a worker of a home.

Owns the checks of a node's options before it starts anything: that it is a home or a worker,
not both; that a home has a tcp endpoint for its workers and a fixed port under which its
ledger owners' own ports fit; that a worker names its home's tcp endpoint, key and its own
name; and where the node listens (only a home listens on tcp beyond loopback; an extra ipc
path never replaces a file or the state dir's own sockets). Owns the table
of those owners and their port offsets, and the check that a state dir a home or a worker
served last is served in that role again (its address book says which). It never binds,
forks or connects: a failed check is a typed error (`ConfigError`, `BadAddress`) raised
before the node serves its state dir.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from subagents_node.client.fleetrole import last_book, last_role
from subagents_node.client.keys import check_name
from subagents_node.client.paths import (
    check_endpoint,
    ipc_endpoint,
    ipc_path,
    is_loopback_tcp,
)
from subagents_node.messages.errors import BadAddress, ConfigError
from subagents_node.messages.members import HOME_NAME

if TYPE_CHECKING:
    from subagents_node.node.options import NodeOptions

#: The owners whose state lives on the home node only (DESIGN §1): a worker forwards to them.
REMOTE_OWNERS = frozenset({"capacity", "fanout", "session"})
#: On a home, each of those owners listens on tcp itself, this far above the home's port.
HOME_OWNER_PORTS = {"capacity": 1, "fanout": 2, "session": 3}


def check_role(opts: NodeOptions) -> dict[str, str]:
    """Raise unless the options make one role; a home's ledger owners' own tcp endpoints
    (owner -> endpoint; none unless a home)."""
    owner_tcp: dict[str, str] = {}
    if opts.home and opts.join:
        raise ConfigError(
            "a node is a home or a worker, not both (--home and --join)",
            key="join",
            source="options",
            reason="role",
        )
    if opts.home and not any(e.startswith("tcp://") for e in opts.listen):
        raise ConfigError(
            "a home node needs a tcp endpoint for its workers: --listen tcp://HOST:PORT",
            key="listen",
            source="options",
            reason="home_needs_tcp",
        )
    if opts.home:
        owner_tcp = home_owner_endpoints(next(e for e in opts.listen if e.startswith("tcp://")))
    if opts.join:
        check_endpoint(opts.join)
        if not opts.join.startswith("tcp://"):
            raise BadAddress(
                f"--join takes the home's tcp endpoint, not {opts.join}", address=opts.join
            )
        missing = [
            flag for flag, v in (("--home-key", opts.home_key), ("--name", opts.name)) if not v
        ]
        if missing:
            raise ConfigError(
                f"a worker node needs {' and '.join(missing)} with --join",
                key="join",
                source="options",
                reason="worker_options",
            )
        check_name(opts.name)
        if opts.name == HOME_NAME:
            raise ConfigError(
                f"a worker cannot be named {HOME_NAME!r}: that is the home's name among "
                "its members",
                key="name",
                source="options",
                reason="worker_options",
            )
    return owner_tcp


def listen_endpoints(opts: NodeOptions, state_dir: Path) -> list[str]:
    """Where the node listens: the state dir's ipc socket (unless turned off), then `listen`,
    each once (the same endpoint from `SUBAGENTS_LISTEN` and `--listen`, or a flag given twice,
    failed the start with "Address already in use": the node's own second bind)."""
    endpoints = [ipc_endpoint(state_dir)] if opts.ipc else []
    for endpoint in dict.fromkeys(opts.listen):
        check_endpoint(endpoint)
        remote = endpoint.startswith("tcp://") and not is_loopback_tcp(endpoint)
        if remote and not opts.home:
            raise BadAddress(
                f"refusing to listen on {endpoint}: beyond loopback only a home node "
                "listens (start it with --home; every tcp link is CURVE)",
                address=endpoint,
            )
        _check_extra_ipc(endpoint, state_dir)
        endpoints.append(endpoint)
    if not endpoints:
        raise BadAddress("the node has no endpoint to listen on", address="")
    return endpoints


def _check_extra_ipc(endpoint: str, state_dir: Path) -> None:
    """zmq unlinks whatever is at an ipc path before it binds there: an extra ipc endpoint may
    name a fresh path or a socket, never a file (a `listen` from a cloned repository's
    subagents.toml would delete it), nor a socket of the node's own state dir."""
    path = ipc_path(endpoint)
    if path is None:
        return
    where = Path(os.path.abspath(path))
    if state_dir.resolve() in (where.parent.resolve() / where.name).parents:
        raise BadAddress(
            f"refusing to listen on {endpoint}: the sockets in the state dir are the node's own",
            address=endpoint,
        )
    try:
        mode = where.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BadAddress(
            f"refusing to listen on {endpoint}: {exc.strerror}", address=endpoint
        ) from None
    if not stat.S_ISSOCK(mode):
        raise BadAddress(
            f"refusing to listen on {endpoint}: {where} exists and is not a socket "
            "(binding there would delete it)",
            address=endpoint,
        )


def port_of(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


def home_owner_endpoints(listen: str) -> dict[str, str]:
    """Each home ledger owner's own tcp endpoint: the home's host, its port plus the owner's
    offset (a fixed port: workers and firewalls must know it)."""
    host, _, port_text = listen.removeprefix("tcp://").rpartition(":")
    port = int(port_text) if port_text.isdigit() else 0
    top = max(HOME_OWNER_PORTS.values())
    if not 0 < port <= 65535 - top:
        raise BadAddress(
            f"a home needs a fixed tcp port (1-{65535 - top}), not {listen}: its ledger "
            f"owners listen on the next {top} ports",
            address=listen,
        )
    return {name: f"tcp://{host}:{port + step}" for name, step in HOME_OWNER_PORTS.items()}


def refuse_taken_ports(owner_tcp: dict[str, str]) -> None:
    """A home's ledger owners bind their ports in their own processes, after the node said it
    started: one that cannot would only show as a `failed` owner. Refuse at once, in one line,
    a port another process holds (BadAddress)."""
    for name, endpoint in owner_tcp.items():
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as zmq binds
            try:
                probe.bind((host, int(port)))
            except OSError as err:
                raise BadAddress(
                    f"cannot listen on {endpoint} (the {name} owner's port: the home's port "
                    f"+ {HOME_OWNER_PORTS[name]}): {err.strerror or err}",
                    address=endpoint,
                ) from None


def refuse_role_change(opts: NodeOptions, state_dir: Path) -> None:
    """A state dir a home served last is served by a home again, one a worker served by a
    worker again. A node started there without the role (a plain `start`, or the node a
    foreground `run` starts when the one it followed went) used to take it over: on a home's
    dir, every worker was cut off while it ran; on a worker's, it adopted the worker's runs,
    found no capacity slot for them in its own empty ledger and stopped them, while the
    home kept their slots held."""
    role = last_role(state_dir)
    if role == "home" and not opts.home:
        raise ConfigError(
            f"{state_dir} was last served by a home node (its workers' ledgers are here): "
            "start it as a home again (`subagents-node start --home --listen tcp://HOST:PORT`, "
            "the port its workers join); a node in another role would leave every worker "
            "unreachable",
            key="home",
            source="state_dir",
            reason="fleet_role",
        )
    if role == "worker" and opts.join:
        _refuse_another_worker(opts, state_dir)
    if role == "worker" and not opts.join:
        raise ConfigError(
            f"{state_dir} was last served by a worker node (its runs' capacity slots are on "
            "its home): start it as that worker again (`subagents-node start --join "
            "tcp://HOME:PORT --home-key KEY --name NAME`); a node in another role would stop "
            "its runs, finding no slot for them",
            key="join",
            source="state_dir",
            reason="fleet_role",
        )


def _refuse_another_worker(opts: NodeOptions, state_dir: Path) -> None:
    """A worker's dir is served by that worker again, under its name (its home's key may
    change: a home may get a new key). Its runs' slots are held on the home under that name,
    so a start under another name used to find no slot for them and stop them, "lost while
    the node was down", while the home kept the old name's slots held for good."""
    last = last_book(state_dir).get("worker")
    if not isinstance(last, dict):
        return  # a book of an earlier release: nothing to hold the start to
    name = last.get("name")
    if not isinstance(name, str) or not name or name == opts.name:
        return
    raise ConfigError(
        f"{state_dir} was last served as worker {name!r}, not {opts.name!r}: its runs' "
        "capacity slots are held on its home "
        "under that name; start it as that worker again (to make it another worker, wait "
        "until its runs have ended, stop it and remove its addressbook.json first)",
        key="name",
        source="state_dir",
        reason="fleet_role",
    )
