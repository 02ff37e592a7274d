"""The shim template: the small pre-imported process every child's shim is forked from.

Owns the template's life: it runs a shim's paths a few times (so the code a shim runs is warm
and shared), then reads one spawn order (a JSON line) at a time on stdin and forks a shim
(actors/child/shim.py) for each, until stdin closes (the supervisor that started it is gone;
the shims stay). Each fork's pid and start time go on its stdout, the announce pipe
(actors/child/shims.py), before the shim runs a line of its own. A fork that fails (EAGAIN:
the pids controller's or RLIMIT_NPROC's limit) is reported to the supervisor as the child's
`not_started`, as its shim would have, so the launch is answered and the slot rolled back; the
template lives on for the next order. A shim a child stopped is continued by the template's one
other thread (actors/child/shimstops.py).

Standard library, msgpack and the shim's modules only (what it imports, every shim holds); it
never logs an order (it may hold the task, R-MISC-1) and never decides a run's outcome. Its
soft limit on open files is the one the node lifted its own from, when it did (its argument):
every shim, and so every child, starts with that, as under a `Popen` from the node's shell.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import resource
import select
import signal
import sys
import time
from typing import Any

import msgpack

from subagents_node.actors.child import procfs, rebind
from subagents_node.actors.child.cgroup import template_directory
from subagents_node.actors.child.records import SHIM_RECORD, write_atomically
from subagents_node.actors.child.shim import Shim, _prctl, announce
from subagents_node.actors.child.shimstops import StoppedShims
from subagents_node.actors.child.zmtp import ReportLink

#: How often the template runs a shim's paths before it forks any (CPython 3.11 specialises a
#: function's bytecode after 8 calls).
WARM_UP_ROUNDS = 12
#: How long the template waits for the supervisor to take a `not_started` report of a shim it
#: could not fork (a node that is up answers at once; one that is not will find the child
#: unstarted at recovery).
NOT_FORKED_REPORT_S = 10.0
_PR_SET_DUMPABLE = 4
#: The fewest open files a shim is left (its report link, wake-up pipe, /proc reads, records).
MIN_SHIM_OPEN_FILES = 64


def _not_forked(order: dict[str, Any], err: OSError) -> None:
    """No shim for `order`: report its child `not_started`, from the template, and wait
    (bounded) for the supervisor to take it; otherwise the launch waited for it for good."""
    shim = Shim(order)
    announce(str(order["child_id"]), 0, 0.0)  # no shim: the supervisor expects none
    shim._not_started(f"cannot fork the child's shim: {err.strerror or err}", record=False)
    link = ReportLink(str(order["node_address"]))
    deadline = time.monotonic() + NOT_FORKED_REPORT_S
    try:
        while shim.reports.unacked and (left := deadline - time.monotonic()) > 0:
            shim.reports.send_due(link)
            poller = select.poll()
            if link.fileno() >= 0:
                poller.register(link.fileno(), select.POLLIN)
            due = shim.reports.next_send_at()
            wait = left if due is None else min(left, max(0.0, due - time.monotonic()))
            if poller.poll(math.ceil(wait * 1000)):
                shim.reports.receive(link)
    finally:
        link.close()


def _warm_up(rounds: int = WARM_UP_ROUNDS) -> None:
    """Run in the template, `rounds` times, what every shim runs (its set-up, a spawn, its
    records and reports, an answer), so that the objects those paths make on first use are
    made here and shared, and so that CPython has specialised their bytecode here (3.11 writes
    its counters and caches into the code objects until it has): a shim that runs warm code
    copies fewer of the template's pages."""
    record_dir = _warm_up_dir()
    order: dict[str, Any] = {
        "child_id": "warm-up",
        "run_id": "warm-up",
        "argv": ["true"],
        "cwd": "/",
        "env": {"PATH": os.defpath},
        # Files, as every child's logs are (a log must be a regular file: spawn.py), in the
        # warm-up's own directory, which goes with it.
        "stdout_path": os.path.join(record_dir, "warm-up.stdout.log"),
        "stderr_path": os.path.join(record_dir, "warm-up.stderr.log"),
        "record_dir": record_dir,
        "node_address": "ipc:///nonexistent/warm-up.sock",
        "sync": False,
    }
    _prctl()
    template_directory()
    try:
        for _ in range(rounds):
            shim = Shim(json.loads(json.dumps(order)))
            claim = {**shim.facts, "at": time.time(), "shim_version": rebind.SHIM_VERSION}
            write_atomically(shim._path(SHIM_RECORD), claim, exclusive=True, sync=False)
            os.unlink(shim._path(SHIM_RECORD))
            rebind.read_binding(record_dir)  # every shim looks for a rebind as it starts
            shim._start()  # spawns `true` and packs the `started` report
            os.waitpid(shim.leader, 0)
            shim.leader_gone = shim.tree_ended = True
            shim.facts.update(exit_code=0, ended_at=time.time(), tree_ended_at=time.time())
            shim._record_exit()
            shim._report("tree_ended")
            link = ReportLink(shim.order["node_address"])
            shim.reports.send_due(link)  # no listener: fails, and closes
            corr = shim.reports.unacked[0][0]
            msgpack.unpackb(msgpack.packb({"corr": corr, "body": {}}), raw=False)
            procfs.start_time_of(os.getpid())
            procfs.wall_clock(0.0)
    finally:
        _remove_warm_up_dir(record_dir)


def _warm_up_dir() -> str:
    """A new directory, the warm-up's own, under $TMPDIR or /tmp: a name nobody can foresee,
    made by this call. (It was `subagents-shim-warm-up.<pid>`, taken as found: a local user who
    planted that name as a link to a directory of their choosing had the template write its
    files there, then unlink every file in it, as the node's user: root's /etc, say.)"""
    base = os.environ.get("TMPDIR") or "/tmp"
    while True:
        path = os.path.join(base, f"subagents-shim-warm-up.{os.urandom(8).hex()}")
        try:
            os.mkdir(path, 0o700)  # fails on whatever is there, a link included
        except FileExistsError:
            continue  # one chance in 2**64 a round
        return path


def _remove_warm_up_dir(path: str) -> None:
    # Through a descriptor of the directory itself, never its name again: what is unlinked is
    # what is in the directory this template made, even were the name since moved elsewhere.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in os.listdir(fd):
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def serve_template(open_files: int | None = None) -> None:
    """The template: read one spawn order (a JSON line) at a time on stdin and fork a shim for
    each. Exits at EOF: the supervisor that started it is gone (the shims stay). `open_files`:
    the soft limit on open files its shims, and so their children, start with."""
    if open_files is not None:
        _limit_open_files(open_files)
    # Not dumpable (its shims inherit it; a child's exec resets it): /proc/PID/fd of the
    # template and of each shim is closed to a process without CAP_SYS_PTRACE, even of the
    # same user. Any child could open the template's pipes there: read other children's
    # orders (their tasks, environments), fork shims of its own, forge announcements.
    _prctl()(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    try:
        _warm_up()
    except OSError as err:
        # Warm code only saves each shim some copied pages: a template with no temporary
        # directory to warm up in (none, full, read-only) serves cold rather than not at all.
        print(f"shim template: no warm-up ({err}); shims start cold", file=sys.stderr, flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # shims are reaped by the kernel
    # A shim a child stopped (SIGSTOP to its parent) is continued (shimstops.py): stopped, it
    # reaped nothing and reported nothing, and the run of a child that then exited never ended.
    stops = StoppedShims()
    stops.start()
    # Everything imported so far is shared with every shim: keep the collector off those
    # pages (a collection would touch, and so copy, each of them in every shim).
    gc.freeze()
    stdin = os.fdopen(0, "rb", buffering=0)
    buffer = b""
    while chunk := stdin.read(1 << 16):
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            # The shim parses its own order: the template, whose every page each live shim
            # shares, then makes and frees no objects between forks (each page it wrote
            # was a copy, a page fault, while a shim shared it), and an order it cannot
            # read ends one shim, not the template.
            try:
                pid = os.fork()
            except OSError as err:  # EAGAIN: no process left (pids.max, RLIMIT_NPROC)
                # An order it cannot read names nobody to tell: the template serves on.
                with contextlib.suppress(Exception):
                    _not_forked(json.loads(line), err)
                continue
            if pid == 0:
                code = 1
                try:
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    gc.disable()  # a shim allocates little and lives long: no collections
                    code = Shim(json.loads(line)).run()
                finally:
                    os._exit(code)
            # The fork is announced here, not by the shim: a shim killed before it could say
            # so itself (a child killing every new process of the template, the OOM killer)
            # left its launch waiting for good. Gone already, its start is 0: seen gone.
            _announce_fork(line, pid)
            stops.forked()


#: How every order line starts (`order_of`: the child id is the spec's first field).
_ORDER_HEAD = b'{"child_id": "'


def _announce_fork(line: bytes, pid: int) -> None:
    """`announce` of the shim just forked for order `line`, made of bytes: the child id cut
    from the line and the start time from one read of /proc, with as few objects as it can
    (between forks every page the template writes is a copy, a page fault, while a live shim
    shares it: parsing the order and the stat record, and json, cost it ~0.25 ms a fork). An
    order of another shape is parsed."""
    head = len(_ORDER_HEAD)
    end = line.find(b'"', head) if line.startswith(_ORDER_HEAD) else -1
    if end < 0 or line.find(b"\\", head, end) >= 0:
        announce(_child_id_of(line), pid, procfs.start_time_of(pid) or 0.0)
        return
    with contextlib.suppress(OSError):
        os.write(1, b'["%b", %d, %b]\n' % (line[head:end], pid, _start_time(pid)))


def _start_time(pid: int) -> bytes:
    """`procfs.start_time_of(pid)` as JSON writes it (the float's repr; 0.0: gone)."""
    try:
        fd = os.open(b"/proc/%d/stat" % pid, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b"0.0"
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return b"0.0"
    finally:
        os.close(fd)
    fields = raw[raw.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # as start_time_of: a zombie or a dead process is gone
        return b"0.0"
    return repr(int(fields[19]) / procfs.CLK_TCK).encode()


def _child_id_of(line: bytes) -> str:
    """The child id of an order line of another shape than `order_of`'s."""
    try:
        return str(json.loads(line)["child_id"])
    except (ValueError, TypeError, KeyError):
        return ""  # no child id: an announcement of it names nobody the supervisor expects


def _limit_open_files(wanted: int) -> None:
    """Set the soft RLIMIT_NOFILE to `wanted` (the one the node lifted its own from: what the
    shell that started the node gives a process), within the hard limit, and never under
    MIN_SHIM_OPEN_FILES, which a shim itself needs."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = max(wanted, MIN_SHIM_OPEN_FILES)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


if __name__ == "__main__":
    serve_template(int(sys.argv[1]) if len(sys.argv) > 1 else None)
