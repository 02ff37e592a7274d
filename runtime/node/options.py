"""NodeOptions: what a node is started with, and their defaults.

Owns the option fields only; they are checked by runtime/node/optioncheck.py before a Node
reads them, and documented field by field in docs/api.md (tests/test_docs.py holds the two
together). It must never act on them: it imports no server code but the containment probe's
type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from subagents_node.messages.codec import MAX_FRAME_BYTES

if TYPE_CHECKING:
    from subagents_node.node.containment import ContainmentProbe


@dataclass
class NodeOptions:
    state_dir: Path | None = None
    #: Extra endpoints besides the state dir's ipc socket (tcp://127.0.0.1:PORT, always CURVE).
    listen: Sequence[str] = ()
    ipc: bool = True
    mailbox_limit: int = 1024
    max_frame: int = MAX_FRAME_BYTES
    synchronous: str = "NORMAL"
    faults: bool = False
    restart_max: int = 3
    restart_window_s: float = 5.0
    settings: dict[str, object] = field(default_factory=dict)
    #: Multi-host: serve worker nodes (needs a tcp `listen`, which may then be any address).
    home: bool = False
    #: Multi-host: be a worker of the home at this tcp endpoint, as `name`, trusting `home_key`
    #: (the home's server public key), offering `client_key` (a key file; the state dir's
    #: by default), which the home must allow under `name`.
    join: str = ""
    home_key: str = ""
    name: str = ""
    client_key: str = ""
    #: A home's heartbeat interval and the silence after which a worker is `unreachable`.
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    #: How long a worker waits for the home to answer a forwarded request.
    remote_timeout_s: float = 5.0
    #: The containment probe, started early by whoever knows the state dir and setting first
    #: (`start`: before the node's code loads); `start()` probes itself without one, or
    #: another's.
    containment_probe: ContainmentProbe | None = None
    #: The soft limit on open files the node's children start with (None: the node's own). A
    #: node started by `start` lifts its own soft limit for its sockets and sets this to the one
    #: it lifted: a child gets what a `Popen` from the shell that started the node would give.
    child_open_files: int | None = None
    children_end_with_node: str = "never"  # Node.embedded() sets it: actors/runs/binding.py
