"""The pid file (`node.pid`): which process serves a state dir.

Owns the record in the state dir that `stop`, `status` and every client read
(runtime/client/paths.py `read_pid_file`): refusing a second node for a state dir that a live
node serves (and clearing the socket a node killed with -9 left) or an extra ipc socket a live
process serves, writing this node's record
once it listens (a full disk is `StoreFull`, any other failure `StoreError`) and removing it
when the node stops. It never removes a record that is not this node's, and never starts,
signals or stops a process.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from contextlib import suppress
from pathlib import Path

from subagents_node.client.paths import (
    PID_NAME,
    ipc_endpoint,
    ipc_path,
    pid_record,
    process_create_time,
    read_pid_file,
)
from subagents_node.messages import statefiles
from subagents_node.messages.errors import (
    BadAddress,
    NodeAlreadyRunning,
    StoreError,
    StoreFull,
)


def pid_file_of(state_dir: Path) -> Path:
    return state_dir / PID_NAME


def refuse_if_serving(state_dir: Path, ours_too: bool = False) -> None:
    """Raise `NodeAlreadyRunning` when another live process's record says it serves
    `state_dir`, or a live node of this very process does (an embedded one: its socket takes
    connections, and its owners, which hold the state dir's claim, will not exit for a start to
    wait on). A record of this pid whose socket is closed may be left by a node of this process
    that failed to stop: a start passes it over (and waits for its owners), unless `ours_too`."""
    other = read_pid_file(state_dir)
    if other is None:
        return
    if other.get("pid") != os.getpid():
        raise NodeAlreadyRunning(
            f"a node (pid {other['pid']}) already serves {state_dir}; "
            "stop it with `subagents-node stop` or use another --state-dir",
            address=str(other.get("address", "")),
        )
    address = str(other.get("address", ""))
    path = ipc_path(address) if address else None
    if ours_too or (path is not None and _listening(path)):
        raise NodeAlreadyRunning(
            f"a node of this process (pid {other['pid']}) already serves {state_dir}; stop it "
            "(Node.stop(), or leave its `with Node.embedded()` block) before starting another",
            address=address,
        )


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False  # refused (nobody listens any more), or no such file
    return True


def recorded_pids(state_dir: Path) -> list[int]:
    """The node and owner pids the record names, live or not (what a start may wait for)."""
    # A regular file as the node writes it, or none: a FIFO there held a starting node in
    # open() for good.
    found = pid_record(state_dir)
    if found is None:
        return []
    try:
        owners = dict(found[0].get("owners") or {}).values()  # type: ignore[call-overload]
        pids = [int(str(found[0]["pid"])), *(int(str(p)) for p in owners)]
    except (ValueError, TypeError):
        return []
    return [pid for pid in pids if pid > 0 and pid != os.getpid()]


def refuse_if_running(state_dir: Path, ipc: bool) -> None:
    """Raise `NodeAlreadyRunning` when another live process serves `state_dir`; else remove the
    ipc socket a killed node left (nobody owns it, so it is safe to replace). Called with the
    state dir's claim held (runtime/node/claim.py): no other node can be binding it now."""
    refuse_if_serving(state_dir)
    if ipc:
        # A socket left by a node that was killed: nobody owns it, so it is safe to replace.
        sock = ipc_path(ipc_endpoint(state_dir))
        if sock is not None:
            try:
                sock.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # a directory there (or a file we may not remove)
                if exc.errno == errno.EROFS:  # unlink says so even when there is no socket
                    raise StoreError(
                        f"state dir {state_dir} is on a read-only file system; remount it "
                        "read-write (mount -o remount,rw MOUNTPOINT) or choose another "
                        "--state-dir",
                        path=str(state_dir),
                    ) from None
                raise StoreError(
                    f"cannot replace {sock}: {exc.strerror}; move it aside "
                    f"(mv {sock} {sock}.old) and start again",
                    path=str(sock),
                ) from None


def refuse_served_sockets(endpoints: list[str]) -> None:
    """Raise `BadAddress` when a process accepts connections on one of the `ipc://` endpoints
    (zmq would unlink its socket and take its clients); a socket nobody serves is a leftover
    that binding replaces."""
    for endpoint in endpoints:
        path = ipc_path(endpoint)
        if path is None or not path.is_socket() or not _listening(path):
            continue  # a leftover nobody listens on any more
        raise BadAddress(
            f"refusing to listen on {endpoint}: another process serves that socket",
            address=endpoint,
        )


def write_pid_file(
    state_dir: Path,
    node_id: str,
    address: str,
    endpoints: list[str],
    owner_pids: dict[str, int],
) -> None:
    """Write this process's record, whole (a temporary file replaced)."""
    created = process_create_time(os.getpid())
    assert created is not None  # this process is running
    record = {
        "pid": os.getpid(),
        # What readers compare exactly (read_pid_file): the same function computes both.
        "create_time": created,
        "node_id": node_id,
        "address": address,
        "endpoints": endpoints,
        "host": socket.gethostname(),
        "owners": owner_pids,
    }
    pid_file = pid_file_of(state_dir)
    try:
        # A fresh temp file (messages/statefiles.py): a fixed `node.tmp` that someone made a
        # symlink had the record written through it, over a file outside the state dir.
        statefiles.replace_file(pid_file, json.dumps(record).encode(), sync=False)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFull(
                f"the disk under {state_dir} is full: cannot write {PID_NAME}; "
                "free some space and start again",
                actor="node",
                reason=str(exc),
            ) from None
        raise StoreError(f"cannot write {pid_file}: {exc}", path=str(pid_file)) from None


def remove_pid_file(state_dir: Path, node_id: str) -> None:
    """Remove the record if it is node `node_id`'s (a later node's is left alone)."""
    record = read_pid_file(state_dir)
    if record is not None and record.get("node_id") == node_id:
        with suppress(FileNotFoundError):
            pid_file_of(state_dir).unlink()
