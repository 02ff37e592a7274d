"""`subagents-node keys generate|show|allow|revoke`: the CURVE keys of tcp listeners and clients.

Owns the command-line face of `client/keys.py`. While a node serves the state dir, `allow` and
`revoke` (and `show`'s allow-list) go to the node as `node.keys.*` requests over its ipc
socket, so the node, the allow-list's owner, writes the file and applies the change to the
next handshake; with no node running, the command edits the file itself. It never prints a
secret key.

    subagents-node keys generate [--force]     node.keys.allow {name: "local", public_key}
    subagents-node keys show [--json]          node.keys.list
    subagents-node keys allow KEY --name NAME  node.keys.allow {name, public_key}
    subagents-node keys revoke NAME_OR_KEY     node.keys.revoke {name}
"""

from __future__ import annotations

from pathlib import Path

import click

from subagents_node.cli.common import Ctx, emit, json_option, user_errors
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
    write_allowed,
    write_keypair,
)
from subagents_node.client.paths import ensure_state_dir, ipc_endpoint, read_pid_file
from subagents_node.messages.base import validate_request
from subagents_node.messages.errors import KeyFileInvalid
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
    help="Replace existing keys (clients must be re-allowed; restart a running node).",
)
@click.pass_obj
@user_errors
def generate(obj: Ctx, force: bool) -> None:
    """Create the server and client keypairs (0600) and allow this client as 'local'."""
    directory = keys_dir(ensure_state_dir(obj.state_dir))
    for name, role in ((SERVER_KEY, "server"), (CLIENT_KEY, "client")):
        path = directory / name
        if force or not path.exists():
            write_keypair(path, Keypair.generate(), role)
    client = read_keypair(directory / CLIENT_KEY)
    listing = _change(obj.state_dir, KeysAllow(name=LOCAL_NAME, public_key=client.public))
    click.echo(f"server key  {listing.server_public}")
    click.echo(f"client key  {client.public}  (allowed as {LOCAL_NAME!r})")


@keys_group.command()
@json_option
@click.pass_obj
@user_errors
def show(obj: Ctx, as_json: bool) -> None:
    """Show the server's and this client's public keys and the allow-list."""
    listing = _change(ensure_state_dir(obj.state_dir), KeysList())
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
    _change(ensure_state_dir(obj.state_dir), request)
    click.echo(f"allowed {name}")


@keys_group.command()
@click.argument("name_or_key")
@click.pass_obj
@user_errors
def revoke(obj: Ctx, name_or_key: str) -> None:
    """Stop admitting the key named NAME_OR_KEY (or with that public key); applies at once."""
    request = validate_request(KeysRevoke, {"name": name_or_key.strip()})  # '' is a BadRequest
    _change(ensure_state_dir(obj.state_dir), request)
    click.echo(f"revoked {name_or_key}")


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
        gone = [n for n, k in allowed.items() if request.name in (n, k)]
        if not gone:
            raise KeyFileInvalid(
                f"no allowed key is named {request.name!r}", path="", reason="unknown_key"
            )
        write_allowed(directory / ALLOWED, {n: k for n, k in allowed.items() if n not in gone})
        allowed = read_allowed(directory / ALLOWED)
    server_path = directory / SERVER_KEY
    server = read_keypair(server_path).public if server_path.exists() else ""
    return AllowedKeys(server_public=server, clients=allowed)


COMMANDS = (keys_group,)
