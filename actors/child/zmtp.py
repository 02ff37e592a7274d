"""The shim's one connection to the run supervisor: a ZMTP 3.0 DEALER in plain sockets.

Owns the connection a shim reports over (`ReportLink`): connect to the supervisor's ROUTER
(`ipc://PATH` or `tcp://HOST:PORT`, mechanism NULL, as libzmq's DEALER would), send one frame
per message, read the one-frame answers. It exists because a libzmq context costs each shim two
threads and about half a MiB of private memory, and most of its start-up CPU, for one
connection that carries a few small frames: here a connection is one socket the shim's own
poll() watches, and nothing runs between events.

It keeps no queue (the shim resends its newest report itself), never blocks (a connect that
would wait, or a send that does not fit, drops the connection: the shim's retry makes a new
one), and ignores ZMTP commands after the handshake. Standard library only (the shim template
imports it). Speaks only what a libzmq ROUTER with default options needs (ZMTP/3.0 RFC 23).
"""

from __future__ import annotations

import contextlib
import socket
import struct

#: Signature, version 3.0, mechanism NULL, as-server 0, filler (RFC 23, "The greeting").
GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04


def _command(name: bytes, properties: dict[bytes, bytes]) -> bytes:
    body = bytes([len(name)]) + name
    for key, value in properties.items():
        body += bytes([len(key)]) + key + struct.pack(">I", len(value)) + value
    return _frame(body, _COMMAND)


def _frame(body: bytes, flags: int = 0) -> bytes:
    if len(body) < 256:
        return bytes([flags, len(body)]) + body
    return bytes([flags | _LONG]) + struct.pack(">Q", len(body)) + body


#: What a DEALER says once the greetings are exchanged.
READY = _command(b"READY", {b"Socket-Type": b"DEALER", b"Identity": b""})


def _address(endpoint: str) -> tuple[int, str | tuple[str, int]]:
    scheme, _, rest = endpoint.partition("://")
    if scheme == "ipc":
        return socket.AF_UNIX, rest
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        return socket.AF_INET6 if ":" in host else socket.AF_INET, (host.strip("[]"), int(port))
    raise ValueError(f"a shim cannot report to {endpoint!r} (ipc:// or tcp:// only)")


class ReportLink:
    """A DEALER's connection: `send(frame)` (True when handed to the kernel, or kept until
    the peer's greeting, read by `receive()`, lets it follow our READY), `fileno()` to poll for
    reading while `connected`, `receive()` for the answers that arrived."""

    def __init__(self, endpoint: str) -> None:
        self._family, self._where = _address(endpoint)
        self._sock: socket.socket | None = None
        self._inbox = b""
        self._greeted = False
        self._partial = False  # inside a multi-part message (skipped: answers are one frame)
        #: The message sent before the peer's greeting came: it follows our READY. (libzmq
        #: drops a message that arrives in the same burst as the greeting it answers.)
        self._pending: bytes | None = None

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def fileno(self) -> int:
        return -1 if self._sock is None else self._sock.fileno()

    def send(self, frame: bytes) -> bool:
        """Send one message, connecting first if need be; False when there is no peer to take
        it now (none listening, its backlog full, or the connection broke)."""
        if self._sock is None and not self._connect():
            return False
        if not self._greeted:
            self._pending = frame  # the newest: it supersedes one that waited
            return True
        return self._write(_frame(frame))

    def _write(self, data: bytes) -> bool:
        assert self._sock is not None
        try:
            self._sock.sendall(data)
        except OSError:  # BlockingIOError too: a send that does not fit is a dead peer's
            self.close()
            return False
        return True

    def receive(self) -> list[bytes]:
        """The messages that arrived (each one frame), reading what the socket holds; the
        connection is closed when the peer has gone (the caller resends on a new one)."""
        if self._sock is None:
            return []
        try:
            while chunk := self._sock.recv(65536):
                self._inbox += chunk
                if len(chunk) < 65536:
                    break
            else:
                self.close()  # EOF: the supervisor is gone
        except BlockingIOError:
            pass
        except OSError:
            self.close()
        was_greeted = self._greeted
        found = self._messages()
        if self._greeted and not was_greeted:  # the peer greeted us: our READY, then the rest
            pending, self._pending = self._pending, None
            self._write(READY + (b"" if pending is None else _frame(pending)))
        return found

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock, self._inbox, self._greeted, self._partial = None, b"", False, False
        self._pending = None

    def _connect(self) -> bool:
        sock = socket.socket(self._family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            sock.connect(self._where)
        except BlockingIOError:
            if self._family == socket.AF_UNIX:  # the listener's backlog is full: later
                sock.close()
                return False
            # tcp: in progress; what we send next waits in the kernel until it completes
        except OSError:
            sock.close()
            return False
        self._sock = sock
        return self._write(GREETING)

    def _messages(self) -> list[bytes]:
        found: list[bytes] = []
        data = self._inbox
        if not self._greeted:
            if len(data) < len(GREETING):
                return found
            if data[0] != 0xFF or data[9] & 0x01 != 0x01 or data[10] < 3:
                self.close()  # not a ZMTP 3 peer
                return found
            data, self._greeted = data[len(GREETING) :], True
        while len(data) >= 2:
            flags = data[0]
            if flags & _LONG:
                if len(data) < 9:
                    break
                size, start = struct.unpack(">Q", data[1:9])[0], 9
            else:
                size, start = data[1], 2
            if len(data) < start + size:
                break
            body, data = data[start : start + size], data[start + size :]
            if flags & _COMMAND:
                continue  # READY, PING: nothing a DEALER with default options must answer
            if not flags & _MORE and not self._partial:
                found.append(body)
            self._partial = bool(flags & _MORE)  # a multi-part message is skipped whole
        self._inbox = data
        return found
