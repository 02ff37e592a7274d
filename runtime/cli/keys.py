"""`subagents-node keys generate|show|allow|revoke`: the CURVE keys of tcp listeners and clients.

Owns the command-line face of `client/keys.py`. While a node serves the state dir, `allow` and
`revoke` (and `show`'s allow-list) go to the node as `node.keys.*` requests over its ipc
socket, so the node, the allow-list's owner, writes the file and applies the change to the
next handshake; with no node running, the command edits the file itself. It never prints a
secret key.

`keys generate --force` is a key rotation, done only with no node serving the state dir (a
running node holds its server key and its tcp sockets' keys in memory, so it would go on
serving the old key while the files say otherwise; it is refused, and nothing changes). Every
refusal it can meet (a malformed allow-list, a key file refused as unsafe) comes before the
first write; then it writes the two new keypairs and the allow-list with `local` moved to the
new client key (the old one revoked in that same write), each file atomically. Interrupted
between those writes, it is run again.

    subagents-node keys generate [--force]     node.keys.allow {name: "local", public_key}
    subagents-node keys show [--json]          node.keys.list
    subagents-node keys allow KEY --name NAME  node.keys.allow {name, public_key}
    subagents-node keys revoke NAME_OR_KEY     node.keys.revoke {name}
"""

from __future__ import annotations

from pathlib import Path

import click

from subagents_node.cli.common import Ctx, emit, json_option, user_errors
from subagents_node.cli.params import GIVEN_TEXT
from subagents_node.cli.terminal import say
from subagents_node.client.keys import (
    ALLOWED,
    CLIENT_KEY,
    SERVER_KEY,
    Keypair,
    allowing,
    check_name,
    check_public_key,
    keys_dir,
    read_allowed,
    read_keypair,
    revoking,
    write_allowed,
    write_keypair,
)
from subagents_node.client.paths import (
    ensure_state_dir,
    ipc_endpoint,
    read_pid_file,
    untrusted_state_dir,
)
from subagents_node.messages.base import validate_request
from subagents_node.messages.errors import NodeAlreadyRunning
from subagents_node.messages.keys import AllowedKeys, KeysAllow, KeysList, KeysRevoke

#: the name `keys generate` gives this state dir's own client key on the allow-list
LOCAL_NAME = "local"


@click.group("keys")
def keys_group() -> None:
    """CURVE keys for tcp: the node's server key, client keys, the allow-list."""


@keys_group.command()
@click.option(
    "--force",
    is_flag=True,
    help="Replace both keypairs and allow the new client key as 'local' in place of the old "
    "one (refused while a node serves the state dir: stop it first).",
)
@click.pass_obj
@user_errors
def generate(obj: Ctx, force: bool) -> None:
    """Create the server and client keypairs (0600) and allow this client as 'local'."""
    state_dir = ensure_state_dir(obj.state_dir)
    directory = keys_dir(state_dir)
    running = read_pid_file(state_dir)
    if force and running is not None:
        raise NodeAlreadyRunning(
            f"a node (pid {running['pid']}) serves {state_dir} with the current keys; stop it "
            "(`subagents-node stop`), run `keys generate --force` again, then start it",
            address=str(running.get("address", "")),
        )
    endpoints = running.get("endpoints") if running is not None else None
    serves_tcp = isinstance(endpoints, list) and any(str(e).startswith("tcp://") for e in endpoints)
    if running is not None and serves_tcp and not (directory / SERVER_KEY).exists():
        # A tcp node serves the key it read at its start: a new file would not be its key,
        # and the command printed the node's while the file held another (every tcp client
        # of the state dir was then refused). A node on ipc alone serves no key.
        raise NodeAlreadyRunning(
            f"{directory / SERVER_KEY} is missing while a node (pid {running['pid']}) serves "
            f"{state_dir} with the key it read at its start; stop it (`subagents-node stop`), "
            "run `keys generate` again, then start it",
            address=str(running.get("address", "")),
        )
    roles = {SERVER_KEY: "server", CLIENT_KEY: "client"}
    fresh = {n: Keypair.generate() for n in roles if force or not (directory / n).exists()}
    client = fresh.get(CLIENT_KEY) or read_keypair(directory / CLIENT_KEY)
    # The allow-list change is checked before any key file is written: a refusal (`local`
    # already admits another key, without --force) leaves every file as it was.
    allowed = _change(state_dir, KeysList()).clients if running else _allowed(state_dir)
    updated = allowing(allowed, LOCAL_NAME, client.public, replace=force)
    replaced = [n for n in fresh if (directory / n).exists()]
    for name, pair in fresh.items():
        write_keypair(directory / name, pair, roles[name])
    if force:  # no node runs: this command owns the allow-list file
        write_allowed(directory / ALLOWED, updated)  # old `local` out, new one in: one write
        server = fresh[SERVER_KEY].public
    else:
        request = KeysAllow(name=LOCAL_NAME, public_key=client.public)
        server = _change(state_dir, request).server_public
    say(f"server key  {server}")
    say(f"client key  {client.public}  (allowed as {LOCAL_NAME!r})")
    if replaced:
        say(
            f"warning: replaced {' and '.join(replaced)}: the node serves the new server key "
            "from its next start; give its workers the new --home-key and its tcp clients the "
            "new key, and if it is a worker, have its home allow the new client key",
            err=True,
        )


@keys_group.command()
@json_option
@click.pass_obj
@user_errors
def show(obj: Ctx, as_json: bool) -> None:
    """Show the server's and this client's public keys and the allow-list."""
    listing = _change(_readable_state_dir(obj.state_dir), KeysList())
    client_path = keys_dir(obj.state_dir) / CLIENT_KEY
    client = read_keypair(client_path).public if client_path.exists() else ""
    server = listing.server_public or "(none: run `subagents-node keys generate`)"
    lines = [f"server key  {server}", f"client key  {client or '(none)'}"]
    lines += ["allowed:"] + [f"  {n:<20} {k}" for n, k in sorted(listing.clients.items())]
    payload = {**listing.model_dump(mode="json"), "client_public": client}
    emit(payload, as_json, "\n".join(lines) if listing.clients else "\n".join(lines) + " none")


@keys_group.command()
@click.argument("public_key")
@click.option("--name", required=True, help="The principal this key is logged as.")
@click.pass_obj
@user_errors
def allow(obj: Ctx, public_key: str, name: str) -> None:
    """Admit the client PUBLIC_KEY (z85) over tcp as NAME; applies at once.

    A z85 key may start with '-': in scripts, put it after '--' (keys allow --name NAME -- KEY).
    """
    request = KeysAllow(name=check_name(name), public_key=check_public_key(public_key))
    state_dir = ensure_state_dir(obj.state_dir)
    # A key has one name: allowed under another, it moves here. Say so, or the old name
    # (a worker's, `local`) is gone from the list with nothing said.
    before = _change(state_dir, KeysList()).clients
    _change(state_dir, request)
    moved = sorted(n for n, k in before.items() if k == request.public_key and n != request.name)
    renamed = f" (no longer as {', '.join(moved)}: a key has one name)" if moved else ""
    say(f"allowed {name}{renamed}")


@keys_group.command()
@click.argument("name_or_key", type=GIVEN_TEXT)
@click.pass_obj
@user_errors
def revoke(obj: Ctx, name_or_key: str) -> None:
    """Stop admitting the key named NAME_OR_KEY (or with that public key); applies at once."""
    request = validate_request(KeysRevoke, {"name": name_or_key.strip()})  # '' is a BadRequest
    _change(ensure_state_dir(obj.state_dir), request)
    say(f"revoked {name_or_key}")


def _readable_state_dir(state_dir: Path) -> Path:
    """The state dir as a read-only command takes it: checked as `ensure_state_dir` checks it
    (a dir others could tamper with is refused), but never created nor tightened. `keys show`
    used to create a missing one (and chmod an existing one): a look that changed things."""
    untrusted = untrusted_state_dir(state_dir) if state_dir.exists() else None
    if untrusted is not None:
        raise untrusted
    return state_dir


def _allowed(state_dir: Path) -> dict[str, str]:
    """The allow-list file as it is (no node runs: the file is the list)."""
    return read_allowed(keys_dir(state_dir) / ALLOWED)


def _change(state_dir: Path, request: KeysAllow | KeysRevoke | KeysList) -> AllowedKeys:
    """Ask the node serving `state_dir` (it owns the allow-list), else edit the file."""
    if read_pid_file(state_dir) is not None:
        from subagents_node.client.client import connect

        with connect(ipc_endpoint(state_dir), timeout=10.0) as client:
            return client.ask(request, AllowedKeys)
    directory = keys_dir(state_dir)
    allowed = read_allowed(directory / ALLOWED)
    if isinstance(request, KeysAllow):
        allowed = allowing(allowed, request.name, request.public_key)
        write_allowed(directory / ALLOWED, allowed)
    elif isinstance(request, KeysRevoke):
        allowed, _ = revoking(allowed, request.name)
        write_allowed(directory / ALLOWED, allowed)
    server_path = directory / SERVER_KEY
    server = read_keypair(server_path).public if server_path.exists() else ""
    return AllowedKeys(server_public=server, clients=allowed)


COMMANDS = (keys_group,)
