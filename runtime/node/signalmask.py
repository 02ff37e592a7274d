"""Which thread of a process running a node takes that process's signals: never the node's.

Owns the signal mask of the threads a node starts (its gateway, forwarder, owner supervisor,
timers, links): each blocks every asynchronous signal, as libzmq's own threads do, so the
kernel hands a signal sent to the process to one of the threads that were there before (the
main thread of `start`, of a foreground `run`, of a program embedding a node). A signal another
thread took ran its Python handler only once the main thread ran Python again: never, while it
waited in C (`start`'s wait for the stop: a hangup of its terminal was lost 1 run in ~8).

It never sets a handler and never changes the mask of a thread that exists already, bar the
caller's for the length of the block. An owner process, forked from a node thread, begins with
nothing blocked (runtime/node/ownerproc.py), and so does every child (actors/child/spawn.py).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

#: What the kernel raises in the thread that faults (or abort() in its caller), which no mask
#: may hold back: every other signal is one the node's threads leave to the process's own.
_SYNCHRONOUS = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGTRAP,
        signal.SIGSYS,
        signal.SIGABRT,
        signal.SIGKILL,
        signal.SIGSTOP,
    }
)
LEFT_TO_THE_PROCESS = frozenset(signal.valid_signals()) - _SYNCHRONOUS


@contextlib.contextmanager
def threads_started_here_block_signals() -> Iterator[None]:
    """Every thread started in the block (and every thread those start) blocks the signals in
    LEFT_TO_THE_PROCESS; the caller's own mask is as before once the block ends, and a signal
    that came meanwhile is taken then."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, LEFT_TO_THE_PROCESS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
