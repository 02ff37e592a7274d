"""Several hosts on one machine for multi-host tests: one network namespace per host, one hub.

What it owns: every network namespace, veth pair and bridge a fabric makes, and every process
started inside one of its namespaces (through `Fabric.popen` / `Fabric.run`, and whatever those
start in turn). Teardown kills those processes (SIGTERM, a bounded grace, then SIGKILL to every
pid still in a fabric namespace) and deletes the namespaces, also when the test failed; the next
fabric first removes the leftovers of runs whose process died before its teardown ran.

What it must never do: add anything (a link, an address, a route, a rule) to the root network
namespace; give a fabric a way out (no uplink, no NAT: packets exist only inside its namespaces
and on their loopbacks); touch a namespace whose name it did not make (only `sa-<pid>-<n>...`
names of a dead `<pid>` are cleaned); run a command without a timeout; sleep blindly.

Layout of one fabric, id `sa-<pid>-<n>` (pid of the test process, n a counter in it)
    namespace `sa-<pid>-<n>`          the hub: `br0` (a bridge, STP off) with one port per host,
                                      `port<i>`; it has no address, it only switches frames
    namespace `sa-<pid>-<n>-<name>`   host i: `lo` up and `hub0`, the veth peer of `port<i>`,
                                      with 198.18.N.(i+1)/24
Both ends of each veth are created directly inside their namespaces, so no link ever exists in
the root namespace, not even for a moment, and interface names only need to be unique inside
one namespace (`hub0`, `port<i>`: far below Linux's 15-character limit whatever the host names).

Addresses: a /24 from 198.18.0.0/15, the range RFC 2544 reserves for benchmarking network
devices (never routed on the internet), with N random per fabric among the /24s that overlap no
address and no route (other than the default route) of the root namespace. The check keeps a
probe from the root namespace (see the tests) from ever matching a real link; N random makes an
address in a log name one fabric when several exist at once. Isolation does not depend on it:
each fabric has its own hub, so two fabrics could even share a subnet without meeting.

Mounts: `ip netns exec` already runs its command in a fresh mount namespace (to remount /sys).
With `binds={target: source}` the command runs under `unshare --mount --propagation slave` and
bind-mounts each source directory over its target first, so hosts can see different directories
at one path (a default state dir, say) while the test reads the real ones. Slave, as `ip netns
exec` itself does: mounts made inside never reach the root namespace, while mounts and unmounts
made there still reach inside. Both targets and sources must already exist.

Use
    with hosts(["home", "worker"]) as fabric:
        home = fabric.popen("home", argv, stdout=subprocess.PIPE)   # a Popen, killed at exit
        fabric.run("worker", argv_using(fabric.address("home")), timeout=5)   # completed
        fabric.link_down("worker")      # partition it from the hub; link_up ends the partition
In pytest, call `skip_unless_netns()` first (the `netns_hosts` fixture in tests/conftest.py
does): it skips, with the reason, when not root, when `ip` is missing, or when a namespace
cannot be made here (an unprivileged container). The module imports only the standard library
(pytest only inside `skip_unless_netns`), so bench/ code can use it too.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Fabric",
    "FabricError",
    "clean_leftovers",
    "hosts",
    "skip_unless_netns",
    "unavailable_reason",
]

#: Every fabric namespace is named `sa-<pid>-<n>` (the hub) or `sa-<pid>-<n>-<host>`.
_NAME = re.compile(r"^sa-(?P<pid>\d+)-(?P<n>\d+)(?:-[a-z][a-z0-9_]*)?$")
_HOST_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_RANGE = ipaddress.ip_network("198.18.0.0/15")
_HOST_LINK = "hub0"
_BRIDGE = "br0"
#: Bounds: one `ip` call, a command run in a host, the grace before SIGKILL, waiting for death.
IP_TIMEOUT_S = 10.0
RUN_TIMEOUT_S = 10.0
TERM_GRACE_S = 2.0
KILL_WAIT_S = 5.0
#: Run as `sh -c SCRIPT sh SRC DST ... -- ARGV`: bind each SRC over its DST (recursively: a
#: SRC with a directory bound into it shows it there too), then exec ARGV.
_BIND_SCRIPT = (
    'while [ "$1" != -- ]; do mount --rbind -- "$1" "$2" || exit 125; shift 2; done; '
    'shift; exec "$@"'
)
_counter = itertools.count()


class FabricError(RuntimeError):
    """An `ip` command failed (its argv and stderr are in the message) or a name is unknown."""


def _ip_binary() -> str | None:
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None
    )


def _ip(*args: str, batch: Sequence[str] = ()) -> str:
    """Run `ip ARGS` (with `-batch -` fed from `batch` when given); its stdout, or FabricError."""
    binary = _ip_binary()
    if binary is None:
        raise FabricError("no `ip` binary (iproute2)")
    argv = [binary, *args, *(["-batch", "-"] if batch else [])]
    try:
        done = subprocess.run(
            argv,
            input="".join(line + "\n" for line in batch),
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise FabricError(f"{' '.join(argv)}: no answer in {IP_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        detail = "; ".join(done.stderr.split("\n")).strip("; ") or f"status {done.returncode}"
        fed = f" <<< {list(batch)}" if batch else ""
        raise FabricError(f"{' '.join(argv)}{fed}: {detail}")
    return done.stdout


def _namespaces() -> list[str]:
    """`ip netns list`: one `NAME` or `NAME (id: N)` per line."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _pids_in(namespace: str) -> list[int]:
    with contextlib.suppress(FabricError):  # already gone
        return [int(p) for p in _ip("netns", "pids", namespace).split()]
    return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait (on pidfds, no polling) until every pid has exited; the pids still running after."""
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    deadline = time.monotonic() + timeout
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(fds), [], [], left)
            for fd in ready:
                os.close(fd)
                del fds[fd]
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def _delete_namespaces(names: Sequence[str]) -> None:
    """SIGKILL every process inside each namespace, wait for them, then delete the namespaces.

    Listed again after each round, until none is left or KILL_WAIT_S has passed: a process can
    start another between the listing and the kill (a supervisor restarting its child)."""
    deadline = time.monotonic() + KILL_WAIT_S
    survivors: list[int] = []
    while pids := [pid for name in names for pid in _pids_in(name)]:
        if time.monotonic() >= deadline:
            survivors = pids
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids, deadline - time.monotonic())
    # Two fabrics starting at once (xdist workers) may both clean one leftover: a delete that
    # fails because the other got there first is no failure.
    try:
        _ip("-force", batch=[f"netns delete {name}" for name in names])
    except FabricError:
        if still := set(names) & set(_namespaces()):
            raise FabricError(f"could not delete namespaces {sorted(still)}") from None
    if survivors:
        raise FabricError(f"pids {survivors} in {list(names)} survived SIGKILL")


def clean_leftovers() -> list[str]:
    """Delete the fabric namespaces of test processes that died before their teardown ran.

    Only names of the form `sa-<pid>-<n>...` whose pid no longer exists are touched (a reused
    pid keeps its leftover until that process is gone too). Returns the names deleted.
    """
    stale = [
        name
        for name in _namespaces()
        if (match := _NAME.match(name)) and not _pid_alive(int(match["pid"]))
    ]
    if stale:
        _delete_namespaces(stale)
    return stale


def _root_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address in or a route to (not `default`)."""
    found: list[ipaddress.IPv4Network] = []
    for link in json.loads(_ip("-j", "-4", "addr", "show") or "[]"):
        for info in link.get("addr_info", []):
            net = ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
            found.append(ipaddress.IPv4Network(net))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = str(route.get("dst", "default"))
        if dst != "default":
            found.append(ipaddress.IPv4Network(dst, strict=False))
    return found


def _free_subnet() -> ipaddress.IPv4Network:
    taken = _root_networks()
    candidates = [
        net
        for net in ipaddress.IPv4Network(_RANGE).subnets(new_prefix=24)
        if not any(net.overlaps(other) for other in taken)
    ]
    if not candidates:
        raise FabricError(f"every /24 of {_RANGE} overlaps a root-namespace address or route")
    return random.choice(candidates)


@dataclass
class Fabric:
    """The hosts of one `hosts(...)` block: their addresses, commands run inside, partitions."""

    fabric_id: str
    names: tuple[str, ...]
    subnet: ipaddress.IPv4Network
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    @property
    def hub(self) -> str:
        """The hub's namespace name (the bridge lives there)."""
        return self.fabric_id

    def namespace(self, name: str) -> str:
        """The network namespace of host `name` (for `ip netns exec` or `nsenter --net`)."""
        self._index(name)
        return f"{self.fabric_id}-{name}"

    def address(self, name: str) -> str:
        """Host `name`'s IPv4 address on the hub; it exists nowhere else."""
        return str(self.subnet.network_address + self._index(name) + 1)

    def popen(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        binds: Mapping[str | Path, str | Path] | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start `argv` inside host `name`; the Popen's pid is the command's own (ip execs it).

        `env` replaces the environment (None: inherit ours); `binds` maps a path as the command
        sees it to the directory it really is (see the module docstring); other keyword
        arguments go to `subprocess.Popen` (stdin defaults to /dev/null). Still running at
        teardown, the process is killed.
        """
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(self._command(name, argv, binds), env=env, **kwargs)
        self._procs.append(proc)
        return proc

    def run(
        self,
        name: str,
        argv: Sequence[str],
        *,
        timeout: float = RUN_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        binds: Mapping[str | Path, str | Path] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside host `name` to completion (killed after `timeout`, which raises
        subprocess.TimeoutExpired); its exit status and output as text, never checked."""
        return subprocess.run(
            self._command(name, argv, binds),
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def link_down(self, name: str) -> None:
        """Partition host `name`: its link to the hub goes down inside its namespace.

        It loses its route to the subnet (its own connects fail at once with ENETUNREACH); the
        others' packets to it are dropped at the hub (their connects time out, or fail with
        EHOSTUNREACH once ARP gives up); established connections stall, they are not reset.
        """
        _ip("-n", self.namespace(name), "link", "set", _HOST_LINK, "down")

    def link_up(self, name: str) -> None:
        """Join host `name` to the hub again (usable at once: the bridge runs no STP delay)."""
        _ip("-n", self.namespace(name), "link", "set", _HOST_LINK, "up")

    def prefix(
        self, name: str, binds: Mapping[str | Path, str | Path] | None = None
    ) -> tuple[str, ...]:
        """The command prefix that runs what follows it inside host `name` (with `binds`), for
        callers that start processes themselves (a node's `start --detach`)."""
        return tuple(self._command(name, [], binds))

    def _index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise FabricError(f"no host {name!r} in this fabric (have {self.names})") from None

    def _command(
        self, name: str, argv: Sequence[str], binds: Mapping[str | Path, str | Path] | None
    ) -> list[str]:
        binary = _ip_binary()
        if binary is None:
            raise FabricError("no `ip` binary (iproute2)")
        prefix = [binary, "netns", "exec", self.namespace(name)]
        if not binds:
            return [*prefix, *argv]
        unshare = shutil.which("unshare")
        if unshare is None:
            raise FabricError("binds need `unshare` (util-linux)")
        pairs: list[str] = []
        for target, source in binds.items():
            for path in (target, source):
                if not Path(path).is_dir():
                    raise FabricError(f"bind {source} -> {target}: {path} is not a directory")
            pairs += [str(source), str(target)]
        return [
            *prefix,
            *(unshare, "--mount", "--propagation", "slave", "--"),
            *("sh", "-c", _BIND_SCRIPT, "sh", *pairs, "--", *argv),
        ]

    def _build(self) -> None:
        hub = self.hub
        _ip(
            batch=[
                f"netns add {hub}",
                *(f"netns add {self.namespace(n)}" for n in self.names),
                *(
                    f"link add {_HOST_LINK} netns {self.namespace(n)} type veth"
                    f" peer name port{i} netns {hub}"
                    for i, n in enumerate(self.names)
                ),
            ]
        )
        ports = [f"port{i}" for i in range(len(self.names))]
        _ip(
            "-n",
            hub,
            batch=[
                "link set lo up",
                f"link add {_BRIDGE} type bridge stp_state 0 forward_delay 0",
                f"link set {_BRIDGE} up",
                *(f"link set {port} master {_BRIDGE}" for port in ports),
                *(f"link set {port} up" for port in ports),
            ],
        )
        for name in self.names:
            _ip(
                "-n",
                self.namespace(name),
                batch=[
                    "link set lo up",
                    f"addr add {self.address(name)}/{self.subnet.prefixlen} dev {_HOST_LINK}",
                    f"link set {_HOST_LINK} up",
                ],
            )

    def _teardown(self) -> None:
        """Stop what we started (SIGTERM, grace, SIGKILL), then every namespace and its links."""
        live = [proc for proc in self._procs if proc.poll() is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        _wait_gone([proc.pid for proc in live], TERM_GRACE_S)
        try:
            _delete_namespaces([self.hub, *(self.namespace(n) for n in self.names)])
        finally:
            for proc in self._procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait(KILL_WAIT_S)
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()


@contextlib.contextmanager
def hosts(names: Sequence[str]) -> Iterator[Fabric]:
    """A fabric with one host per name, all joined by one hub, for the duration of the block.

    Host names are lower-case letters, digits and '_', starting with a letter (at most 254).
    Leftovers of dead earlier runs are cleaned first; at exit (also on an exception) every
    process inside is killed and every namespace deleted.
    """
    bad = [n for n in names if not _HOST_NAME.match(n)]
    if bad or len(set(names)) != len(names) or not 0 < len(names) < 255:
        raise FabricError(f"host names must be 1-254 distinct [a-z][a-z0-9_]*; got {names}")
    clean_leftovers()
    fabric = Fabric(f"sa-{os.getpid()}-{next(_counter)}", tuple(names), _free_subnet())
    try:
        fabric._build()
        yield fabric
    finally:
        fabric._teardown()


@functools.cache
def unavailable_reason() -> str | None:
    """Why fabrics cannot be made here (None when they can): not root, no `ip`, or the error
    from making a trial namespace and veth pair (which are removed again)."""
    if os.geteuid() != 0:
        return f"network namespaces need root (euid is {os.geteuid()})"
    if _ip_binary() is None:
        return "no `ip` binary (iproute2) on PATH or in /usr/sbin, /sbin"
    probe = f"sa-{os.getpid()}-{next(_counter)}"
    try:
        _ip(batch=[f"netns add {probe}"])
        _ip("-n", probe, "link", "add", "name", "probe0", "type", "veth", "peer", "name", "probe1")
    except FabricError as exc:
        return f"cannot create a network namespace with a veth pair here: {exc}"
    finally:
        with contextlib.suppress(FabricError):
            _delete_namespaces([probe])
    return None


def skip_unless_netns() -> None:
    """Skip the calling test, saying why, when `unavailable_reason()` finds a reason."""
    import pytest  # here, not at the top: bench/ code imports this module without pytest

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
