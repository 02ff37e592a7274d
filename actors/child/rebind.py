"""The rebind message: the one thing a run supervisor tells a live shim besides its stop.

Owns the message (its file, its signal, the shim version that takes it) and the shim's watch of
the process it is bound to (`watch`: a pidfd). A shim bound to a process (`ends_with`,
actors/runs/binding.py) ends its child's tree when that process dies. A node that adopts live
shims (a foreground command that took the state dir over) binds the runs that are now its own
to its process with this message (actors/runs/rebinding.py sends it):

    supervisor: write `bind.json` in the child's record directory ({"version": 1,
      "ends_with": [pid, start time]}, atomically), then REBIND_SIGNAL (SIGWINCH) to the shim,
      verified by pid and start time (actors/child/shims.py `signal_shim`)
    shim: at the signal, and once when it starts (a signal sent before its handler was set is
      not lost: the file was written first), reads the file and watches the process it names
      instead of the one it watched (a pidfd); that process gone already ends the tree at once

Versioning: a shim names in its claim (`shim.json`, `shim_version`) the messages it takes;
SHIM_VERSION 2 and later take this one. A shim forked before it (no `shim_version`: 1) is
never sent it (`shim_of` says which it is, for the supervisor to say so); SIGWINCH's default
disposition is to ignore it, so one sent anyway would change nothing. A file that does not
parse is ignored by the shim (it keeps its binding).

Standard library only (the shim template imports it: a shim costs a fork, not an interpreter).
It never decides who is bound to whom (actors/runs/binding.py does), never signals anything and
never unbinds a shim (a message names a process to end with, never none).
"""

from __future__ import annotations

import json
import os
import signal

from subagents_node.actors.child import procfs
from subagents_node.actors.child.procfs import ProcessIdentity
from subagents_node.actors.child.records import SHIM_RECORD, write_atomically
from subagents_node.messages import statefiles

#: What a shim forked from this code takes: 1 = its stop (SIGTERM) only; 2 = also a rebind.
SHIM_VERSION = 2
#: The process the child ends with now, written by the supervisor that rebinds the shim.
BIND_RECORD = "bind.json"
#: Sent after the file is written. Its default disposition is to ignore it: a shim too old to
#: handle it is not harmed, and nothing else sends it to a shim (it leads a session with no
#: terminal, so no window size ever changes under it).
REBIND_SIGNAL = signal.SIGWINCH


def _read(path: str) -> dict[str, object] | None:
    # os.open/os.read (statefiles), as procfs does: the io module's objects would copy
    # template pages. A FIFO or a symlink there is a file that does not parse: the supervisor
    # reads the claim on its loop, where a blocking open() wedged it.
    try:
        data = json.loads(statefiles.read_file(path, 65536))
    except (OSError, ValueError, RecursionError):  # a shim must not die of a bad file
        return None
    return data if isinstance(data, dict) else None


def read_binding(record_dir: str) -> list[float] | None:
    """The shim's side: [pid, start time] of the process `bind.json` binds the child to, or
    None when there is none (or it does not parse: the shim keeps the binding it has)."""
    path = os.path.join(record_dir, BIND_RECORD)
    # Every shim asks as it starts, and almost none has one: a failed access(2) raises
    # nothing (a failed open would make an exception object in each shim).
    data = _read(path) if os.access(path, os.F_OK) else None
    target = None if data is None else data.get("ends_with")
    if not isinstance(target, list) or len(target) != 2:
        return None
    pid, start = target
    if type(pid) is not int or pid < 1 or type(start) not in (int, float):  # not a bool
        return None
    return [pid, float(start)]


def shim_of(record_dir: str) -> tuple[ProcessIdentity, int] | None:
    """The supervisor's side: the shim that claimed the child (its identity) and the version
    of the messages it takes; None when no shim claimed it (or recovery gave it up)."""
    claim = _read(os.path.join(record_dir, SHIM_RECORD))
    if claim is None or claim.get("abandoned") or "shim_pid" not in claim:
        return None
    try:
        shim = ProcessIdentity(int(str(claim["shim_pid"])), float(str(claim["shim_start"])))
        version = int(str(claim.get("shim_version", 1)))
    except (KeyError, ValueError):
        return None
    return shim, version


def write_binding(record_dir: str, to: ProcessIdentity) -> None:
    """The supervisor's side, before the signal: the child ends with `to` from now on.
    Unsynced, like the claim: a power cut ends both the process it names and the shim."""
    body = {"version": 1, "ends_with": [to.pid, to.start_time]}
    write_atomically(os.path.join(record_dir, BIND_RECORD), body, sync=False)


def watch(ends_with: list[float] | None) -> tuple[int, bool]:
    """The shim's side: a pidfd of the process `ends_with` ([pid, start time]) names, readable
    once it is gone, and whether it is gone already. (-1, False) when there is none to watch,
    or no pidfd here (a kernel before 5.3: the child outlives its node, as before)."""
    if not ends_with:
        return -1, False
    pid, start = int(ends_with[0]), float(ends_with[1])
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return -1, True
    except OSError:
        return -1, False
    if procfs.start_time_of(pid) != start:  # a zombie, or its pid taken by another process
        os.close(fd)
        return -1, True
    return fd, False
