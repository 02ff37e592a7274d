"""AddressBook: where each owner is found, by the node's own links and by other processes.

Owns the node's routes (target -> endpoint: an owner's socket in the state dir, a worker's
route to its home's owner, else the node's own address), each built once and kept, since the
forwarder's and the relay's links ask once per request; and the address book file
(`addressbook.json` beside `node.pid`: the node's and each owner's endpoint, pid and state,
and on a home what its workers need), rewritten whole through a fresh temporary file so a
reader never sees half of it (and never through a symlink planted in the state dir). It never
starts, watches or tells an owner (runtime/node/ownersup.py and the node do) and never decides
when the book changes: the node says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from subagents_node.client.paths import ADDRESS_BOOK_NAME, OWNER_SOCKETS
from subagents_node.messages import statefiles
from subagents_node.node import ownerspecs


class AddressBook:
    """The routes of one node serving `state_dir`; `remote` are the owners its home serves."""

    def __init__(
        self,
        state_dir: Path,
        node_id: str,
        remote: frozenset[str],
        home_route: Callable[[str], str],
        node_address: Callable[[], str],
    ) -> None:
        self._state_dir = state_dir
        self._node_id = node_id
        self._remote = remote
        self._home_route = home_route
        # Read when a route is first asked for: the node knows its address once it listens.
        self._node_address = node_address
        self._routes: dict[str, str] = {}

    def route(self, target: str) -> str:
        """Where the links send a request for `target` (asked once per request: no paths
        built on the way)."""
        endpoint = self._routes.get(target)
        if endpoint is None:
            if target in self._remote:
                endpoint = self._home_route(target)
            elif target in OWNER_SOCKETS:
                endpoint = ownerspecs.owner_endpoint(self._state_dir, target)
            else:
                endpoint = self._node_address()
            self._routes[target] = endpoint
        return endpoint

    def write(
        self,
        owners: dict[str, dict[str, object]],
        home: dict[str, object] | None = None,
        worker: dict[str, object] | None = None,
    ) -> None:
        """Rewrite the file: `owners` as the owners' supervisor lists them, the home's owners
        added as `remote`, `home` (a home's word to its workers) and `worker` (a worker's name
        and home, which its next start must keep: runtime/node/roles.py) when given. A write
        that fails is skipped: the next change writes the whole book again."""
        for name in self._remote:
            owners[name] = {"endpoint": self.route(name), "pid": None, "state": "remote"}
        node = {"endpoint": self._node_address(), "pid": os.getpid(), "node_id": self._node_id}
        book: dict[str, object] = {"node": node, "owners": owners}
        if home is not None:
            book["home"] = home
        if worker is not None:
            book["worker"] = worker
        # A fresh temp file (messages/statefiles.py): a fixed `addressbook.json.tmp` that
        # someone made a symlink had the book written through it, over a file elsewhere.
        with suppress(OSError):
            data = json.dumps(book, indent=1).encode()
            statefiles.replace_file(self._state_dir / ADDRESS_BOOK_NAME, data, sync=False)
