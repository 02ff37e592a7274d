"""The fleet role of the node that served a state dir last, and the start that serves it again.

Owns reading a state dir's address book (`addressbook.json`, which a stop and a kill leave in
place) for that role: a home (and the tcp endpoint its workers join), a worker (its name and
home), or neither. The node reads it to refuse a start in another role (runtime/node/roles.py);
a client reads it to name the right `start` when no node runs there: a plain `start` on a
home's or a worker's dir is refused, so advising it sent the user to a second error.

It never writes the book, never starts a node, and never trusts the book for more than advice
and that refusal (a book it cannot read is no role: a plain start).
"""

from __future__ import annotations

import json
from pathlib import Path

from subagents_node.client.paths import ADDRESS_BOOK_NAME, ipc_path
from subagents_node.messages import statefiles


def last_book(state_dir: Path) -> dict[str, object]:
    """The address book the node that served `state_dir` last left ({}: none readable)."""
    try:
        book = json.loads(statefiles.read_file(state_dir / ADDRESS_BOOK_NAME))
    except (OSError, ValueError):
        return {}
    return book if isinstance(book, dict) else {}


def role_in(book: dict[str, object]) -> str:
    """ "home", "worker", or "" (alone, or no readable book)."""
    if "home" in book:
        return "home"
    owners = book.get("owners")
    if isinstance(owners, dict) and any(
        isinstance(owner, dict) and owner.get("state") == "remote" for owner in owners.values()
    ):
        return "worker"
    return ""


def last_role(state_dir: Path) -> str:
    """The role of the node that served `state_dir` last, as its address book says."""
    return role_in(last_book(state_dir))


def _text(value: object, default: str) -> str:
    return value if isinstance(value, str) and value and value.isprintable() else default


def start_advice(address: str) -> str:
    """What to run when no node serves `address`: `start` in the role the state dir had (a
    home's dir `start --home --listen ...`, a worker's `start --join ... --name ...`)."""
    path = ipc_path(address)
    book = last_book(path.parent) if path is not None else {}
    role = role_in(book)
    if role == "home":
        home = book.get("home")
        tcp = home.get("tcp") if isinstance(home, dict) else None
        listen = _text(tcp[0] if isinstance(tcp, list) and tcp else None, "tcp://HOST:PORT")
        return (
            "this state dir was a home node's: start it as the home again with "
            f"`subagents-node start --home --listen {listen}`"
        )
    if role == "worker":
        worker = book.get("worker")
        named = worker if isinstance(worker, dict) else {}
        name = _text(named.get("name"), "NAME")
        home_at = _text(named.get("home"), "tcp://HOME:PORT")
        return (
            f"this state dir was worker {name}'s: start it as that worker again with "
            f"`subagents-node start --join {home_at} --home-key KEY --name {name}`"
        )
    return "start one with `subagents-node start`"
