"""How a command that launches gets a node: the one serving its state dir, else one it starts
(embedded for a foreground run, detached for a background one).

Owns the start and the race it can lose: several commands launched at once with no node
running each try to start one; the kernel lets one node claim the state dir and the others'
starts are refused. A background launch whose detached start was refused waits for the winner
to serve (the pid file it writes once serving, watched with inotify: an event, not a poll) and
uses it, bounded by `RACE_WAIT_S`; so does a foreground one whose embedded node's start was
refused (the winner may be another foreground run's embedded node, gone when that run ends:
the follow then starts a node of its own, which adopts the run). A command that only watches
(`logs -f`) waits for the state dir's next node the same way (`next_node`), never starting one.
An embedded node that other commands' runs still use when its own command ends hands them
over: once it stopped, a detached node starts and adopts them. It never starts a node when
`--address` names one, and never stops a node it did not start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from subagents_node.cli.common import Ctx, plural
from subagents_node.cli.terminal import one_line, say
from subagents_node.client.client import Client
from subagents_node.client.listing import every_run_plan
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.errors import NodeAlreadyRunning, NodeNotRunning, SubagentsError

#: How long a command whose node start lost the race waits for the winner to serve.
RACE_WAIT_S = 20.0


@contextlib.contextmanager
def node_client(obj: Ctx, ctx: LaunchContext, background: bool) -> Iterator[Client]:
    """A client for the node; starts one (embedded, or detached for background runs) if none.

    An embedded node gets the settings the launcher already loaded, the same a `start`ed node
    would load (reservation TTL, grant authority).
    """
    client = _answering(obj)
    if client is None and background:
        from subagents_node.node import daemon

        try:
            record = daemon.start_detached(obj.state_dir, [])
        except NodeAlreadyRunning:
            client = _wait_for_winner(obj)
            if client is None:
                raise
        else:
            say(
                f"started a node (pid {record['pid']}) for background runs; "
                "stop it with `subagents-node stop`",
                err=True,
            )
            client = obj.client()
    elif client is None:
        import logging

        from subagents_node.node.node import Node
        from subagents_node.node.nodelog import configure_stderr_log

        # What Python's last resort would print (warnings, their text alone), made inert: a
        # refusal may echo a field name any local client made up.
        configure_stderr_log(logging.WARNING, "%(message)s")
        settings = ctx.config.actor_settings()
        left = -1  # runs still going on this command's node when it stops (-1: none embedded)
        with contextlib.ExitStack() as stack:
            try:
                node = stack.enter_context(
                    Node.embedded(state_dir=obj.state_dir, settings=settings)
                )
            except NodeAlreadyRunning:
                # Another command's node won the state dir (a detached one starting, or
                # another foreground run's embedded one): use it. If it stops before this run
                # ends, the follow takes the dir over (runtime/cli/following.py, `reconnect`).
                client = _wait_for_winner(obj)
                if client is None:
                    raise
            else:
                own = node.client()
                try:
                    yield own
                finally:
                    left = _still_going(own)
        if left >= 0:
            if left:
                _hand_over(obj, left)
            return
    assert client is not None  # answering, started detached, or the race's winner
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def next_node(obj: Ctx, wait_s: float, gone: str) -> Iterator[Client]:
    """A client of the state dir's next node once it serves, waiting up to `wait_s` seconds for
    whoever starts it; NodeNotRunning with the message `gone` if none serves by then."""
    client = _wait_for_winner(obj, wait_s)
    if client is None:
        raise NodeNotRunning(gone, state_dir=str(obj.state_dir), waited_s=wait_s)
    try:
        yield client
    finally:
        client.close()


def _still_going(client: Client) -> int:
    """How many runs are still going on this command's embedded node: other commands' runs
    (a `run --async`, another foreground run) that found it serving, or one whose stop
    outlasted the wait. A paused run holds no process, so it needs no node to supervise it."""
    try:
        active = client.perform(every_run_plan(active_only=True)).runs  # all, not a page
        return sum(1 for run in active if run.state != "paused")
    except SubagentsError:
        return 0  # nothing to say which: the next node on the dir adopts them all the same


def _hand_over(obj: Ctx, count: int) -> None:
    """Runs outlived this command's embedded node: a detached node adopts them at once (their
    shims outlived the embedded one), so they stay supervised and their followers go on."""
    from subagents_node.node import daemon

    runs = plural(count, "run")
    them = "it" if count == 1 else "them"  # `1 run … to supervise them` read wrong
    try:
        record = daemon.start_detached(obj.state_dir, [])
    except NodeAlreadyRunning:
        return  # another command's node took the state dir over: it adopts them
    except SubagentsError as err:
        say(f"warning: {runs} left without a node: {one_line(err.message)}", err=True)
        return
    say(
        f"{runs} still going: started a node (pid {record['pid']}) to supervise {them}; "
        "stop it with `subagents-node stop`",
        err=True,
    )


def _answering(obj: Ctx, timeout: float = 2.0) -> Client | None:
    """A client of the node that answers now; None when none runs (and none was named)."""
    client = obj.client()
    try:
        client.ping(timeout=timeout)
    except BaseException as err:
        client.close()  # any other failure (a timeout, Ctrl-C) must not leak the socket
        if not isinstance(err, NodeNotRunning) or obj.address:
            raise
        return None
    return client


def _wait_for_winner(obj: Ctx, wait_s: float = RACE_WAIT_S) -> Client | None:
    """The node another command started meanwhile, once it serves; None if none does in time."""
    # Here, not at the top: ctypes (inotify's) would add a MiB to every node `start` forks.
    from subagents_node.client.nodewait import wait_for_node

    return wait_for_node(Path(obj.state_dir), lambda: _answering(obj), wait_s)
