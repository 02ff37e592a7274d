"""`keys generate` as a key rotation (DESIGN §3): all of it, or nothing.

`keys generate --force` replaces both keypairs and moves the allow-list's `local` entry to the
new client key in one write, so the state dir's own tcp client is admitted with the new keys
at the next start; while a node serves the state dir it is refused and no file changes (the
node would go on serving the old key it holds). Every refusal comes before the first write.
The CLI, the node and its tcp listener are real processes; the key files are real files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from subagents_node.client.keys import (
    ALLOWED,
    CLIENT_KEY,
    SERVER_KEY,
    Keypair,
    keys_dir,
    read_allowed,
    read_keypair,
)
from tests.support.nodes import NodeProcess, free_tcp_port, run_cli


def _generate(state_dir: Path, *args: str) -> tuple[int, str, str]:
    done = run_cli("keys", "generate", *args, state_dir=state_dir)
    return done.returncode, done.stdout, done.stderr


def _files(state_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(keys_dir(state_dir).iterdir())}


def test_keys_generate_force_replaces_both_keys_and_moves_local_to_the_new_client_key(
    state_dir: Path, start_node: Callable[..., NodeProcess]
) -> None:
    assert _generate(state_dir)[0] == 0
    directory = keys_dir(state_dir)
    old_server, old_client = (read_keypair(directory / n) for n in (SERVER_KEY, CLIENT_KEY))
    ci = Keypair.generate().public
    assert run_cli("keys", "allow", "--name", "ci", "--", ci, state_dir=state_dir).returncode == 0

    code, out, err = _generate(state_dir, "--force")

    assert code == 0, err
    server, client = (read_keypair(directory / n) for n in (SERVER_KEY, CLIENT_KEY))
    assert server != old_server and client != old_client
    assert read_allowed(directory / ALLOWED) == {"local": client.public, "ci": ci}
    assert f"server key  {server.public}" in out and client.public in out
    assert "warning: replaced server.key and client.key" in err and "--home-key" in err
    # The state dir's own tcp client is admitted with the new keys at the next start.
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    node = start_node("--listen", tcp, state_dir=state_dir)
    assert node.client(address=tcp).ping().pid == node.pid
    shown = run_cli("keys", "show", state_dir=state_dir)
    assert f"server key  {server.public}" in shown.stdout


def test_keys_generate_force_is_refused_while_a_node_serves_and_changes_nothing(
    state_dir: Path, start_node: Callable[..., NodeProcess]
) -> None:
    assert _generate(state_dir)[0] == 0
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    node = start_node("--listen", tcp, state_dir=state_dir)
    before = _files(state_dir)

    code, _, err = _generate(state_dir, "--force")

    assert code == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"a node (pid {node.pid}) serves" in err and "subagents-node stop" in err
    assert _files(state_dir) == before
    assert node.client(address=tcp).ping().pid == node.pid  # the old keys still work


def test_keys_generate_with_the_server_key_gone_is_refused_while_a_node_serves(
    state_dir: Path, start_node: Callable[..., NodeProcess]
) -> None:
    """With `server.key` removed (a careless `rm`, a partial restore) under a tcp node, plain
    `keys generate` wrote a new server key the node did not serve and printed the node's old
    one: the file and the printed key differed, and tcp clients of the state dir were refused."""
    assert _generate(state_dir)[0] == 0
    tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
    node = start_node("--listen", tcp, state_dir=state_dir)
    server_key = keys_dir(state_dir) / SERVER_KEY
    kept = server_key.read_bytes()
    server_key.unlink()
    before = _files(state_dir)

    code, _, err = _generate(state_dir)

    assert code == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "server.key is missing while a node" in err and "subagents-node stop" in err
    assert _files(state_dir) == before
    server_key.write_bytes(kept)  # put back: the key the node serves still admits clients
    server_key.chmod(0o600)
    assert node.client(address=tcp).ping().pid == node.pid


def test_keys_generate_that_cannot_allow_its_new_client_key_writes_no_file(
    state_dir: Path,
) -> None:
    """Without --force, `local` admitting another key is refused before any key is written."""
    assert _generate(state_dir)[0] == 0
    directory = keys_dir(state_dir)
    (directory / SERVER_KEY).unlink()
    (directory / CLIENT_KEY).unlink()
    before = _files(state_dir)

    code, _, err = _generate(state_dir)

    assert code == 1 and "the name 'local' already admits another key" in err
    assert _files(state_dir) == before


def test_keys_show_creates_no_state_dir_and_changes_no_mode(state_dir: Path) -> None:
    """`keys show` is a look: it used to create a missing state dir (mode 0700, empty) and
    tighten an existing one's mode, as `keys generate` does. It shows no keys and leaves the
    directory as it was; a dir others could write to is still refused (exit 1), unchanged."""
    missing = state_dir / "never-made"
    done = run_cli("keys", "show", "--json", state_dir=missing)
    assert done.returncode == 0, done.stderr
    assert '"server_public": ""' in done.stdout
    assert not missing.exists()
    state_dir.chmod(0o755)
    assert run_cli("keys", "show", state_dir=state_dir).returncode == 0
    assert state_dir.stat().st_mode & 0o777 == 0o755 and not any(state_dir.iterdir())
    state_dir.chmod(0o777)
    done = run_cli("keys", "show", state_dir=state_dir)
    assert done.returncode == 1 and "writable by group or others" in done.stderr, done.stderr
    assert state_dir.stat().st_mode & 0o777 == 0o777
    state_dir.chmod(0o700)


def test_keys_allow_of_a_key_allowed_under_another_name_says_the_old_name_is_gone(
    state_dir: Path, start_node: Callable[..., NodeProcess]
) -> None:
    """A key has one name: allowed again as NAME, it leaves its old name. The command used to
    print only `allowed NAME`, so an operator who allowed `local`'s key for a CI job (or a
    worker's under a second name) lost the old entry with nothing said. With a node serving
    the state dir and without one alike."""
    assert _generate(state_dir)[0] == 0
    key = Keypair.generate().public
    assert run_cli("keys", "allow", "--name", "a", "--", key, state_dir=state_dir).returncode == 0
    moved = run_cli("keys", "allow", "--name", "b", "--", key, state_dir=state_dir)
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.strip() == "allowed b (no longer as a: a key has one name)"
    assert "a" not in read_allowed(keys_dir(state_dir) / ALLOWED)
    start_node(state_dir=state_dir)
    again = run_cli("keys", "allow", "--name", "c", "--", key, state_dir=state_dir)
    assert again.stdout.strip() == "allowed c (no longer as b: a key has one name)"
    same = run_cli("keys", "allow", "--name", "c", "--", key, state_dir=state_dir)
    assert same.stdout.strip() == "allowed c"
