"""One endpoint named twice for the node to listen on is listened on once.

Before, `start --listen tcp://127.0.0.1:P --listen tcp://127.0.0.1:P` (or the same endpoint in
`SUBAGENTS_LISTEN` or a `subagents.toml` and on the command line) failed the start with
"cannot listen on [...]: Address already in use": the node's own second bind of it, which sent
the user looking for another process on the port. Real detached nodes over loopback tcp.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.support.nodes import NodeProcess, free_tcp_port, run_cli


def test_an_endpoint_given_twice_on_the_command_line_is_listened_on_once(
    start_node: Callable[..., NodeProcess], state_dir: Path
) -> None:
    assert run_cli("keys", "generate", state_dir=state_dir).returncode == 0
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"

    node = start_node("--listen", tcp, "--listen", tcp, state_dir=state_dir)

    assert node.client().ping() is not None
    status = run_cli("status", state_dir=state_dir)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count(tcp) == 1


def test_an_endpoint_in_subagents_listen_and_on_the_command_line_is_listened_on_once(
    state_dir: Path,
) -> None:
    assert run_cli("keys", "generate", state_dir=state_dir).returncode == 0
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    env = {**os.environ, "SUBAGENTS_LISTEN": tcp}

    started = run_cli("start", "--detach", "--listen", tcp, state_dir=state_dir, env=env)
    try:
        assert started.returncode == 0, started.stderr
    finally:
        run_cli("stop", state_dir=state_dir)
