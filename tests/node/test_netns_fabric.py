"""The multi-host test fabric (tests/support/netns.py) does what the node's multi-host tests need.

Hosts reach each other over tcp and nothing else reaches them; a partition is one call and so is
its end; teardown leaves no namespace and no root link behind, also after a failing test with a
process still running inside; a dead run's leftovers go at the next start; binds show each host
its own directory at one path; and the skip says why when namespaces cannot be had.

No packet may leave the machine. The one probe made from the root namespace uses SO_DONTROUTE:
a plain connect to a fabric address would follow the default route out of the machine, while
with SO_DONTROUTE the kernel considers only directly attached links and local addresses, so the
connect fails with ENETUNREACH before any packet is built. Every wait is on a line a process
prints, with a deadline; no test sleeps.
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import pytest

from tests.support.netns import Fabric, hosts, skip_unless_netns
from tests.support.nodes import REPO

MakeHosts = Callable[[Sequence[str]], Fabric]
PORT = 7000
WAIT_S = 5.0
#: `python -c LISTENER ADDRESS PORT`: say "ready", then greet every connection with its own name.
LISTENER = """\
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b"hello from " + sys.argv[1].encode())
    conn.close()
"""
#: `python -c CONNECT ADDRESS PORT TIMEOUT`: print the greeting (exit 0) or the error (exit 1).
CONNECT = """\
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3])) as s:
        print(s.recv(100).decode())
except OSError as exc:
    print(type(exc).__name__, exc.errno)
    sys.exit(1)
"""


def _line(proc: subprocess.Popen[bytes], timeout: float = WAIT_S) -> str:
    """The next line `proc` prints, waiting at most `timeout` for it."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no line from pid {proc.pid} in {timeout} s"
    return proc.stdout.readline().decode().strip()


def _listen(fabric: Fabric, name: str) -> subprocess.Popen[bytes]:
    proc = fabric.popen(
        name,
        [sys.executable, "-c", LISTENER, fabric.address(name), str(PORT)],
        stdout=subprocess.PIPE,
    )
    assert _line(proc) == "ready"
    return proc


def _connect(
    fabric: Fabric, source: str, target: str, timeout: float = 2.0
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", CONNECT, fabric.address(target), str(PORT), str(timeout)]
    return fabric.run(source, argv, timeout=timeout + WAIT_S)


def _namespaces() -> list[str]:
    listed = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=True
    )
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


def _root_links() -> list[str]:
    shown = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10, check=True
    )
    return sorted(line.split(":")[1].strip() for line in shown.stdout.splitlines())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_two_hosts_reach_each_other_over_tcp(netns_hosts: MakeHosts) -> None:
    fabric = netns_hosts(["home", "worker"])
    assert fabric.address("home") != fabric.address("worker")
    for server, client in (("home", "worker"), ("worker", "home")):
        _listen(fabric, server)
        done = _connect(fabric, client, server)
        assert (done.returncode, done.stdout.strip()) == (0, f"hello from {fabric.address(server)}")


def test_a_host_address_is_not_reachable_from_the_root_namespace(netns_hosts: MakeHosts) -> None:
    fabric = netns_hosts(["home", "worker"])
    _listen(fabric, "home")
    with socket.create_server(("127.0.0.1", 0)) as control:
        # the probe itself works: a local address is reachable with SO_DONTROUTE
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_DONTROUTE, 1)
            sock.settimeout(0.5)
            sock.connect(control.getsockname())
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_DONTROUTE, 1)
            sock.settimeout(0.5)
            started = time.monotonic()
            with pytest.raises(OSError) as refused:
                sock.connect((fabric.address("home"), PORT))
    assert refused.value.errno == errno.ENETUNREACH, refused.value
    assert time.monotonic() - started < 0.5
    root = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True, timeout=10)
    assert fabric.address("home") not in root.stdout


def test_link_down_partitions_a_host_and_link_up_ends_the_partition(
    netns_hosts: MakeHosts,
) -> None:
    fabric = netns_hosts(["home", "worker"])
    _listen(fabric, "home")
    assert _connect(fabric, "worker", "home").returncode == 0

    fabric.link_down("home")
    started = time.monotonic()
    cut = _connect(fabric, "worker", "home", timeout=0.5)
    assert cut.returncode == 1, cut.stdout
    assert cut.stdout.split()[0] in {"TimeoutError", "OSError"}, cut.stdout
    # the partitioned host knows at once: it has no route to the subnet any more
    out = _connect(fabric, "home", "worker", timeout=0.5)
    assert out.stdout.split() == ["OSError", str(errno.ENETUNREACH)], out.stdout
    assert time.monotonic() - started < 3.0

    fabric.link_up("home")
    back = _connect(fabric, "worker", "home")
    assert (back.returncode, back.stdout.strip()) == (0, f"hello from {fabric.address('home')}")


def test_teardown_after_a_failure_kills_what_runs_inside_and_leaves_nothing() -> None:
    skip_unless_netns()
    links_before = _root_links()
    # a child of the started process, in a session of its own and deaf to SIGTERM: only the
    # namespace still knows it is ours
    detached = (
        "import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], "
        "start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(RuntimeError, match="the test failed"), hosts(["home", "worker"]) as fabric:
        started = fabric.popen("home", [sys.executable, "-c", detached], stdout=subprocess.PIPE)
        grandchild = int(_line(started))
        assert set(_namespaces()) >= {fabric.hub, fabric.namespace("home")}
        raise RuntimeError("the test failed")
    assert started.returncode == -signal.SIGTERM
    assert _gone(grandchild), f"pid {grandchild} outlived its fabric"
    assert [n for n in _namespaces() if n.startswith(fabric.fabric_id)] == []
    assert _root_links() == links_before


def test_a_dead_runs_leftover_namespace_goes_when_the_next_fabric_starts() -> None:
    skip_unless_netns()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    leftover = f"sa-{int(dead.stdout)}-0-home"
    subprocess.run(["ip", "netns", "add", leftover], timeout=10, check=True)
    inside = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            leftover,
            sys.executable,
            "-c",
            "print('ready', flush=True)\nimport time; time.sleep(60)",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    try:
        ready = _line(inside)
        with hosts(["home"]):
            assert leftover not in _namespaces()
        # Any fabric's start cleans it: another pytest process (an xdist worker) may get there
        # before ours, even before `ip netns exec` could enter it (which then exits 255).
        status = inside.wait(WAIT_S)
        assert status == -signal.SIGKILL or (ready, status) == ("", 255), (ready, status)
    finally:
        inside.kill()
        inside.wait(WAIT_S)
        assert inside.stdout is not None
        inside.stdout.close()
        if leftover in _namespaces():
            subprocess.run(["ip", "netns", "delete", leftover], timeout=10, check=True)


def test_binds_show_each_host_its_own_directory_at_one_path(
    netns_hosts: MakeHosts, tmp_path: Path
) -> None:
    fabric = netns_hosts(["home", "worker"])
    shared = tmp_path / "state"
    shared.mkdir()
    write = (
        "import os, sys\n"
        "print(sorted(os.listdir(sys.argv[1])))\n"
        "open(os.path.join(sys.argv[1], 'owner'), 'w').write(sys.argv[2])\n"
    )
    for name in fabric.names:
        (tmp_path / name).mkdir()
        done = fabric.run(
            name, [sys.executable, "-c", write, str(shared), name], binds={shared: tmp_path / name}
        )
        assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
    assert {n: (tmp_path / n / "owner").read_text() for n in fabric.names} == {
        "home": "home",
        "worker": "worker",
    }
    assert list(shared.iterdir()) == []
    assert str(shared) not in Path("/proc/self/mountinfo").read_text()


@pytest.mark.parametrize(
    ("setpriv", "reason"),
    [
        (["--reuid", "65534", "--regid", "65534", "--clear-groups"], "need root (euid is 65534)"),
        (["--bounding-set", "-sys_admin,-net_admin"], "cannot create a network namespace"),
    ],
    ids=["not-root", "no-capability"],
)
def test_the_skip_reason_says_why_namespaces_are_unavailable(
    setpriv: list[str], reason: str
) -> None:
    skip_unless_netns()
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux) to drop root or a capability with")
    # The module alone (standard library only), in a directory anyone may read: the checkout
    # may sit under a 0700 directory (`mktemp -d`) that the dropped user cannot enter.
    with tempfile.TemporaryDirectory(prefix="sa-probe-") as where:
        os.chmod(where, 0o755)
        shutil.copy(REPO / "tests" / "support" / "netns.py", Path(where) / "netns.py")
        os.chmod(Path(where) / "netns.py", 0o644)
        probe = "from netns import unavailable_reason; print(unavailable_reason())"
        done = subprocess.run(
            ["setpriv", *setpriv, sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=where,
        )
    assert done.returncode == 0, done.stderr
    assert reason in done.stdout, done.stdout
