"""The node's limit on open descriptors: lifted at `start`, judged for `start` and `doctor`.

Owns NODE_DESCRIPTOR_LIMIT, lifting the soft RLIMIT_NOFILE toward it (as far as the hard limit
lets), and the one warning a low hard limit deserves. Every client connection costs an owner a
descriptor (a `runs.watch` long poll holds one for its wait), and so does each live child (a
pidfd, a report link). When accept() meets EMFILE, libzmq aborts the whole owner process (an
assertion nothing can catch): the owner restarts, and is marked failed after repeated crashes.
Only the hard limit, which an unprivileged process cannot raise, makes that likely; an owner
killed by SIGABRT under a low limit has that named as the likely cause in its status reason.

It never lowers a limit and never raises the hard one. The limit it lifted is the one the
node's children start with (actors/child/template.py): a child runs with what the shell that
started the node would have given it, not with the node's own.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal

#: The soft limit on open descriptors a node asks for (the hard limit permitting): the run
#: supervisor holds a pidfd per live shim, and 1,000 children must not meet the common 1024.
NODE_DESCRIPTOR_LIMIT = 65_536
#: Below this hard limit a node may run out of descriptors in ordinary use (a few hundred
#: children and watchers); 300 `runs.watch` long polls under 256 crashed the run supervisor.
MIN_DESCRIPTORS = 4096
DESCRIPTOR_FIX = (
    "raise the hard limit in what starts the node: `ulimit -Hn 65536` as root in its shell, "
    "LimitNOFILE=65536 in its systemd unit, or a `nofile` line in /etc/security/limits.conf"
)


def raise_descriptor_limit() -> int | None:
    """Lift the soft RLIMIT_NOFILE toward NODE_DESCRIPTOR_LIMIT, as far as the hard limit lets
    (what a daemon manager would set); never lowers it. Returns the soft limit it lifted (what
    the node's children start with: NodeOptions.child_open_files), None when it lifted none."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = NODE_DESCRIPTOR_LIMIT if hard == resource.RLIM_INFINITY else hard
    wanted = min(NODE_DESCRIPTOR_LIMIT, ceiling)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return int(soft)
    return None


def low_hard_limit() -> int | None:
    """This process's hard limit on open files when it is below MIN_DESCRIPTORS, else None."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= MIN_DESCRIPTORS:
        return None
    return int(hard)


def low_limit_warning(hard: int) -> str:
    """What a hard limit of `hard` open files means for a node (one line)."""
    return (
        f"the hard limit on open files (ulimit -Hn) is {hard}, below {MIN_DESCRIPTORS}: a node "
        f"can hold only about that many client connections, watchers and children together, "
        f"and libzmq aborts an owner that runs out (too many open files), which then restarts "
        f"and may be marked failed"
    )


def descriptor_warnings() -> list[tuple[str, str]]:
    """(detail, fix) of `doctor`'s warning on this process's limit (a `start` from here
    inherits it), or nothing when it is high enough."""
    hard = low_hard_limit()
    return [] if hard is None else [(low_limit_warning(hard), DESCRIPTOR_FIX)]


def abort_cause(status: int) -> str:
    """What an owner's death by SIGABRT most likely means under a low limit on open files (the
    abort libzmq makes when accept() meets EMFILE; its own line went to the log), else ""."""
    if not os.WIFSIGNALED(status) or os.WTERMSIG(status) != signal.SIGABRT:
        return ""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)  # what the owner inherited
    if soft == resource.RLIM_INFINITY or soft >= MIN_DESCRIPTORS:
        return ""
    return (
        f" (most likely too many open files: libzmq aborts an owner that runs out, and the "
        f"limit on open files is {soft}; {DESCRIPTOR_FIX})"
    )
