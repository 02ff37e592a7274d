"""A process out of file descriptors, told as one typed error instead of whatever failed.

Owns the translation of EMFILE and ENFILE (from the OS or from libzmq, which reports them with
the same numbers) into `OutOfDescriptors`, where a client opens something to reach its node: a
zmq context or socket, the node's pid record, /proc, and the module a ledger API imports on its
first use (`client.capacity`, ...). Before, such a client said the node's socket was stale (an
unreadable pid record read as a dead node) or raised libzmq's or Python's own error.

It must never open anything itself (it runs when nothing more can be opened) and never imports
the node's code.
"""

from __future__ import annotations

import errno
import resource
from collections.abc import Iterator
from contextlib import contextmanager

from subagents_node.messages.errors import OutOfDescriptors

_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


def exhausted(exc: BaseException) -> OutOfDescriptors | None:
    """The typed error for `exc` when it says no descriptor was left; None otherwise."""
    code = getattr(exc, "errno", None)
    if code not in _EXHAUSTED:
        return None
    if code == errno.ENFILE:
        return OutOfDescriptors(
            "the system is out of file descriptors (ENFILE): nothing was sent to the node; "
            "retry once other processes have closed some",
            limit=None,
        )
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = None if soft == resource.RLIM_INFINITY else soft
    cap = f"its limit is {limit} open files" if limit is not None else "the kernel's own cap"
    return OutOfDescriptors(
        f"this process is out of file descriptors ({cap}): nothing was sent to the node; "
        "close some, or raise the limit (`ulimit -n`)",
        limit=limit,
    )


@contextmanager
def descriptors_needed() -> Iterator[None]:
    """Raise `OutOfDescriptors` for an EMFILE or ENFILE inside the block (an OSError, or
    libzmq's ZMQError, which carries the same errno); let everything else through."""
    try:
        yield
    except Exception as exc:
        typed = exhausted(exc)
        if typed is None:
            raise
        raise typed from exc
