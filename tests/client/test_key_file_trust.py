"""Secret key files are used only when private (DESIGN §3), the way ssh reads an identity file.

A keypair file (`client.key`, `server.key`, or any file named by `--client-key` or
`$SUBAGENTS_CLIENT_KEY`) that the group or others may read or write, or that another user owns,
is refused with one line naming the file and the fix, before any socket uses it. The files are
real, with real modes; the node, its tcp listener and the home a worker joins are real
processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subagents_node.client.keys import (
    CLIENT_KEY,
    SERVER_KEY,
    client_credentials,
    keys_dir,
    read_keypair,
)
from subagents_node.client.paths import read_pid_file
from subagents_node.messages.errors import KeyFileInvalid, SubagentsError
from subagents_node.node.daemon import stop_node
from tests.support.fleet import fleet
from tests.support.nodes import NodeProcess, free_tcp_port, new_state_dir, run_cli

#: An unprivileged uid that is not ours (nobody): only root can hand a file to it.
OTHER_UID = 65534


@pytest.fixture
def keyed_dir(state_dir: Path) -> Path:
    """A state dir with its keys generated (`keys generate`: server, client, local allowed)."""
    done = run_cli("keys", "generate", state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    return state_dir


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may write to (0777), as a careless copy would land in."""
    directory = Path(tempfile.mkdtemp(prefix="sa-open-", dir="/tmp"))
    directory.chmod(0o777)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _copy_with_mode(source: Path, target: Path, mode: int) -> Path:
    shutil.copyfile(source, target)
    target.chmod(mode)
    return target


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(
    "mode", [0o644, 0o640, 0o604, 0o660, 0o666, 0o620, 0o602], ids=lambda mode: f"{mode:04o}"
)
def test_design_3_a_client_key_file_open_to_group_or_others_is_refused_with_its_chmod(
    keyed_dir: Path, open_dir: Path, mode: int
) -> None:
    copied = _copy_with_mode(keys_dir(keyed_dir) / CLIENT_KEY, open_dir / "c.key", mode)
    with pytest.raises(KeyFileInvalid) as info:
        client_credentials(keyed_dir, client_file=str(copied))
    assert info.value.details["reason"] == "unsafe_key_file"
    assert f"refusing key file {copied}" in info.value.message
    assert f"`chmod 600 {copied}`" in info.value.message
    copied.chmod(0o600)  # the fix the line names is enough
    assert client_credentials(keyed_dir, client_file=str(copied)).client == read_keypair(copied)


def test_design_3_a_key_file_another_user_owns_is_refused(keyed_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    path = keys_dir(keyed_dir) / CLIENT_KEY
    os.chown(path, OTHER_UID, -1)
    with pytest.raises(KeyFileInvalid) as info:
        client_credentials(keyed_dir)
    assert f"refusing key file {path}: it is owned by uid {OTHER_UID}" in info.value.message


def test_design_3_public_keys_need_no_private_file(keyed_dir: Path, open_dir: Path) -> None:
    """Only secrets are guarded: the server's public key given as text is taken as it is."""
    server = read_keypair(keys_dir(keyed_dir) / SERVER_KEY).public
    creds = client_credentials(keyed_dir, server_key=server)
    assert creds.server_public == server


def test_design_3_tcp_client_refuses_an_open_key_file_from_the_environment(
    keyed_dir: Path, open_dir: Path, start_node: Callable[..., NodeProcess]
) -> None:
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    start_node("--listen", tcp, state_dir=keyed_dir)
    copied = _copy_with_mode(keys_dir(keyed_dir) / CLIENT_KEY, open_dir / "c.key", 0o666)
    env = {**os.environ, "SUBAGENTS_CLIENT_KEY": str(copied)}
    done = run_cli("--timeout", "5", "--address", tcp, "ping", state_dir=keyed_dir, env=env)
    assert done.returncode != 0, done.stdout
    line = _one_line(done.stderr)
    assert f"refusing key file {copied}" in line and f"chmod 600 {copied}" in line
    copied.chmod(0o600)
    fixed = run_cli("--timeout", "5", "--address", tcp, "ping", state_dir=keyed_dir, env=env)
    assert fixed.returncode == 0, fixed.stderr


def test_design_3_node_refuses_to_listen_with_a_server_key_others_can_read(
    keyed_dir: Path,
) -> None:
    server_key = keys_dir(keyed_dir) / SERVER_KEY
    server_key.chmod(0o644)
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    done = run_cli("start", "--detach", "--listen", tcp, state_dir=keyed_dir)
    try:
        assert done.returncode != 0, done.stdout
        assert "Traceback" not in done.stderr
        assert f"refusing key file {server_key}" in done.stderr
        assert f"chmod 600 {server_key}" in done.stderr
        assert read_pid_file(keyed_dir) is None  # no node left serving
    finally:
        if read_pid_file(keyed_dir) is not None:
            stop_node(keyed_dir, timeout_s=15.0)


def test_design_3_worker_refuses_to_join_with_a_client_key_others_can_read(
    open_dir: Path,
) -> None:
    with fleet(workers=()) as crew:
        directory = new_state_dir()
        try:
            assert run_cli("keys", "generate", state_dir=directory).returncode == 0
            public = read_keypair(keys_dir(directory) / CLIENT_KEY).public
            allowed = run_cli(
                "keys", "allow", "--name", "w1", "--", public, state_dir=crew.home.state_dir
            )
            assert allowed.returncode == 0, allowed.stderr
            copied = _copy_with_mode(keys_dir(directory) / CLIENT_KEY, open_dir / "w.key", 0o644)
            args = (*crew.worker_args("w1"), "--client-key", str(copied))
            done = run_cli("start", "--detach", *args, state_dir=directory)
            assert done.returncode != 0, done.stdout
            assert f"refusing key file {copied}" in done.stderr
            assert read_pid_file(directory) is None
            assert "w1" not in crew.nodes()
            copied.chmod(0o600)
            NodeProcess(directory, args).start()  # the fix is enough to join
            assert crew.nodes()["w1"].state == "up"
        finally:
            if read_pid_file(directory) is not None:
                with contextlib.suppress(SubagentsError):
                    stop_node(directory, timeout_s=15.0)
            shutil.rmtree(directory, ignore_errors=True)


def test_design_3_keys_generate_writes_private_files_whatever_the_umask(state_dir: Path) -> None:
    umask_0 = ("sh", "-c", 'umask 000 && exec "$@"', "sh")
    done = run_cli("keys", "generate", state_dir=state_dir, prefix=umask_0)
    assert done.returncode == 0, done.stderr
    directory = keys_dir(state_dir)
    assert directory.stat().st_mode & 0o777 == 0o700
    for name in (SERVER_KEY, CLIENT_KEY, "allowed.toml"):
        assert (directory / name).stat().st_mode & 0o777 == 0o600, name


def test_a_key_file_mixing_two_keypairs_is_refused_and_no_node_listens_with_it(
    keyed_dir: Path,
) -> None:
    """A public key and a secret key of two keypairs (a hand edit, a copy-paste) passed every
    check: the node served the secret, `keys show` published the other public key, and every
    tcp client was refused as if it were not on the allow-list."""
    import zmq

    server_key = keys_dir(keyed_dir) / SERVER_KEY
    public, _ = zmq.curve_keypair()
    _, secret = zmq.curve_keypair()
    server_key.write_text(f'public = "{public.decode()}"\nsecret = "{secret.decode()}"\n')
    with pytest.raises(KeyFileInvalid, match="not the public half of its secret key"):
        read_keypair(server_key)
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    done = run_cli("start", "--detach", "--listen", tcp, state_dir=keyed_dir)
    try:
        assert done.returncode != 0, done.stdout
        assert "Traceback" not in done.stderr
        assert "is not the public half of its secret key" in done.stderr
        assert read_pid_file(keyed_dir) is None
    finally:
        if read_pid_file(keyed_dir) is not None:
            stop_node(keyed_dir, timeout_s=15.0)


def test_a_fifo_given_as_a_key_file_is_refused_as_no_file_not_for_its_mode(
    tmp_path: Path,
) -> None:
    """The mode was checked before the type: a FIFO (0644) was refused with `chmod 600`
    advice that could not help, and, chmod'ed, as "not a regular file"."""
    fifo = tmp_path / "client.key"
    os.mkfifo(fifo, 0o644)
    with pytest.raises(KeyFileInvalid) as refused:
        read_keypair(fifo)
    assert "not a regular file" in refused.value.message, refused.value.message
    assert "chmod" not in refused.value.message
