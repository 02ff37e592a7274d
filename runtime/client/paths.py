"""Where a node keeps its files and how its address is spelled.

Owns the state-directory rules (explicit argument, then $SUBAGENTS_STATE_DIR, then the XDG
state dir; always mode 0700) and the default endpoint `ipc://<state>/node.sock`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from pathlib import Path

from subagents_node.client.exhaustion import descriptors_needed
from subagents_node.client.files import read_small_file
from subagents_node.messages.constants import ENV_STATE_DIR
from subagents_node.messages.errors import BadAddress, UnsafeStateDir

SOCKET_NAME = "node.sock"
#: Each owner process's socket in the state dir, by owner name (the address book's ipc part:
#: a local client derives it from the node's socket, DESIGN §1). Its database is `<stem>.db`.
OWNER_SOCKETS = {
    "capacity": "capacity.sock",
    "fanout": "fanout.sock",
    "session": "session.sock",
    "supervisor": "runs.sock",
}


def owner_db(state_dir: Path, owner: str) -> Path:
    """The database file of one owner process (`capacity.db`, ..., `runs.db`)."""
    return state_dir / (OWNER_SOCKETS[owner].removesuffix(".sock") + ".db")


#: The node's address book: where each owner listens, its pid and state (rewritten on change).
ADDRESS_BOOK_NAME = "addressbook.json"
PID_NAME = "node.pid"
DB_NAME = "state.db"
LOG_NAME = "node.log"
#: Far above the node's own pid record (its pid, start time, address and owners' pids).
_PID_RECORD_MAX_BYTES = 64 << 10
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
    """Create the state dir (mode 0700) or check an existing one; refuse one we cannot trust.

    DESIGN §3: whoever can write to the state dir can replace its socket, its databases and its
    key files, so a dir (or a parent created for it) owned by another user, or writable by the
    group or others, is refused with `UnsafeStateDir`, never silently repaired: its contents
    may already have been tampered with. Parents that already existed are checked the way ssh's
    StrictModes checks a home: owned by us or root, and writable by others only when sticky
    (`/tmp`). An existing dir of ours that is merely readable by others is tightened to 0700
    when it is empty or already a node's; one in use for other things is refused, unchanged.
    """
    path = path.expanduser().absolute()
    if path.is_symlink() and not path.exists():
        # mkdir cannot create a dir where a link names a missing one; say which, not ENOENT.
        raise UnsafeStateDir(
            f"state dir {path} is a symlink to {os.readlink(path)}, which does not exist; "
            "create that directory or choose another --state-dir",
            path=str(path),
            reason="dangling_symlink",
            fix="create the symlink's target or choose another --state-dir",
        )
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for parent in path.parents:
        if parent.exists():
            _check_trusted_parent(parent, path)
    for created in reversed(missing):
        try:
            created.mkdir(mode=0o700)
        except FileExistsError:
            pass  # created meanwhile: checked below like any existing dir
        except OSError as exc:
            raise UnsafeStateDir(
                f"cannot create state dir {created}: {exc.strerror or exc}",
                path=str(created),
                reason="create",
                fix="choose another --state-dir",
            ) from None
        _check_own_dir(created, path)
    _check_own_dir(path, path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode != 0o700:
        _check_not_foreign(path, mode)
        path.chmod(0o700)
    return path.resolve()


def untrusted_state_dir(path: Path) -> UnsafeStateDir | None:
    """Why `ensure_state_dir` would refuse the existing state dir `path` (its owner, a parent
    others could replace it through, its mode), or None; without creating or changing anything
    (what `doctor` reports)."""
    path = path.expanduser().absolute()
    try:
        for parent in path.parents:
            if parent.exists():
                _check_trusted_parent(parent, path)
        _check_own_dir(path, path)
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode != 0o700:
            _check_not_foreign(path, mode)
    except UnsafeStateDir as err:
        return err
    return None


#: Files only a node puts in its state dir: an existing dir holding one of them is a state dir.
_NODE_MARKERS = (
    "node.pid",
    "node.sock",
    "node.log",
    "addressbook.json",
    "state.db",
    *(name.removesuffix(".sock") + ".db" for name in OWNER_SOCKETS.values()),
)


def _check_not_foreign(directory: Path, mode: int) -> None:
    """Refuse to tighten a directory that is in use for something else.

    A state dir is made 0700. `--state-dir /`, `~` or a project's own directory (a slip, or
    a variable that names the wrong thing) used to be chmod'ed 0700 like an empty dir,
    locking every other user out of `/` (as root) or out of a shared tree, and the node's
    files were then scattered among its contents. Only an empty dir, or one that already
    holds a node's files, is a state dir to tighten; anything else is refused, unchanged.
    """
    try:
        with os.scandir(directory) as entries:
            first = next(entries, None)
    except OSError:
        return  # unreadable to us, its owner: chmod 700 is what makes it usable
    if first is None or any(os.path.lexists(directory / m) for m in _NODE_MARKERS):
        return
    example = repr(first.name)
    example = example if len(example) <= 60 else example[:60] + "..."
    raise UnsafeStateDir(
        f"refusing state dir {directory}: it is open to others (mode {mode:04o}) and holds "
        f"files that are not a node's (such as {example}); a state dir is made private (0700), "
        "which would lock others out of it: choose a new or empty directory",
        path=str(directory),
        reason="foreign",
        fix="choose a new or empty directory as --state-dir",
    )


def _check_own_dir(directory: Path, state_dir: Path) -> None:
    """The state dir itself, and every dir we created for it: ours, and writable only by us."""
    info = directory.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeStateDir(
            f"state dir {directory} is not a directory; choose another --state-dir",
            path=str(directory),
            reason="not_a_directory",
            fix="choose another --state-dir",
        )
    if info.st_uid != os.geteuid():
        raise UnsafeStateDir(
            f"refusing state dir {directory}: it is owned by uid {info.st_uid}, not by you "
            f"(uid {os.geteuid()}); remove it or choose another --state-dir",
            path=str(directory),
            reason="owner",
            fix="remove it or choose another --state-dir",
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStateDir(
            f"refusing state dir {directory}: it is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); fix with `chmod 700 {directory}` after "
            "checking its contents",
            path=str(directory),
            reason="writable",
            fix=f"chmod 700 {directory}",
        )


def _check_trusted_parent(parent: Path, state_dir: Path) -> None:
    info = parent.stat()
    if info.st_uid not in (0, os.geteuid()):
        raise UnsafeStateDir(
            f"refusing state dir {state_dir}: its parent {parent} is owned by uid "
            f"{info.st_uid}, who could replace it; choose a state dir under a directory you own",
            path=str(parent),
            reason="parent_owner",
            fix="choose a state dir under a directory you own",
        )
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not info.st_mode & stat.S_ISVTX:
        raise UnsafeStateDir(
            f"refusing state dir {state_dir}: its parent {parent} is writable by group or "
            f"others (mode {stat.S_IMODE(info.st_mode):04o}); fix with `chmod go-w {parent}`",
            path=str(parent),
            reason="parent_writable",
            fix=f"chmod go-w {parent}",
        )


def ipc_endpoint(state_dir: Path) -> str:
    """The state dir's node socket as an address every client accepts (see check_endpoint):
    a node must never serve at one that no command could then reach, ping or stop."""
    sock = state_dir / SOCKET_NAME
    if not str(sock).isprintable() or ";" in str(sock):
        shown = repr(str(state_dir))
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise BadAddress(
            f"state dir {shown} cannot hold the node's socket: its path must be printable "
            f"(no newline or undecodable byte) and have no ';'; choose another "
            f"(--state-dir or ${ENV_STATE_DIR})",
            address=f"ipc://{sock}"[:1000],
        )
    # Every socket of the state dir must fit, the longest name too (`capacity.sock`), in bytes:
    # a node.sock of 104-107 bytes passed, `start` said "node started", and the capacity,
    # fanout and session owners crash-looped on their own sockets' paths and stayed failed.
    longest = state_dir / max((SOCKET_NAME, *OWNER_SOCKETS.values()), key=len)
    if len(os.fsencode(longest)) > _IPC_PATH_MAX:
        raise BadAddress(
            f"socket path {longest} is longer than {_IPC_PATH_MAX} bytes; "
            f"choose a shorter state dir (--state-dir or ${ENV_STATE_DIR})",
            address=f"ipc://{sock}",
        )
    return f"ipc://{sock}"


def ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None


def check_endpoint(endpoint: str) -> str:
    """Accept exactly `ipc://PATH` or `tcp://HOST:PORT`; anything else is a BadAddress.

    DESIGN §3: zmq reads more than a scheme, a host and a port. `tcp://A;B` makes A a *source*
    address and B the one bound (so `tcp://127.0.0.1:0;0.0.0.0:7700` passes a "starts with
    127." test and listens on every interface), a host may be an interface name (`eth0`) or a
    wildcard (`*`), and a port may be `*` or `!`. Only a literal IP address (IPv6 in brackets)
    or `localhost`, and a decimal port in 1..65535, are accepted here; the check is the same
    for a flag, an environment variable and a config file, because they all come through it.
    """
    text = endpoint if isinstance(endpoint, str) else ""
    if text.startswith("ipc://"):
        path = text[len("ipc://") :]
        if not (path and path.isprintable() and ";" not in path):
            raise _bad_address(endpoint, "an ipc address is ipc://PATH (printable, no ';')")
        size = len(os.fsencode(path))
        if size > _IPC_PATH_MAX:  # no socket can have it: said here, not ENAMETOOLONG or ENOENT
            raise _bad_address(
                endpoint, f"an ipc socket path is at most {_IPC_PATH_MAX} bytes, not {size}"
            )
        return text
    if not text.startswith("tcp://"):
        raise _bad_address(endpoint, "expected ipc://PATH or tcp://HOST:PORT")
    host, sep, port = text[len("tcp://") :].rpartition(":")
    if not sep or not host or not port:
        raise _bad_address(endpoint, "expected ipc://PATH or tcp://HOST:PORT")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise _bad_address(endpoint, "the port must be a number from 1 to 65535")
    if _tcp_host(host) is None:
        raise _bad_address(
            endpoint,
            "the host must be an IP address (IPv6 in brackets) or localhost; "
            "no interface names, wildcards or source addresses (';')",
        )
    return text


def _tcp_host(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The literal address a tcp host names, or None (localhost is 127.0.0.1)."""
    if host == "localhost":
        return ipaddress.IPv4Address("127.0.0.1")
    if "%" in host:
        return None  # a scope id names an interface
    if host.startswith("[") and host.endswith("]"):
        try:
            return ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        return None


def _bad_address(endpoint: object, why: str) -> BadAddress:
    shown = repr(endpoint) if len(repr(endpoint)) <= 200 else repr(endpoint)[:200] + "..."
    return BadAddress(f"bad node address {shown}: {why}", address=str(endpoint)[:1000])


def is_loopback_tcp(endpoint: str) -> bool:
    """True for a tcp endpoint whose (strictly parsed) host is a loopback address."""
    try:
        check_endpoint(endpoint)
    except BadAddress:
        return False
    if not endpoint.startswith("tcp://"):
        return False
    address = _tcp_host(endpoint[len("tcp://") :].rpartition(":")[0])
    return address is not None and address.is_loopback


def pid_record(state_dir: Path) -> tuple[dict[str, object], bool] | None:
    """The node's pid record for `state_dir` as written, and whether the process it names is
    alive (the same process: its start time matches, so a reused pid is not it); None when
    there is no record that parses.

    A zombie is dead: after `kill -9` the process lingers until its reaper (often pid 1, which
    in a container may never reap) collects it, and that must not block a restart.
    """
    try:
        with descriptors_needed():  # not "no record": that would read as a dead node
            # A regular file only: a FIFO put there would block every reader for good.
            record = json.loads(read_small_file(state_dir / PID_NAME, _PID_RECORD_MAX_BYTES))
    except (OSError, ValueError):
        return None
    # As the node writes it, or no record: `1e400` is no pid, and a record with no address
    # would send `stop` looking for a node it cannot ask.
    if not isinstance(record, dict) or not isinstance(record.get("address"), str):
        return None
    pid, created = record.get("pid"), record.get("create_time")
    if type(pid) is not int or not isinstance(created, (int, float)) or isinstance(created, bool):
        return None
    return record, pid > 0 and created == process_create_time(pid)


def read_pid_file(state_dir: Path) -> dict[str, object] | None:
    """The live node serving `state_dir`, or None (a stale record of a dead process is None)."""
    found = pid_record(state_dir)
    return found[0] if found is not None and found[1] else None


def process_create_time(pid: int) -> float | None:
    """When the live process `pid` started, in seconds since the epoch, exactly as psutil's
    `create_time()` computes it (its start ticks over CLK_TCK, plus the boot's btime); None
    when it is gone or a zombie. The node writes its pid record's `create_time` with it and
    every reader compares with it, from /proc directly: psutil would cost every client that
    finds its node through the record 10-15 ms of imports."""
    try:
        with descriptors_needed():  # not "gone": a live node must never be taken for dead
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat_line = fh.read()
            with open("/proc/stat", "rb") as fh:
                btime = next(float(line.split()[1]) for line in fh if line.startswith(b"btime "))
    except (OSError, StopIteration, ValueError):
        return None
    fields = stat_line[stat_line.rindex(b")") + 2 :].split()  # the name may hold ") "
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19]) / os.sysconf("SC_CLK_TCK") + btime
