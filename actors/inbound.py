"""Inbound bounds: how much a bound ROUTER socket (an owner's, the gateway's, a tombstone's)
may be made to hold for its peers before they must wait.

Owns two numbers and the one call that sets them. libzmq queues what a peer sends while the
socket's reader is busy: up to RCVHWM messages per connection, each of up to MAXMSGSIZE bytes,
all in the reader's process. With libzmq's own limits (or ours of 10,000 messages of 4 MiB)
four busy connections took an owner from 43 MiB to 1.7 GiB in seconds. Here a connection may
hold `INBOUND_HWM` frames of at most `wire_limit(max_frame)` bytes: past that libzmq stops
reading that connection, so a pipelining client's send waits (back-pressure, nothing dropped),
and a frame over the limit makes libzmq cut that connection unread.

It never binds, connects or reads a socket itself.
"""

from __future__ import annotations

from typing import Any

import zmq

#: Bytes past the frame cap a frame may have and still reach our decoder, which answers it
#: with a typed FrameTooLarge (size and limit); a bigger one is cut by libzmq unanswered.
WIRE_SLACK_BYTES = 64 << 10
#: Frames libzmq queues per connection for a busy reader before that peer's sends wait.
#: With 1 MiB frames that is at most ~34 MiB a connection; our clients, links and shims
#: have at most a few requests in flight on one connection, far below it.
INBOUND_HWM = 32


def wire_limit(max_frame: int) -> int:
    """The largest frame libzmq hands us for a decoder whose cap is `max_frame`."""
    return max_frame + WIRE_SLACK_BYTES


def bound_inbound(sock: zmq.Socket[Any], max_frame: int) -> None:
    """Set `sock`'s per-connection receive bounds (before it binds)."""
    sock.setsockopt(zmq.RCVHWM, INBOUND_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, wire_limit(max_frame))
