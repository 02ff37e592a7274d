"""The client side of `bench/claims.py`: one timed call per ledger operation, ours and theirs.

Each factory runs inside a spawned client process (`bench.clientpool`): it takes its fixed
arguments through `functools.partial` and the address last, builds what its call needs once, and
returns `(call, close)`. A call returns `REJECTED` when the ledger refused it for its limit and
raises for anything else (the pool counts those as errors). Paths and run ids embed the pid,
so concurrent clients never collide. Nothing here measures or reports.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

from bench.clientpool import REJECTED
from bench.common import Call
from bench.filelock_ledger import (
    CapacityFull,
    FileLockCapacity,
    FileLockFanout,
    LimitRejected,
)

Closer = Callable[[], None]


def _paths(batch: int) -> Callable[[], list[str]]:
    counter = itertools.count()
    prefix = f"p{os.getpid()}"

    def next_batch() -> list[str]:
        n = next(counter)
        return [f"{prefix}/tasks[{n}]/{j}" for j in range(batch)]

    return next_batch


# -- fan-out claims -----------------------------------------------------------------------------


def our_claims(descriptor: str, batch: int, address: str) -> tuple[Call, Closer]:
    """`client.fanout.claim(desc, paths)` over ipc: the public API, validation included."""
    from subagents_node.client.client import connect
    from subagents_node.messages.errors import FanoutLimitExceeded
    from subagents_node.messages.fanout import decode_descriptor

    client = connect(address)
    desc = decode_descriptor(descriptor)
    next_batch = _paths(batch)

    def call() -> object:
        try:
            return client.fanout.claim(desc, next_batch())
        except FanoutLimitExceeded:
            return REJECTED

    return call, client.close


def filelock_claims(batch: int, budget_dir: str) -> tuple[Call, Closer]:
    """`FileLockFanout.claim(paths)` on a budget directory shared by every client process."""
    ledger = FileLockFanout(Path(budget_dir))
    next_batch = _paths(batch)

    def call() -> object:
        try:
            return ledger.claim(next_batch())
        except LimitRejected:
            return REJECTED

    return call, lambda: None


def our_claims_rotating(descriptors: tuple[str, ...], address: str) -> tuple[Call, Closer]:
    """Single-path claims on each budget in turn: request i goes to budget i mod len."""
    from subagents_node.client.client import connect
    from subagents_node.messages.errors import FanoutLimitExceeded
    from subagents_node.messages.fanout import decode_descriptor

    client = connect(address)
    budgets = itertools.cycle([decode_descriptor(d) for d in descriptors])
    next_batch = _paths(1)

    def call() -> object:
        try:
            return client.fanout.claim(next(budgets), next_batch())
        except FanoutLimitExceeded:
            return REJECTED

    return call, client.close


def filelock_claims_rotating(budget_dirs: tuple[str, ...], _unused: str) -> tuple[Call, Closer]:
    """`FileLockFanout.claim` of one path on each budget directory in turn."""
    budgets = itertools.cycle([FileLockFanout(Path(d)) for d in budget_dirs])
    next_batch = _paths(1)

    def call() -> object:
        try:
            return next(budgets).claim(next_batch())
        except LimitRejected:
            return REJECTED

    return call, lambda: None


# -- capacity: acquire + rollback ---------------------------------------------------------------


def _session(shared_session: str) -> str:
    return shared_session or f"bench-session-{os.getpid()}"


def our_cycles(shared_session: str, limit: int, address: str) -> tuple[Call, Closer]:
    """`client.capacity.acquire(...)` then `handle.rollback()`: one cycle, two requests.

    `shared_session` empty: a session of its own per client process.
    """
    from subagents_node.client.client import connect
    from subagents_node.messages.errors import CapacityExhausted

    client = connect(address)
    session_id = _session(shared_session)
    run_id = f"bench-run-{os.getpid()}"

    def call() -> object:
        try:
            handle = client.capacity.acquire(session_id=session_id, limit=limit, run_id=run_id)
        except CapacityExhausted:
            return REJECTED
        if handle is None or not handle.rollback():
            raise RuntimeError(f"the rollback of {handle} was refused")
        return None

    return call, client.close


def filelock_cycles(shared_session: str, limit: int, root: str) -> tuple[Call, Closer]:
    """`FileLockCapacity.acquire` then `.rollback` on a session pool directory under `root`."""
    base = Path(root)
    ledger = FileLockCapacity(base / "pools" / _session(shared_session), base / "runs")
    run_id = f"bench-run-{os.getpid()}"

    def call() -> object:
        try:
            index = ledger.acquire(run_id, limit)
        except CapacityFull:
            return REJECTED
        if not ledger.rollback(index):
            raise RuntimeError(f"the rollback of slot {index} was refused")
        return None

    return call, lambda: None
