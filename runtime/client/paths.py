"""Where a node keeps its files and how its address is spelled.

Owns the state-directory rules (explicit argument, then $SUBAGENTS_STATE_DIR, then the XDG
state dir; always mode 0700) and the default endpoint `ipc://<state>/node.sock`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from subagents_node.messages.constants import ENV_STATE_DIR
from subagents_node.messages.errors import BadAddress

SOCKET_NAME = "node.sock"
PID_NAME = "node.pid"
DB_NAME = "state.db"
LOG_NAME = "node.log"
#: sun_path is 108 bytes on Linux, including the terminating NUL.
_IPC_PATH_MAX = 107


def default_state_dir() -> Path:
    explicit = os.environ.get(ENV_STATE_DIR, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME", "").strip() or str(Path.home() / ".local" / "state")
    return Path(base) / "subagents-node"


def resolve_state_dir(state_dir: str | os.PathLike[str] | None) -> Path:
    return Path(state_dir).expanduser() if state_dir else default_state_dir()


def ensure_state_dir(path: Path) -> Path:
    """Create the state dir with mode 0700, and tighten an existing one we own."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode != 0o700:
        path.chmod(0o700)
    return path.resolve()


def ipc_endpoint(state_dir: Path) -> str:
    sock = state_dir / SOCKET_NAME
    if len(str(sock)) > _IPC_PATH_MAX:
        raise BadAddress(
            f"socket path {sock} is longer than {_IPC_PATH_MAX} bytes; "
            f"choose a shorter state dir (--state-dir or ${ENV_STATE_DIR})",
            address=f"ipc://{sock}",
        )
    return f"ipc://{sock}"


def ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None


def check_endpoint(endpoint: str) -> str:
    """Accept `ipc://PATH` and `tcp://HOST:PORT`; anything else is a BadAddress."""
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return endpoint
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint[len("tcp://") :].rpartition(":")
        if sep and host and (port.isdigit() or port == "*"):
            return endpoint
    raise BadAddress(
        f"bad node address {endpoint!r}: expected ipc://PATH or tcp://HOST:PORT",
        address=endpoint,
    )


def is_loopback_tcp(endpoint: str) -> bool:
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def read_pid_file(state_dir: Path) -> dict[str, object] | None:
    """The live node serving `state_dir`, or None (a stale record of a dead process is None).

    A zombie is dead: after `kill -9` the process lingers until its reaper (often pid 1, which
    in a container may never reap) collects it, and that must not block a restart.
    """
    import psutil  # only here: a client that never reads the pid file does not pay for it

    try:
        record = json.loads((state_dir / PID_NAME).read_text())
        proc = psutil.Process(int(record["pid"]))
        if proc.create_time() != record["create_time"] or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return dict(record)
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None
