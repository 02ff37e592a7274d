"""The `subagents-node` command line (click).

Owns argument parsing and rendering only: every command is a client call (or a node start),
every user error is a one-line message with a non-zero exit code, never a traceback.
Exit codes: 1 refused by a ledger or invalid request, 2 bad usage or address, 3 node not
running, 4 node timeout.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import click

from messages.base import Message
from messages.errors import BadAddress, NodeNotRunning, NodeTimeout, SubagentsError
from runtime.client import Client, connect, default_address
from runtime.paths import ENV_STATE_DIR, resolve_state_dir

P = ParamSpec("P")
T = TypeVar("T")

EXIT_CODES: dict[type[SubagentsError], int] = {NodeNotRunning: 3, NodeTimeout: 4, BadAddress: 2}


class CliError(click.ClickException):
    def __init__(self, err: SubagentsError) -> None:
        super().__init__(err.message)
        self.exit_code = next(  # type: ignore[misc]
            (c for k, c in EXIT_CODES.items() if isinstance(err, k)), 1
        )
        self.error = err

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def user_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn typed errors into one-line messages with their exit code."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except SubagentsError as err:
            raise CliError(err) from None

    return wrapper


class Ctx:
    def __init__(self, state_dir: str | None, address: str | None, timeout: float) -> None:
        self.state_dir = resolve_state_dir(state_dir)
        self.explicit_state = state_dir is not None
        self.address = address
        self.timeout = timeout

    def client(self) -> Client:
        address = self.address or (
            default_address(self.state_dir) if self.explicit_state else default_address()
        )
        return connect(address, timeout=self.timeout)


def emit(data: Message | dict[str, Any], as_json: bool, text: str) -> None:
    if as_json:
        payload = data.model_dump(mode="json") if isinstance(data, Message) else data
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
    else:
        click.echo(text)


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    envvar=ENV_STATE_DIR,
    help=f"Node state directory (default: ${ENV_STATE_DIR}, else the XDG state dir).",
)
@click.option(
    "--address",
    envvar="SUBAGENTS_NODE",
    help="Node address, ipc://PATH or tcp://HOST:PORT (default: $SUBAGENTS_NODE, "
    "else the state dir's socket).",
)
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for a reply.")
@click.version_option("0.1.0", prog_name="subagents-node")
@click.pass_context
def cli(ctx: click.Context, state_dir: str | None, address: str | None, timeout: float) -> None:
    """Launch and supervise agent child processes under hard, single-owner ledgers."""
    ctx.obj = Ctx(state_dir, address, timeout)


@cli.command()
@click.option("--detach", is_flag=True, help="Run in the background; return once it serves.")
@click.option("--listen", multiple=True, help="Extra endpoint, e.g. tcp://127.0.0.1:7700.")
@click.option("--mailbox-limit", default=1024, show_default=True, help="Max queued per actor.")
@click.option("--faults", is_flag=True, hidden=True, envvar="SUBAGENTS_TEST_FAULTS")
@click.option("--ready-fd", type=int, hidden=True)
@click.option("--verbose", "-v", is_flag=True, help="Log at debug level.")
@click.pass_obj
@user_errors
def start(
    obj: Ctx,
    detach: bool,
    listen: tuple[str, ...],
    mailbox_limit: int,
    faults: bool,
    ready_fd: int | None,
    verbose: bool,
) -> None:
    """Start a node serving the state dir (foreground unless --detach)."""
    from runtime import daemon
    from runtime.node import Node, NodeOptions

    if detach:
        extra = [a for item in listen for a in ("--listen", item)]
        extra += ["--mailbox-limit", str(mailbox_limit)] + (["--faults"] if faults else [])
        record = daemon.start_detached(obj.state_dir, extra)
        click.echo(f"node started (pid {record['pid']}) at {record['address']}")
        return
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options = NodeOptions(
        state_dir=obj.state_dir, listen=listen, mailbox_limit=mailbox_limit, faults=faults
    )
    node = Node(options)
    try:
        node.start()
    except SubagentsError as err:
        daemon.signal_ready(ready_fd, f"error: {err.message}")
        raise
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: node.request_stop())
    daemon.signal_ready(ready_fd, "ready")
    click.echo(f"node {node.node_id} serving {', '.join(node.endpoints)}", err=True)
    try:
        node.wait()
    finally:
        node.stop()
    if node.failure:
        raise click.ClickException(node.failure)


@cli.command()
@click.pass_obj
@user_errors
def stop(obj: Ctx) -> None:
    """Stop the node serving the state dir and wait for it to exit."""
    from runtime import daemon

    pid = daemon.stop_node(obj.state_dir)
    click.echo(f"node stopped (pid {pid})")


@cli.command()
@json_option
@click.pass_obj
@user_errors
def ping(obj: Ctx, as_json: bool) -> None:
    """Check that the node answers."""
    with obj.client() as client:
        pong = client.ping()
    emit(pong, as_json, f"pong from {pong.node_id} (pid {pong.pid}, v{pong.version})")


@cli.command()
@json_option
@click.pass_obj
@user_errors
def status(obj: Ctx, as_json: bool) -> None:
    """Show the node: endpoints, uptime, actors and their mailboxes."""
    with obj.client() as client:
        st = client.status()
    lines = [
        f"node {st.node_id} v{st.version} pid {st.pid} up {st.uptime_s:.0f}s",
        f"state dir: {st.state_dir}",
        f"endpoints: {', '.join(st.endpoints)}",
    ]
    lines += [
        f"  {a.name:<12} mailbox {a.mailbox}/{a.mailbox_limit}  restarts {a.restarts}"
        for a in st.actors
    ]
    emit(st, as_json, "\n".join(lines))


def main() -> None:
    cli(prog_name="subagents-node")


if __name__ == "__main__":
    main()
