"""Strict address parsing (DESIGN §3, issue 12 item 2): scheme, host and port, nothing else.

zmq reads `tcp://A;B` as "bind B, with source address A", takes interface names and `*` as
hosts and `*` as a port: `tcp://127.0.0.1:0;0.0.0.0:PORT` passed the old loopback check and
listened on every interface. These tests refuse each form from every route a user (or a cloned
repository's `subagents.toml`) can give: the `--listen` flag, `SUBAGENTS_LISTEN`, the project
config file; and check that nothing was left listening.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from subagents_node.client.paths import check_endpoint, is_loopback_tcp, read_pid_file
from subagents_node.launch.config import load_config
from subagents_node.messages.errors import BadAddress, ConfigError
from tests.support.nodes import free_tcp_port

#: Forms zmq would accept and that must never reach a bind.
BYPASSES = (
    "tcp://127.0.0.1:0;0.0.0.0:{port}",
    "tcp://127.0.0.1:{port};0.0.0.0:{port}",
    "tcp://eth0:{port}",
    "tcp://lo:{port}",
    "tcp://*:{port}",
    "tcp://127.0.0.1:*",
    "tcp://127.0.0.1:!",
    "tcp://127.0.0.1: {port}",
    "tcp://127.0.0.1:0",
    "tcp://127.0.0.1:99999",
    "tcp://127.1:{port}",
    "tcp://[::1%lo]:{port}",
    "tcp://localhost.evil.example:{port}",
    "ipc:///tmp/x;y",
    "ipc://",
)


@pytest.mark.parametrize("form", BYPASSES)
def test_design_3_zmq_address_syntax_beyond_host_and_port_is_refused(form: str) -> None:
    endpoint = form.format(port=7700)
    with pytest.raises(BadAddress) as info:
        check_endpoint(endpoint)
    assert "bad node address" in info.value.message
    assert "\n" not in info.value.message
    assert not is_loopback_tcp(endpoint)


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://127.0.0.1:7700", "tcp://127.5.6.7:1", "tcp://[::1]:65535", "tcp://localhost:7700"],
)
def test_design_3_exact_loopback_host_and_port_is_accepted(endpoint: str) -> None:
    assert check_endpoint(endpoint) == endpoint
    assert is_loopback_tcp(endpoint)


def test_design_3_a_long_hostile_address_gives_a_short_error() -> None:
    with pytest.raises(BadAddress) as info:
        check_endpoint("tcp://" + "a;" * 50_000 + ":1")
    assert len(info.value.message) < 400


def _port_is_free(port: int) -> bool:
    """Nobody listens on `port` on any interface (binding the wildcard would fail otherwise)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def _start(state_dir: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """`start --detach` as a real process; returns its stderr (it must fail)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "subagents_node",
            "--state-dir",
            str(state_dir),
            "start",
            "--detach",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert read_pid_file(state_dir) is None
    return done.stderr


def test_issue_12_source_address_bypass_is_refused_by_the_listen_flag(
    state_dir: Path, tmp_path: Path
) -> None:
    port = free_tcp_port()
    err = _start(state_dir, "--listen", f"tcp://127.0.0.1:0;0.0.0.0:{port}", cwd=tmp_path)
    assert "bad node address" in err and "source addresses" in err
    assert _port_is_free(port)


def test_issue_12_source_address_bypass_is_refused_from_subagents_listen(
    state_dir: Path, tmp_path: Path
) -> None:
    port = free_tcp_port()
    env = {"SUBAGENTS_LISTEN": f"tcp://127.0.0.1:0;0.0.0.0:{port}"}
    err = _start(state_dir, cwd=tmp_path, env=env)
    assert "SUBAGENTS_LISTEN" in err and "bad node address" in err
    assert _port_is_free(port)


def test_issue_12_a_cloned_repositorys_config_cannot_expose_the_node(
    state_dir: Path, tmp_path: Path
) -> None:
    """`start` inside a hostile checkout: its subagents.toml names the bypass address."""
    port = free_tcp_port()
    repo = tmp_path / "cloned"
    repo.mkdir()
    (repo / "subagents.toml").write_text(f'listen = ["tcp://127.0.0.1:0;0.0.0.0:{port}"]\n')
    err = _start(state_dir, cwd=repo)
    assert "subagents.toml" in err and "'listen'" in err
    assert _port_is_free(port)
    with pytest.raises(ConfigError):
        load_config(cwd=repo, env={})


def test_issue_12_wildcard_and_interface_hosts_are_refused_by_the_config(tmp_path: Path) -> None:
    for host in ("*", "eth0", "0.0.0.0"):
        (tmp_path / "subagents.toml").write_text(f'listen = ["tcp://{host}:7700"]\n')
        if host == "0.0.0.0":  # an exact address: parsed, then refused by the node (loopback)
            assert load_config(cwd=tmp_path, env={}).settings.listen == ("tcp://0.0.0.0:7700",)
            continue
        with pytest.raises(ConfigError):
            load_config(cwd=tmp_path, env={})
