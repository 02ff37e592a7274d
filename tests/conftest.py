"""The fixtures every test module can ask for; they live in tests/support/nodes.py, except
netns_hosts (tests/support/netns.py has no pytest import, so bench/ can use it too).

isolated_env        (autouse) no test talks to a developer's real node or state
state_dir           a fresh short directory under /tmp (ipc paths must stay < 107 bytes)
node                a detached node started with --faults (NodeProcess)
tcp_node            a detached node on loopback tcp too, keys generated: (NodeProcess, endpoint)
start_node          factory: start_node("--mailbox-limit", "4", ...) -> NodeProcess
foreground_node     factory: a node run in the foreground as our child (exit code, log)
embedded_node       subagents_node.Node.embedded(...) with faults on, in this process
invoke              the CLI in this process through click's CliRunner
raw_dealer          factory: a bare DEALER socket connected to an address (RawPeer)
netns_hosts         factory: netns_hosts(["home", "worker"]) -> Fabric, one network namespace
                    per host; torn down after the test; skips (saying why) without root or ip
"""

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack

import pytest

from tests.support.netns import Fabric, hosts, skip_unless_netns
from tests.support.nodes import (
    SESSION_TMP_ENV,
    embedded_node,
    foreground_node,
    invoke,
    isolated_env,
    node,
    raw_dealer,
    start_node,
    state_dir,
    tcp_node,
)

#: The session directory this session made (tests/support/nodes.py `short_dir`), to remove.
_SESSION_TMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """A suite started under `nohup` (or as a background job of a script) ignores SIGHUP (or
    SIGINT), and an ignored signal stays ignored across exec: every command the tests start
    would ignore it too (as it should: the CLI keeps what `nohup` asked for), and the tests that
    close a command's terminal or press Ctrl-C on it would wait for an end that never comes.
    A handler that does nothing keeps this process deaf to them as asked, while a caught signal
    is reset to its default on exec, so the commands under test get the default.

    It also makes the session's short directory (`short_dir`), removed by pytest_unconfigure."""
    for signum in (signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, lambda *_: None)
    # Every short directory the tests make goes in one of the session's own (short_dir), removed
    # at its end: a test that leaves its state dir behind no longer leaves it in /tmp.
    if SESSION_TMP_ENV not in os.environ:  # (a session inside a test's process uses its own)
        made = tempfile.mkdtemp(prefix="sa-tests-", dir="/tmp")
        os.environ[SESSION_TMP_ENV] = config.stash[_SESSION_TMP] = made


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_SESSION_TMP, "")
    if made:
        os.environ.pop(SESSION_TMP_ENV, None)
        shutil.rmtree(made, ignore_errors=True)


__all__ = [
    "embedded_node",
    "foreground_node",
    "invoke",
    "isolated_env",
    "netns_hosts",
    "node",
    "raw_dealer",
    "start_node",
    "state_dir",
    "tcp_node",
]


@pytest.fixture
def netns_hosts() -> Iterator[Callable[[Sequence[str]], Fabric]]:
    """Factory for fabrics (tests/support/netns.py `hosts`), each torn down after the test."""
    skip_unless_netns()
    with ExitStack() as stack:
        yield lambda names: stack.enter_context(hosts(names))
