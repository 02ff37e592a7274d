"""`Node.embedded()`: a node for the length of a `with` block, and what one with no state dir
of its own needs: a temporary one, and its runs ended before the directory goes.

Owns the block (its arguments checked before anything is created, the node started, then
stopped however the block ends), the temporary state dir's life and the stop of every run still
going in it when the `with` block ends: its shims outlive the node by design (a restarted
node adopts them), but nothing can adopt children whose state dir was deleted, so they would
run on unsupervised. It never touches a state dir the caller named: those runs stay for the
next node. Should the process die without leaving the block (kill -9), the shims of the runs
nobody would adopt stop their trees themselves: it binds them to the process at spawn
(`children_end_with_node`: every run with a temporary dir; with a named one, only a foreground
command's own run and what that run launched, actors/runs/binding.py; also when the node adopts
that run after taking a lost node's place, actors/runs/rebinding.py). A child forked inside the
block that leaves it ends nothing: the node, its runs and its directory are the parent's.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from subagents_node.client.client import Client
from subagents_node.client.listing import every_run_plan
from subagents_node.messages.errors import (
    BadRequest,
    NodeAlreadyRunning,
    NodeNotRunning,
    SubagentsError,
)
from subagents_node.node.optioncheck import check_options, check_state_dir

if TYPE_CHECKING:
    from subagents_node.node.node import Node

log = logging.getLogger(__name__)

#: How long the end of an embedded node's block waits for its runs to stop (their grace is
#: part of it); a run still going after that is left to its shim, and logged.
STOP_WAIT_S = 30.0


class Embedding(AbstractContextManager["Node"]):
    """What `Node.embedded(...)` returns: a block entered once. Entered again (a second `with`
    on the same object, nested or after the first ended), it raises `NodeAlreadyRunning` at
    once, as a `Node` started twice does; a generator's context manager said only
    `AttributeError: args`."""

    def __init__(
        self,
        node_class: type[Node],
        options_class: Callable[..., Any],
        state_dir: str | os.PathLike[str] | None,
        options: Mapping[str, object],
    ) -> None:
        self._block: AbstractContextManager[Node] | None = None
        self._entered = False
        self._args = (node_class, options_class, state_dir, options)

    def __enter__(self) -> Node:
        if self._entered:
            raise NodeAlreadyRunning(
                "this Node.embedded(...) block was entered already; call Node.embedded() again"
            )
        self._entered = True
        self._block = embedded(*self._args)
        node = self._block.__enter__()
        atexit.register(self._at_exit)
        return node

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        atexit.unregister(self._at_exit)
        block, self._block = self._block, None
        return None if block is None else block.__exit__(kind, exc, tb)

    def _at_exit(self) -> None:
        """The process ends with the block still open (`Node.embedded().__enter__()` kept in a
        global, a `with` in a generator never finished): it is left now, while the node's
        threads still run. Left to the collector, the block ended during the interpreter's
        finalization, asking a node whose threads no longer ran: the process never exited.
        (In a forked child, leaving it stops nothing: the node is the parent's.)"""
        self.__exit__(None, None, None)


@contextmanager
def embedded(
    node_class: type[Node],
    options_class: Callable[..., Any],
    state_dir: str | os.PathLike[str] | None,
    options: Mapping[str, object],
) -> Iterator[Node]:
    """The block of `Embedding`: every argument is checked before the temporary directory is
    made; the node is stopped however the block ends (its runs first, when the directory is
    temporary)."""
    check_state_dir(state_dir)
    known = {f.name for f in dataclasses.fields(cast(Any, options_class))} - {"state_dir"}
    unknown = sorted(set(options) - known)
    if unknown:  # named, as any argument is (TypeError's text named it, in no field)
        raise BadRequest(
            f"Node.embedded(): {unknown[0][:80]!r} is not an option of NodeOptions "
            f"(known: {', '.join(sorted(known))})",
            reason="argument",
            field=unknown[0][:80],
        )
    check_options(options_class(state_dir=None, **options))
    # Should this process die with -9 (nothing stops its runs then), the children nobody would
    # adopt die with it: every one in a temporary dir; a foreground command's own run in a
    # named one (actors/runs/binding.py). A program may say otherwise.
    bound = {"children_end_with_node": "all" if state_dir is None else "foreground"}
    owner = os.getpid()
    with temporary_state_dir(state_dir, owner) as directory:
        node = node_class(options_class(state_dir=directory, **{**bound, **options}))
        node.start()
        try:
            yield node
        finally:
            # A child forked inside the block leaves it too (sys.exit, an exception): the
            # node, its runs and its directory are the parent's, which goes on serving.
            if os.getpid() == owner:
                end(node, stop_runs=state_dir is None)


def end(node: Node, stop_runs: bool) -> None:
    """The end of the block: its runs stopped first when `stop_runs`, then the node."""
    try:
        if stop_runs:  # its shims would outlive the temporary directory they write to
            with suppress(NodeNotRunning):  # the block stopped it itself
                stop_running(node.client())
    finally:  # a second Ctrl-C while its runs stop must not leave the node serving
        node.stop()


@contextmanager
def temporary_state_dir(state_dir: str | os.PathLike[str] | None, owner: int) -> Iterator[Path]:
    """`state_dir` as it is, or a fresh temporary directory removed afterwards by process
    `owner` only (no finalizer: a forked child's exit must never remove the parent's)."""
    if state_dir is not None:
        yield Path(state_dir)
        return
    tmp = Path(tempfile.mkdtemp(prefix="subagents-"))
    try:
        yield tmp
    finally:
        if os.getpid() == owner:
            try:
                shutil.rmtree(tmp)
            except FileNotFoundError:
                pass
            except OSError as err:  # never raised over how the block itself ended
                log.warning("embedded node: cannot remove its state dir %s: %s", tmp, err)


def stop_running(client: Client, wait_s: float = STOP_WAIT_S) -> None:
    """Stop every run still going and wait until each settled (bounded by `wait_s`)."""
    deadline = time.monotonic() + wait_s
    try:
        going = client.perform(every_run_plan(active_only=True)).runs  # all, not a page
    except SubagentsError as err:
        log.warning("embedded node: cannot list its runs to stop them: %s", err.message)
        return
    for run in going:
        with suppress(SubagentsError):
            client.runs.stop(run.run_id)
    for run in going:
        left = deadline - time.monotonic()
        try:
            client.runs.wait(run.run_id, timeout=max(0.1, left))
        except SubagentsError as err:
            log.warning("embedded node: run %s did not stop: %s", run.run_id, err.message)
