"""CURVE key files and the allow-list file: their names, their format, reading and writing.

Owns the on-disk shape of the keys DESIGN §3 asks for. Every file lives in `<state>/keys/`
(mode 0700), is written atomically (a temp file in the same dir, then a rename) with mode 0600,
and is TOML, so a person can read it:

- `server.key`: the node's keypair (`public`, `secret`, z85 text from `zmq.curve_keypair`). A
  tcp listener serves with it; clients need only its `public` half.
- `client.key`: this user's client keypair, offered by a tcp client of this state dir.
- `allowed.toml`: the allow-list, `[clients]` name = public key. Only the node writes it while it
  runs (`keys allow|revoke` ask the node, which applies the change at once); with no node
  running the command writes it itself.

A keypair file holds a secret, so it is read only when it is private, the way ssh reads an
identity file: a regular file owned by the current user and neither readable nor writable by
the group or others. Anything else is refused (`KeyFileInvalid`, reason `unsafe_key_file`,
one line naming the file and the fix), never used and never repaired: whoever else could read
it may already hold the secret, and whoever could write it may have planted their own key.
Public keys (a `--home-key`, `$SUBAGENTS_SERVER_KEY`) are text, not files, and need no check.

Both the node and clients import this module, so it stays light (zmq only; tomllib when a
file is read) and never talks to a node. It never logs a secret key.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq

from subagents_node.messages.errors import KeyFileInvalid
from subagents_node.messages.statefiles import replace_file

KEYS_DIR = "keys"
SERVER_KEY = "server.key"
CLIENT_KEY = "client.key"
ALLOWED = "allowed.toml"
#: The z85 text of a 32-byte CURVE key is exactly 40 characters of this alphabet.
_Z85 = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
#: A principal's name: what logs show for an authenticated tcp peer.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


@dataclass(frozen=True, slots=True)
class Keypair:
    public: str
    secret: str

    @classmethod
    def generate(cls) -> Keypair:
        public, secret = zmq.curve_keypair()
        return cls(public.decode("ascii"), secret.decode("ascii"))


@dataclass(frozen=True, slots=True)
class ClientCredentials:
    """What a tcp client needs: its own keypair and the server's public key. `process_only`
    keys (a node's own, runtime/node/curve.py) stay in this process and its forks: a pickled
    client leaves them behind and needs keys of its own."""

    client: Keypair
    server_public: str
    process_only: bool = False


def keys_dir(state_dir: Path) -> Path:
    return state_dir / KEYS_DIR


def check_public_key(text: str) -> str:
    """A z85 CURVE public key (40 characters), or KeyFileInvalid naming what is wrong."""
    key = text.strip()
    if not _Z85.fullmatch(key):
        found = (
            f"{len(key)} characters"
            if len(key) != 40
            else f"{next(c for c in key if not _Z85.fullmatch(c * 40))!r}, which z85 does not use"
        )
        raise KeyFileInvalid(
            f"not a CURVE public key: expected 40 characters of z85 text (got {found})",
            path="",
            reason="public_key",
        )
    return key


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise KeyFileInvalid(
            f"bad key name {name[:80]!r}: 1-64 letters, digits, '_', '.', '@' or '-', "
            "starting with a letter or digit",
            path="",
            reason="name",
        )
    return name


def read_keypair(path: Path) -> Keypair:
    """The keypair in the file at `path`, refused unless the file is private (see above)."""
    _check_private(path)
    table = _read_toml(path)
    public, secret = table.get("public"), table.get("secret")
    if not isinstance(public, str) or not isinstance(secret, str):
        raise KeyFileInvalid(
            f"{path} has no 'public' and 'secret' keys", path=str(path), reason="format"
        )
    for value in (public, secret):
        if not _Z85.fullmatch(value):
            raise KeyFileInvalid(
                f"{path} holds a key that is not 40 characters of z85 text",
                path=str(path),
                reason="format",
            )
    # Halves of two keypairs (a hand edit, a copy-paste) passed: a node served the secret and
    # published the other public key, and every client was refused as if not allowed.
    if zmq.curve_public(secret.encode()).decode() != public:
        raise KeyFileInvalid(
            f"{path}: its public key is not the public half of its secret key (two keypairs "
            "mixed?); make a new one with `subagents-node keys generate --force`",
            path=str(path),
            reason="mismatch",
        )
    return Keypair(public, secret)


def write_keypair(path: Path, pair: Keypair, role: str) -> None:
    text = (
        f"# subagents-node CURVE {role} keypair (keep secret; mode 0600)\n"
        f'public = "{pair.public}"\nsecret = "{pair.secret}"\n'
    )
    write_private(path, text)


def read_allowed(path: Path) -> dict[str, str]:
    """The allow-list: name -> client public key (a missing file is an empty list)."""
    if not path.exists():
        return {}
    clients = _read_toml(path).get("clients", {})
    if not isinstance(clients, dict):
        raise KeyFileInvalid(f"{path}: [clients] must be a table", path=str(path), reason="format")
    allowed: dict[str, str] = {}
    for name, key in clients.items():
        if not isinstance(key, str) or not _Z85.fullmatch(key) or not _NAME.fullmatch(name):
            raise KeyFileInvalid(
                f'{path}: entry {name[:80]!r} is not name = "<40-character z85 public key>"',
                path=str(path),
                reason="format",
            )
        allowed[name] = key
    return allowed


def allowing(
    allowed: Mapping[str, str], name: str, public_key: str, replace: bool = False
) -> dict[str, str]:
    """The allow-list with `public_key` admitted as `name` (an old name of that key goes).
    A name that admits another key is refused: replacing it silently would lock out whoever
    holds that key (the node's own `local` one, say); revoke it first. `replace` is that
    revocation, asked for: the name's old key goes in the same change (a key rotation)."""
    name, key = check_name(name), check_public_key(public_key)
    held = allowed.get(name)
    if held is not None and held != key and not replace:
        raise KeyFileInvalid(
            f"the name {name!r} already admits another key; revoke it first "
            f"(`subagents-node keys revoke {name}`) or choose another name",
            path="",
            reason="name_taken",
        )
    updated = {n: k for n, k in allowed.items() if k != key and n != name}
    updated[name] = key
    return updated


def revoking(allowed: Mapping[str, str], name_or_key: str) -> tuple[dict[str, str], list[str]]:
    """The allow-list without the keys that `name_or_key` names (a name, or the key itself),
    under whatever name each is listed (a file edited by hand may list one key twice: revoking
    one name left the key admitted under the other); and the names that went."""
    keys = {k for n, k in allowed.items() if name_or_key in (n, k)}
    if not keys:
        raise KeyFileInvalid(
            f"no allowed key is named {name_or_key[:80]!r}", path="", reason="unknown_key"
        )
    return {n: k for n, k in allowed.items() if k not in keys}, [
        n for n, k in allowed.items() if k in keys
    ]


def write_allowed(path: Path, allowed: Mapping[str, str]) -> None:
    lines = ["# subagents-node: client public keys admitted over tcp (name = key)", "[clients]"]
    lines += [f'"{name}" = "{key}"' for name, key in sorted(allowed.items())]
    write_private(path, "\n".join(lines) + "\n")


def write_private(path: Path, text: str) -> None:
    """Write `text` atomically with mode 0600 (the temp file is 0600 from its creation, of a
    name nobody can foresee: `.<name>.<pid>.tmp` was opened as found, and a FIFO planted
    under the node's pid held `keys allow` in open() for good)."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        replace_file(path, text.encode(), mode=0o600)  # its temp file goes if the write fails
    except OSError as exc:
        # A full disk's error named no file: "No space left on device".
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def client_credentials(
    state_dir: Path, server_key: str | None = None, client_file: str | None = None
) -> ClientCredentials:
    """The client keypair (`client_file`, else the state dir's) and the server's public key
    (`server_key`, else the public half of the state dir's server key)."""
    directory = keys_dir(state_dir)
    client = read_keypair(Path(client_file).expanduser() if client_file else directory / CLIENT_KEY)
    if server_key:
        try:
            server = check_public_key(server_key)
        except KeyFileInvalid as err:
            message = f"server key: {err.message}"
            raise KeyFileInvalid(message, path="", reason="public_key") from None
    else:
        server = read_keypair(directory / SERVER_KEY).public
    return ClientCredentials(client, server)


def _check_private(path: Path) -> None:
    """Refuse a secret key file another user owns, or the group or others may read or write."""
    try:
        info = path.stat()
    except OSError:
        return  # reading it says why (missing, unreadable) in the caller's words
    if not stat.S_ISREG(info.st_mode):
        return  # no file (a FIFO, a directory): reading it says so; no chmod would help
    if info.st_uid != os.geteuid():
        raise KeyFileInvalid(
            f"refusing key file {path}: it is owned by uid {info.st_uid}, not by you "
            f"(uid {os.geteuid()}); copy it to a file of your own and `chmod 600` that",
            path=str(path),
            reason="unsafe_key_file",
            fix="copy it to a file of your own, then chmod 600 that file",
        )
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileInvalid(
            f"refusing key file {path}: it holds a secret key and is open to group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); fix with `chmod 600 {path}`",
            path=str(path),
            reason="unsafe_key_file",
            fix=f"chmod 600 {path}",
        )


def _read_toml(path: Path) -> dict[str, object]:
    from subagents_node.client.files import load_toml

    try:
        return load_toml(path)
    except FileNotFoundError:
        raise KeyFileInvalid(
            f"no key file {path}; create the keys with `subagents-node keys generate`",
            path=str(path),
            reason="missing",
        ) from None
    except OSError as exc:
        raise KeyFileInvalid(
            f"cannot read {path}: {exc.strerror or exc}", path=str(path), reason="io"
        ) from None
    except ValueError as exc:
        raise KeyFileInvalid(f"cannot read {path}: {exc}", path=str(path), reason="io") from None
