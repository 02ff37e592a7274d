"""The `subagents-node` command line (click): the group and the node commands.

Owns argument parsing and rendering only: every command is a client call (or a node start,
served by cli/serve.py), every user error is a one-line message with a non-zero exit code,
never a traceback. Command families live beside it (cli/runs.py, cli/ledgers.py,
cli/manage.py, cli/workflow.py), each listing its commands in `COMMANDS`; `LAZY_COMMANDS`
names them here so that a command imports only its own family (tests/cli/test_cli_node.py
checks the two lists agree).
"""

from __future__ import annotations

import errno
import functools
import gc
import importlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NoReturn

import click
from click.exceptions import NoArgsIsHelpError

from subagents_node.cli.common import (
    EXIT_INTERRUPTED,
    Ctx,
    emit,
    error_line,
    json_option,
    reader_gone,
    user_errors,
)
from subagents_node.cli.params import (
    HEARTBEAT_SECONDS,
    RUN_ID,
    SECONDS,
    GivenPath,
    WholeRange,
    given_or_default,
)
from subagents_node.cli.terminal import one_line, say
from subagents_node.client.paths import check_endpoint, ipc_endpoint
from subagents_node.messages.constants import (
    ENV_NODE,
    ENV_STATE_DIR,
    ENV_TEST_FAULTS,
    VERSION,
)
from subagents_node.messages.errors import SubagentsError

#: command name -> (module, attribute): the families are imported only when their command runs
#: (or when help lists them), so `--version` and `ping` load none of them.
LAZY_COMMANDS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "run": ("subagents_node.cli.runs", "run"),
        "runs": ("subagents_node.cli.runs", "runs_command"),
        "show": ("subagents_node.cli.runs", "show"),
        "agents": ("subagents_node.cli.runs", "agents"),
        "capacity": ("subagents_node.cli.ledgers", "capacity"),
        "budget": ("subagents_node.cli.ledgers", "budget"),
        "grant": ("subagents_node.cli.ledgers", "grant"),
        "config": ("subagents_node.cli.ledgers", "config_group"),
        "debug-run": ("subagents_node.cli.ledgers", "debug_run"),
        "logs": ("subagents_node.cli.observe", "logs"),
        "wait": ("subagents_node.cli.observe", "wait"),
        "doctor": ("subagents_node.cli.ledgers", "doctor"),
        "fleet": ("subagents_node.cli.ledgers", "fleet"),
        "resume": ("subagents_node.cli.manage", "resume"),
        "rerun": ("subagents_node.cli.manage", "rerun"),
        "attach": ("subagents_node.cli.manage", "attach"),
        "append": ("subagents_node.cli.manage", "append"),
        "intercom": ("subagents_node.cli.manage", "intercom"),
        "pause": ("subagents_node.cli.manage", "pause"),
        "approve": ("subagents_node.cli.manage", "approve"),
        "reject": ("subagents_node.cli.manage", "reject"),
        "mcp": ("subagents_node.cli.mcp", "mcp_command"),
        "workflow": ("subagents_node.cli.workflow", "workflow"),
        "keys": ("subagents_node.cli.keys", "keys_group"),
        "nodes": ("subagents_node.cli.nodes", "nodes"),
        "prune": ("subagents_node.cli.prune", "prune"),
    }
)


#: The largest mailbox bound `start` accepts (a bound, not a preallocation).
MAX_MAILBOX_LIMIT = 1_000_000


def _exit(code: int) -> NoReturn:
    sys.exit(code)


class LazyGroup(click.Group):
    """A click group whose command families load on first use (click's documented pattern).

    Its `main` shows every error as one line (usage errors too, with the command's help hint;
    JSON with `--json`) and exits 130 on Ctrl-C, instead of click's multi-line usage block.
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        as_json = "--json" in argv
        try:
            # What the root callback is told (its `ctx.obj` until it makes the Ctx): how a
            # warning it says before the command runs is written (`_warn_unknown_variables`).
            extra.setdefault("obj", {"json": as_json})
            outcome = super().main(argv, prog_name, complete_var, False, **extra)
        except NoArgsIsHelpError as err:
            # `subagents-node`, or a family such as `config`, alone: its help, as click shows
            # it (on stderr, exit 2), not that help squeezed into one error line.
            err.show()
            _exit(err.exit_code)
        except click.UsageError as err:
            where = err.ctx.command_path if err.ctx else (prog_name or "subagents-node")
            message = f"{err.format_message()} (see '{where} --help')"
            say(error_line("usage", message, {}, as_json), err=True)
            _exit(err.exit_code)
        except click.ClickException as err:
            err.show()
            _exit(err.exit_code)
        except click.Abort as err:
            if isinstance(err.__cause__, KeyboardInterrupt):
                say(error_line("interrupted", "interrupted", {}, as_json), err=True)
                _exit(EXIT_INTERRUPTED)
            say(error_line("aborted", "aborted", {}, as_json), err=True)
            _exit(1)
        except KeyboardInterrupt:
            say(error_line("interrupted", "interrupted", {}, as_json), err=True)
            _exit(EXIT_INTERRUPTED)
        _exit(outcome if isinstance(outcome, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as err:
            if err.errno == errno.EPIPE:  # before click's own handling, which exits 1
                reader_gone()
            raise

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module_name, attribute = LAZY_COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module_name), attribute)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    envvar=ENV_STATE_DIR,
    callback=given_or_default,
    help=f"Node state directory (default: ${ENV_STATE_DIR}, else the XDG state dir).",
)
@click.option(
    "--address",
    envvar=ENV_NODE,
    callback=given_or_default,
    help="Node address, ipc://PATH or tcp://HOST:PORT (default: the socket of a --state-dir "
    "given here, else $SUBAGENTS_NODE, else the state dir's socket).",
)
@click.option(
    "--timeout",
    type=SECONDS,
    default=10.0,
    show_default=True,
    help="Seconds to wait for a reply (0.001 to 86400).",
)
@click.version_option(VERSION, prog_name="subagents-node")
@click.pass_context
def cli(ctx: click.Context, state_dir: str | None, address: str | None, timeout: float) -> None:
    """Launch and supervise agent child processes under hard, single-owner ledgers."""
    sources = click.core.ParameterSource
    if (
        ctx.get_parameter_source("state_dir") is sources.COMMANDLINE
        and ctx.get_parameter_source("address") is sources.ENVIRONMENT
    ):
        # A --state-dir typed on the command line names the node; $SUBAGENTS_NODE (set for
        # every agent child) is only the default. It used to win: in a child, `--state-dir X
        # stop` stopped the parent's node and left X's running (docs/api.md: state_dir first).
        address = None
    given = ctx.get_parameter_source("state_dir")
    origin = (
        "--state-dir" if given is sources.COMMANDLINE else f"environment variable {ENV_STATE_DIR}"
    )
    as_json = isinstance(ctx.obj, dict) and bool(ctx.obj.get("json"))
    ctx.obj = Ctx(state_dir, address, timeout, origin)
    if ctx.invoked_subcommand != "doctor":  # doctor reports them among its checks
        _warn_unknown_variables(as_json)


def _given_flags(names: tuple[str, ...]) -> tuple[str, ...]:
    """The command's options among `names` given on the command line (not defaulted), each
    as its flag (`--heartbeat`)."""
    ctx = click.get_current_context()
    given = []
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name or "")
        if param.name in names and source is click.core.ParameterSource.COMMANDLINE:
            given.append(param.opts[0])
    return tuple(given)


def _warn_unknown_variables(as_json: bool) -> None:
    """A `SUBAGENTS_*` variable nothing reads (a typo of a setting's name) is said, one line
    each, on stderr: ignored in silence, the setting it meant kept its default. With --json,
    each line is an object, `{"warning": {code, message, details}}`, as an error's is."""
    from subagents_node.launch.envnames import unknown_variables, unknown_warning

    for name, closest in unknown_variables(os.environ):
        message = unknown_warning(name, closest)
        if as_json:
            details = {"variable": name, "closest": closest}
            payload = {"code": "unknown_variable", "message": message, "details": details}
            say(json.dumps({"warning": payload}, sort_keys=True), err=True)
        else:
            say(f"warning: {one_line(message)}", err=True)


@cli.command()
@click.option("--detach", is_flag=True, help="Run in the background; return once it serves.")
@click.option("--listen", multiple=True, help="Extra endpoint, e.g. tcp://127.0.0.1:7700.")
@click.option(
    "--mailbox-limit",
    type=WholeRange(1, MAX_MAILBOX_LIMIT),
    default=1024,
    show_default=True,
    help="Max queued per actor.",
)
@click.option(
    "--home",
    is_flag=True,
    help="Be a home node: own the ledgers for worker nodes (needs --listen tcp://HOST:PORT).",
)
@click.option("--join", metavar="tcp://HOME:PORT", help="Be a worker node of this home.")
@click.option("--home-key", metavar="KEY", help="With --join: the home's server public key.")
@click.option("--name", metavar="NAME", help="With --join: this worker's name (its key's name).")
@click.option(
    "--client-key",
    type=GivenPath(dir_okay=False),
    help="With --join: this worker's key file (default: the state dir's client key).",
)
@click.option(
    "--heartbeat",
    "heartbeat_s",
    type=HEARTBEAT_SECONDS,
    default=1.0,
    show_default=True,
    help="With --home: how often workers heartbeat (seconds, 0.1 to 86400).",
)
@click.option(
    "--heartbeat-timeout",
    "heartbeat_timeout_s",
    type=HEARTBEAT_SECONDS,
    default=5.0,
    show_default=True,
    help="With --home: silence after which a worker is unreachable (seconds, 0.1 to 86400).",
)
@click.option("--faults", is_flag=True, hidden=True, envvar=ENV_TEST_FAULTS)
@click.option("--ready-fd", type=click.IntRange(0, 65535), hidden=True)
@click.option("--log-file", "log_to_file", is_flag=True, hidden=True)
@click.option("--verbose", "-v", is_flag=True, help="Log at debug level.")
@click.pass_obj
@user_errors
def start(
    obj: Ctx,
    /,
    detach: bool,
    listen: tuple[str, ...],
    mailbox_limit: int,
    faults: bool,
    ready_fd: int | None,
    log_to_file: bool,
    verbose: bool,
    **fleet_flags: Any,
) -> None:
    """Start a node serving the state dir (foreground unless --detach).

    Multi-host: `--home --listen tcp://HOST:PORT` serves worker nodes; `--join tcp://HOME:PORT
    --home-key KEY --name NAME` makes this node a worker of that home (allow its key there
    first with `subagents-node keys allow KEY --name NAME`)."""
    # The collector stays off while the node loads and forks its owners, as gc.freeze's
    # documentation prescribes for a process that forks: the start-up makes ~200,000 objects
    # that live as long as the node and next to no garbage, and collecting them as they load
    # cost ~40 ms of every start. The node turns it on once it serves (cli/serve.py), each
    # owner once its own start-up is frozen (runtime/node/ownerproc.py).
    gc.disable()
    try:
        from subagents_node.cli.serve import fleet_options, serve, serve_detached
        from subagents_node.launch.config import load_config
        from subagents_node.node import daemon

        if ready_fd is not None:
            try:
                os.fstat(ready_fd)
            except OSError:
                raise click.BadParameter(f"{ready_fd} is not an open file descriptor") from None
        try:
            # Before detaching: a bad listen address (flag, SUBAGENTS_LISTEN or a project's
            # subagents.toml) is a one-line error here, not a detached node that never gets ready.
            config = load_config()
            ipc_endpoint(obj.state_dir)  # a socket no client could reach: refused before anything
            for endpoint in listen:
                check_endpoint(endpoint)
            fleet = fleet_options(
                **fleet_flags,
                listen=(*config.settings.listen, *listen),
                given=_given_flags(("heartbeat_s", "heartbeat_timeout_s")),
            )
        except SubagentsError as err:
            daemon.signal_failed(ready_fd, err)
            raise
        if detach:
            # Forked, not a fresh interpreter: the node starts from what this process imported
            # already, and this process holds no thread or socket yet (runtime/node/daemon.py).
            detached = functools.partial(
                serve_detached, obj, config, listen, mailbox_limit, faults, verbose, fleet
            )
            record = daemon.fork_detached(obj.state_dir, detached)
            say(f"node started (pid {record['pid']}) at {record['address']}")
            return
        serve(obj, config, listen, mailbox_limit, faults, verbose, fleet, ready_fd, log_to_file)
    finally:
        gc.enable()  # whatever ended the start: an error, a detached node forked off


@cli.command()
@click.argument("run_id", type=RUN_ID, required=False)
@json_option
@click.pass_obj
@user_errors
def stop(obj: Ctx, run_id: str | None, as_json: bool) -> None:
    """Stop run RUN_ID (its process groups; state stopped), or with no RUN_ID the node (the
    one at --address when it is given, else the state dir's)."""
    if run_id is not None:
        from subagents_node.cli.runs import stop_run

        stop_run(obj, run_id, as_json)
        return
    from subagents_node.node import daemon

    if obj.address:
        with obj.client() as client:
            pid = daemon.stop_node_at(client)
    else:
        pid = daemon.stop_node(obj.state_dir)
    emit({"state": "stopped", "pid": pid}, as_json, f"node stopped (pid {pid})")


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
    """Show the node: endpoints, uptime, how children are contained (cgroup v2 or the
    subreaper alone), its part in a fleet (home, or worker and its link to the home), each
    owner process (state, pid, restarts), the stored records its owners quarantined and, once a
    tcp listener shed a flood of connections, how often and when (`--json`: every tcp
    listener's budget, connections open, sheds, last shed). On a home node, also each worker:
    its membership, runs, children, slots and owners."""
    hosts: list[str] = []
    by_host: dict[str, object] = {}
    with obj.client() as client:
        st = client.status()
        if st.cluster is not None and st.cluster.role == "home":
            from subagents_node.cli.nodes import fleet_status

            hosts, by_host = fleet_status(client)
    lines = [
        f"node {st.node_id} v{st.version} pid {st.pid} up {st.uptime_s:.0f}s",
        f"state dir: {st.state_dir}",
        f"endpoints: {', '.join(st.endpoints)}",
        f"containment: {st.containment.describe()}",
    ]
    if st.cluster is not None:  # multi-host: a home, or a worker of one
        lines.append(f"fleet: {st.cluster.describe()}")
        lines += hosts
    for a in st.actors:  # one process per owner (DESIGN §1)
        lines.append(f"  {a.name:<12} {a.state:<10} pid {a.pid or '-':<8} restarts {a.restarts}")
        if a.state != "running" and a.reason:
            lines.append(f"    why: {a.reason[:300]}")
    quarantined = [q for a in st.actors for q in a.quarantined]
    if quarantined:
        lines.append(
            f"quarantined records ({len(quarantined)}; counted occupied/unavailable, see `doctor`):"
        )
        lines += [f"  {q.owner} {q.table}[{q.key}]: {q.reason}" for q in quarantined]
    from subagents_node.cli.tcpsheds import status_line

    shed = status_line(st.tcp, time.time())  # only once a tcp listener shed a flood
    if shed:
        lines.append(shed)
    data = {**st.model_dump(mode="json"), "hosts": by_host} if by_host else st
    emit(data, as_json, "\n".join(lines))


def main() -> None:
    open_standard_streams()
    cli(prog_name="subagents-node")


def open_standard_streams() -> None:
    """A closed stdin, stdout or stderr (`runs >&-`) is /dev/null from the start. Python left
    sys.stdout None, and `runs >&-` ended in a traceback (`'NoneType' object has no attribute
    'isatty'`), and the next file the command opened (a node's database, a socket) took the
    free number, where anything writing to descriptor 1 (or 2) would have written into it."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        opened = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if opened != fd:  # the lowest free number: fd itself, unless a lower one was closed too
            os.dup2(opened, fd)
            os.close(opened)
        if getattr(sys, name) is None:
            stream = open(fd, "r" if fd == 0 else "w", closefd=False)  # noqa: SIM115
            # Said on the stream, for a command that must not run without it: the MCP
            # server talks over stdin and stdout (mcp/stdio.py `check_stdio`).
            stream.closed_at_start = True  # type: ignore[attr-defined]
            setattr(sys, name, stream)


if __name__ == "__main__":
    main()
