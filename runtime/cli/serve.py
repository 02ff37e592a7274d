"""How `subagents-node start` runs a node in this process: in the foreground, or detached.

Owns what `start` does once its arguments are parsed: its multi-host flags checked and turned
into NodeOptions fields (`fleet_options`), the node's logging (stderr, or node.log rotated by
size when detached), the node built, started and served until SIGTERM or SIGINT (`serve`),
readiness or the start's error written to the ready pipe, and the detached node's exit code
(`serve_detached`, in the child `start --detach` forks). The `start` command itself, its
options and its help, stays in cli/main.py, which imports this module only when `start` runs,
so that `--version`, `ping` and the other commands never load it.

It never parses the command line, never forks or detaches (runtime/node/daemon.py does), and
never touches the state dir's stores itself: the node's owner processes do.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
from typing import TYPE_CHECKING

import click

from subagents_node.cli.common import CliError, Ctx, file_error
from subagents_node.cli.terminal import say
from subagents_node.client.paths import check_endpoint
from subagents_node.messages.constants import ENV_TEST_HOST_CALL_TIMEOUT, ENV_TEST_KILL_AT
from subagents_node.messages.errors import SubagentsError
from subagents_node.node.descriptors import (
    DESCRIPTOR_FIX,
    low_hard_limit,
    low_limit_warning,
    raise_descriptor_limit,
)

if TYPE_CHECKING:
    from subagents_node.launch.config import Configuration


def _kill_points(faults: bool) -> dict[str, list[str]]:
    """Tests only: the launch steps at which a node started with faults kills itself."""
    points = os.environ.get(ENV_TEST_KILL_AT, "") if faults else ""
    return {"fault_kill_points": [p for p in points.split(",") if p]} if points else {}


def _host_call_timeout(faults: bool) -> dict[str, object]:
    """Tests only: a home's shorter wait for its workers' answers (a late answer in seconds).
    A value that is no number is passed on as it is: the settings check refuses it."""
    value = os.environ.get(ENV_TEST_HOST_CALL_TIMEOUT, "") if faults else ""
    if not value:
        return {}
    try:
        return {"host_call_timeout_s": float(value)}
    except ValueError:
        return {"host_call_timeout_s": value}


def fleet_options(
    *,
    home: bool,
    join: str | None,
    home_key: str | None,
    name: str | None,
    client_key: str | None,
    heartbeat_s: float,
    heartbeat_timeout_s: float,
    listen: tuple[str, ...] = (),
    given: tuple[str, ...] = (),
) -> dict[str, object]:
    """start's multi-host flags as NodeOptions fields, checked before anything starts.
    `listen`: every endpoint the node will listen on besides its socket (the flags' and the
    configured ones); `given`: the home's flags (`--heartbeat`, `--heartbeat-timeout`) given
    on the command line rather than defaulted."""
    if home and join:
        raise click.UsageError("--home and --join exclude each other: a node is one or the other")
    if home and not any(endpoint.startswith("tcp://") for endpoint in listen):
        # A usage error (exit 2) like the other flag mistakes here; the node's own check of its
        # options (runtime/node/roles.py) said it as a ConfigError, exit 1.
        raise click.UsageError(
            "--home needs a tcp endpoint for its workers: --listen tcp://HOST:PORT"
        )
    worker_flags = {"--home-key": home_key, "--name": name, "--client-key": client_key}
    if not join and any(worker_flags.values()):
        used = ", ".join(flag for flag, value in worker_flags.items() if value)
        raise click.UsageError(f"{used}: only with --join (a worker's flags)")
    if join and not (home_key and name):
        raise click.UsageError("--join needs --home-key KEY and --name NAME")
    if given and not home:  # a worker's heartbeat is the home's: the flags did nothing here
        raise click.UsageError(f"{', '.join(given)}: only with --home (a home's flags)")
    if heartbeat_timeout_s <= heartbeat_s:
        raise click.UsageError("--heartbeat-timeout must be longer than --heartbeat")
    if join:
        check_endpoint(join)
    return {
        "home": home,
        "join": join or "",
        "home_key": home_key or "",
        "name": name or "",
        "client_key": client_key or "",
        "heartbeat_s": heartbeat_s,
        "heartbeat_timeout_s": heartbeat_timeout_s,
    }


def serve_detached(
    obj: Ctx,
    config: Configuration,
    listen: tuple[str, ...],
    mailbox_limit: int,
    faults: bool,
    verbose: bool,
    fleet: dict[str, object],
    ready_fd: int,
) -> int:
    """The detached node's life (`start --detach`, in the forked child): serve, then the exit
    code, with a failure shown on node.log the way `start` shows it."""
    try:
        serve(obj, config, listen, mailbox_limit, faults, verbose, fleet, ready_fd, True)
    except SubagentsError as err:
        failed = CliError(err)
        failed.show()
        return failed.exit_code
    except click.ClickException as err:
        err.show()
        return err.exit_code
    return 0


def serve(
    obj: Ctx,
    config: Configuration,
    listen: tuple[str, ...],
    mailbox_limit: int,
    faults: bool,
    verbose: bool,
    fleet: dict[str, object],
    ready_fd: int | None,
    log_to_file: bool,
) -> None:
    """Run a node in this process until it is stopped (`start` in the foreground, or the
    detached node): ready (or the error) on `ready_fd` once it serves."""
    from subagents_node.node.containment import ContainmentProbe

    # Started before the node's code loads: the probe waits in the kernel meanwhile.
    probe = ContainmentProbe(config.settings.containment, str(obj.state_dir.resolve()))
    from subagents_node.node import daemon
    from subagents_node.node.node import Node
    from subagents_node.node.options import NodeOptions

    level = logging.DEBUG if verbose else logging.INFO
    if log_to_file:  # a detached node (start --detach): node.log, rotated by size
        from subagents_node.client.paths import LOG_NAME
        from subagents_node.node.nodelog import configure_node_log

        settings = config.settings
        log_path = obj.state_dir / LOG_NAME
        configure_node_log(log_path, settings.node_log_max_bytes, settings.node_log_backups, level)
    else:
        from subagents_node.node.nodelog import configure_stderr_log

        configure_stderr_log(level)
    # Lifted for the node's sockets; its children start with the limit it lifted.
    child_open_files = raise_descriptor_limit()
    options = NodeOptions(
        state_dir=obj.state_dir,
        listen=(*config.settings.listen, *listen),
        mailbox_limit=mailbox_limit,
        faults=faults,
        settings={**config.actor_settings(), **_kill_points(faults), **_host_call_timeout(faults)},
        containment_probe=probe,
        child_open_files=child_open_files,
        **fleet,  # type: ignore[arg-type]
    )
    if log_to_file:  # said on the terminal by `start` (cli/main.py); kept in node.log too
        from subagents_node.launch.envnames import unknown_warnings

        for warning in unknown_warnings(os.environ):
            logging.getLogger(__name__).warning("%s", warning)
    hard = low_hard_limit()
    if hard is not None:  # where the node's log says it, beside the crashes it explains
        logging.getLogger(__name__).warning("%s; %s", low_limit_warning(hard), DESCRIPTOR_FIX)
    node = Node(options)
    # A closed terminal (SIGHUP) stops it as SIGTERM does: left to its default, the hangup
    # killed the node at once, its pid file and sockets left behind for the next start. Set
    # before `start`, which logs "serving" as it ends: a signal sent on reading it must find
    # them. One that lands during `start` only asks for the stop, done once `start` returns.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: node.request_stop())
    try:
        node.start()
    except SubagentsError as err:
        daemon.signal_failed(ready_fd, err)
        raise
    except OSError as exc:  # a path in the state dir the system refused: the starter's one
        daemon.signal_failed(ready_fd, file_error(exc))  # line too, not "exited"
        raise
    gc.enable()  # off since `start` began (cli/main.py, see there)
    try:
        daemon.signal_ready(ready_fd, "ready")
        # Its terminal may be gone already (closed as the node started: the hangup stops it);
        # the write that fails there must not end the process before its node is stopped.
        with contextlib.suppress(OSError):
            say(f"node {node.node_id} serving {', '.join(node.endpoints)}", err=True)
        node.wait()  # its threads leave TERM, INT and HUP to this one (node/signalmask.py)
    finally:
        node.stop()
    if node.failure:
        raise click.ClickException(node.failure)
