"""What the node starts each owner process with (runtime/node/ownerproc.py `OwnerSpec`).

Owns the composition of an owner's spec from the node's options: its ipc socket in the state
dir, where every other owner (and the node) listens, the settings every owner shares (the runs
dir, the node's address and pid, the children's cgroup) and the ones that are one owner's (the
run supervisor caps its children's logs), and on a home the ledger owners' own tcp sockets with
the node's server key and their first table of peers. It never forks, binds or opens a
database: the specs are handed to the owner supervisor (runtime/node/ownersup.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from subagents_node.client.paths import OWNER_SOCKETS
from subagents_node.messages.peers import OwnerPeers
from subagents_node.node import owners
from subagents_node.node.curve import server_keypair
from subagents_node.node.ownerproc import OwnerSpec
from subagents_node.node.settingscheck import usable_settings

if TYPE_CHECKING:
    from subagents_node.node.options import NodeOptions

log = logging.getLogger(__name__)


def owner_endpoint(state_dir: Path, name: str) -> str:
    """Owner `name`'s ipc socket in the state dir."""
    return f"ipc://{state_dir / OWNER_SOCKETS[name]}"


def owner_specs(
    options: NodeOptions,
    state_dir: Path,
    node_address: str,
    cgroup_base: str,
    remote: Collection[str],
    owner_tcp: Mapping[str, str],
    current_peers: Callable[[], OwnerPeers | None],
) -> list[OwnerSpec]:
    """Each owner this node runs, in start order (not the `remote` ones: a worker's gateway
    forwards to its home's); `owner_tcp` are a home's ledger owners' own tcp endpoints."""
    peers = {name: owner_endpoint(state_dir, name) for name in OWNER_SOCKETS}
    peers["node"] = node_address
    # The node checked each setting as it was given (runtime/node/settingscheck.py); one changed
    # in `options.settings` since is dropped here for its default, never a crash in an owner.
    # (Checked here, once, rather than in each owner: validating there faults the validator's
    # code pages into every owner, about 0.9 MiB of resident memory each.)
    kept, dropped = usable_settings(options.settings)
    for line in dropped:
        log.error("owners: %s", line)
    settings = {
        **kept,
        # The node's own, after the program's: runtime/node/settingscheck.py refuses these
        # keys in a program's settings, and none may ever replace what the node knows.
        "runs_dir": str(state_dir / "runs"),
        "node_address": node_address,
        "runs_address": peers[owners.RUNS],
        "node_pid": os.getpid(),
        "cgroup_base": cgroup_base,
        "children_end_with_node": options.children_end_with_node,
        "child_open_files": options.child_open_files,
    }
    specs = []
    secret = server_keypair(state_dir).secret if owner_tcp else ""
    for name in owners.NAMES:
        if name in remote:
            continue  # the home's: this worker's gateway forwards to it
        own = {**settings, "caps_child_logs": name == owners.RUNS}
        tcp = owner_tcp.get(name, "")
        specs.append(
            OwnerSpec(
                owner=name,
                stem=OWNER_SOCKETS[name].removesuffix(".sock"),
                state_dir=state_dir,
                endpoint=peers[name],
                peers=peers,
                synchronous=options.synchronous,
                faults=options.faults,
                max_frame=options.max_frame,
                mailbox_limit=options.mailbox_limit,
                settings=own,
                tcp_endpoint=tcp,
                server_secret=secret if tcp else "",
                initial_peers=current_peers if tcp else None,
                remote=frozenset(remote),
            )
        )
    return specs
