"""IPv6 on a zmq socket: libzmq's IPV6 option, set for each endpoint just before it is used.

Owns one rule for every socket the node and its owners bind or connect: a bracketed IPv6 tcp
address (`tcp://[::1]:7700`) is bound or connected with the IPV6 option on, every other
address with it off. Off is libzmq's default, and with it libzmq resolves IPv4 only, so an
IPv6 address fails with "No such device". On for every address would not do either: libzmq
then binds `127.0.0.1` as the mapped `::ffff:127.0.0.1`, which the bound endpoint and every
peer's address would show. libzmq copies a socket's options at each bind and connect, so one
socket may bind an address of each kind.

It never binds or connects itself.
"""

from __future__ import annotations

from typing import Any

import zmq


def is_ipv6(endpoint: str) -> bool:
    """True for a tcp endpoint whose host is a bracketed IPv6 address."""
    return endpoint.startswith("tcp://[")


def ipv6_for(sock: zmq.Socket[Any], endpoint: str) -> None:
    """Set `sock`'s IPV6 option for its next bind or connect to `endpoint`."""
    sock.setsockopt(zmq.IPV6, 1 if is_ipv6(endpoint) else 0)
