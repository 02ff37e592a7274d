"""CurveGuard: CURVE for the node's tcp listener and the ZAP handler that admits its peers.

Owns the node's server keypair (created when a tcp listener first needs it; a `keys` listing
never creates it), its reading of the allow-list (the file `<state>/keys/allowed.toml`, name ->
client public key, is the list: see "the file" below), and the ZAP socket
(`inproc://zeromq.zap.01`, RFC 27: actors/zap.py) of the node's zmq context. Every tcp ROUTER
the gateway binds is a CURVE server (DESIGN §3, loopback included); libzmq asks this handler
about each peer's handshake, and the handler admits only a key on the allow-list, answering
with the key itself as the ZAP User-Id: the gateway reads it from each frame, maps it to the
key's name (refusing the frame once the key is revoked) and logs that name as the request's
principal. On a home, the node tells its ledger owners the same allow-list (`owner.peers`):
each owner's own tcp socket has its own handler (actors/peergate.py).

Why our own ZAP socket and not pyzmq's ThreadAuthenticator: the socket is polled by the
gateway's I/O thread beside its ROUTERs, so it needs no extra thread, and a change applies to
the next handshake, with no restart and no file watching (a `stat` of the file before each
batch of handshakes). The gateway maps each frame's key to its name without a lock (each change
swaps in a whole new mapping); the changes (`keys allow|revoke`, `node.keys.*` requests) are
served in the gateway thread for a socket's clients, but in the caller's own thread for a
program's in-process client, so they, and a reading of the file, are made one at a time under
`_changing`: several at once each read the list, wrote the file and swapped theirs in, and all
but the last were lost. ipc sockets have no security mechanism
and never reach the handler with CURVE: the state dir's 0700 mode is their guard.

The node's own clients (`Node.client("zmq")`, a forked child's in-process client) offer an
ephemeral keypair made here for this node's life: admitted in memory only, as `OWN_PRINCIPAL`
(no key name can be that, so no allow-list entry or worker stands for it), never written to
`allowed.toml` and never in a `keys show` listing. A tcp-only node (`ipc=False`) has no other
way in for them, and another process still needs a key of its own on the allow-list. It is made
before the gateway starts and never changes, so the gateway thread reads it without a lock.

It never logs a secret key, and never admits a peer whose mechanism is not CURVE on the tcp
domain.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import zmq

from subagents_node.actors import zap
from subagents_node.actors.owner import Outcome
from subagents_node.client.keys import (
    ALLOWED,
    SERVER_KEY,
    ClientCredentials,
    Keypair,
    allowing,
    keys_dir,
    read_allowed,
    read_keypair,
    revoking,
    write_allowed,
    write_keypair,
)
from subagents_node.messages.base import Request
from subagents_node.messages.errors import BadRequest, KeyFileInvalid
from subagents_node.messages.keys import AllowedKeys, KeysAllow, KeysList, KeysRevoke

log = logging.getLogger(__name__)

#: The principal of the node's own clients over tcp: parentheses are outside the key-name
#: grammar (client/keys.py), so no allowed key or worker can be named so.
OWN_PRINCIPAL = "(node)"


def server_keypair(state_dir: Path) -> Keypair:
    """The node's CURVE keypair, created (0600) the first time a tcp listener needs it."""
    path = keys_dir(state_dir) / SERVER_KEY
    if not path.exists():
        write_keypair(path, Keypair.generate(), "server")
        log.info("created the node's CURVE server key %s", path)
    return read_keypair(path)


class CurveGuard:
    """The allow-list and the ZAP handler: the handler runs in the gateway's I/O thread, a
    change in whichever thread serves its request, one at a time."""

    def __init__(
        self,
        state_dir: Path,
        listens_on_tcp: bool = True,
        on_reread: Callable[[], None] = lambda: None,
    ) -> None:
        self._state_dir = state_dir
        #: Called when a reading of the file changed the list (`refresh`, in the gateway
        #: thread): a home tells its ledger owners, whose own tcp sockets admit the same keys.
        self._on_reread = on_reread
        self._server: Keypair | None = None
        self._allowed_path = keys_dir(state_dir) / ALLOWED
        #: Held while the allow-list is read, written and swapped in (allow, revoke, a reload).
        self._changing = threading.Lock()
        #: The file as last read (`_signature`), and the last one found unreadable, which is
        #: logged once, not at each handshake.
        self._read_as: tuple[int, ...] | None = None
        self._unreadable: tuple[int, ...] | None = None
        try:
            self._allowed = self._read_file()
        except KeyFileInvalid as err:
            # An allow-list it cannot read leaves a tcp listener nobody to admit, or whoever a
            # stale reading named: such a node does not start. One that listens on ipc only
            # has no use for it until it does (and its `keys allow|revoke` refuse till then).
            if listens_on_tcp:
                raise
            log.warning("%s (this node listens on no tcp endpoint: it serves)", err.message)
            self._allowed = {}
        self._sock: zmq.Socket[bytes] | None = None
        #: The node's own clients' keypair: memory only, gone with this node (see above).
        self._own = Keypair.generate()

    @property
    def server(self) -> Keypair:
        """The server keypair, created the first time something needs it (a tcp listener)."""
        if self._server is None:
            self._server = server_keypair(self._state_dir)
        return self._server

    def own_credentials(self) -> ClientCredentials:
        """What the node's own clients offer its tcp listener (called once one serves, so the
        server key exists: the gateway read it before it said it was ready)."""
        return ClientCredentials(self._own, self.server.public, process_only=True)

    # -- the allow-list (keys allow / revoke) ------------------------------------------------

    def serve(self, request: Request) -> Outcome:
        """Answer a `node.keys.*` request (called in the gateway thread, like every node.*)."""
        try:
            if isinstance(request, KeysAllow):
                self.allow(request.name, request.public_key)
            elif isinstance(request, KeysRevoke):
                self.revoke(request.name)
            elif not isinstance(request, KeysList):
                return BadRequest(f"not a keys request: {request.type}", reason="wrong_target")
            server_public = self._server_public()
        except KeyFileInvalid as err:
            return err
        except OSError as exc:
            return KeyFileInvalid(
                f"cannot write {self._allowed_path}: {exc.strerror or exc}",
                path=str(self._allowed_path),
                reason="io",
            )
        return AllowedKeys(server_public=server_public, clients=self.allowed)

    def _server_public(self) -> str:
        """The server key's public half, or "" when there is none: answering `keys show`,
        `allow` or `revoke` never creates it (only `keys generate` and a tcp listener do), so
        the listing is the same whether a node runs or not."""
        if self._server is not None:
            return self._server.public
        path = keys_dir(self._state_dir) / SERVER_KEY
        return read_keypair(path).public if path.exists() else ""

    @property
    def allowed(self) -> dict[str, str]:
        return dict(self._allowed)

    def allow(self, name: str, public_key: str) -> None:
        with self._changing:
            # From the file as it is now: an entry added to it by hand since is kept, never
            # overwritten by the node's older copy.
            updated = allowing(self._read_file(), name, public_key)
            self._write_file(updated)  # durable before it takes effect
            self._allowed = updated
        log.info("tcp key allowed: %s (%s)", name, updated[name])

    def revoke(self, name_or_key: str) -> list[str]:
        """Remove the keys `name_or_key` names, under every name (`revoking`); their names."""
        with self._changing:
            updated, gone = revoking(self._read_file(), name_or_key)
            self._write_file(updated)
            self._allowed = updated
        log.info("tcp key revoked: %s", ", ".join(gone))
        return gone

    # -- the file ------------------------------------------------------------------------------
    # The file is the allow-list; the node's copy is what it last read or wrote. A change
    # starts from the file as it is (a hand edit made while the node runs is kept), and each
    # tcp handshake takes in a file changed since (`refresh`): a key removed by hand is refused
    # from the next handshake of any peer on (and then frame by frame, as after `revoke`).

    def _signature(self) -> tuple[int, ...] | None:
        try:
            st = os.stat(self._allowed_path)
        except FileNotFoundError:
            return None
        except OSError:
            return (-1,)  # unreadable: read_allowed says why
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _read_file(self) -> dict[str, str]:
        signature = self._signature()
        allowed = read_allowed(self._allowed_path)
        self._read_as = signature
        return allowed

    def _write_file(self, allowed: dict[str, str]) -> None:
        write_allowed(self._allowed_path, allowed)
        self._read_as = self._signature()

    def refresh(self) -> None:
        """Take in the file if it changed since it was last read or written. One it cannot
        read leaves the last good list in force, logged once (a half-saved edit must neither
        lock every peer out nor let a removed one in: `keys allow|revoke` say what is wrong)."""
        with self._changing:
            signature = self._signature()
            if signature == self._read_as or signature == self._unreadable:
                return
            try:
                updated = read_allowed(self._allowed_path)
            except KeyFileInvalid as err:
                self._unreadable = signature
                log.error("%s; the allow-list read before stays in force", err.message)
                return
            self._read_as, self._unreadable = signature, None
            if updated == self._allowed:
                return
            log.info("tcp allow-list read again from %s (edited)", self._allowed_path)
            self._allowed = updated
        self._on_reread()

    # -- sockets -----------------------------------------------------------------------------

    def make_server(self, sock: zmq.Socket[bytes]) -> None:
        """Turn a ROUTER, before it binds, into a CURVE server judged by this handler."""
        zap.make_server(sock, self.server.secret)

    def open(self, zctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        self._sock = zap.open_handler(zctx)
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def handle(self) -> None:
        """Answer every waiting ZAP request (RFC 27: 200 admits, 400 refuses)."""
        assert self._sock is not None
        self.refresh()
        zap.answer(self._sock, self._name_of)

    def _name_of(self, key: str) -> str | None:
        if key == self._own.public:
            return OWN_PRINCIPAL
        return next((n for n, k in self._allowed.items() if k == key), None)

    def principal(self, user_id: str) -> str | None:
        """The allow-listed name of an authenticated key, or None once it is revoked."""
        return self._name_of(user_id)
