"""`subagents-node mcp`: serve the launcher's operations as MCP tools over stdio.

Owns the command's options only; the server lives in subagents_node.mcp. stdout is the MCP
channel, so this command prints nothing there itself: errors go to stderr.
"""

from __future__ import annotations

import os

import click

from subagents_node.cli.common import Ctx, user_errors
from subagents_node.cli.params import PATH_TEXT, SESSION


@click.command("mcp")
@click.option(
    "--agents-dir", "agents_dirs", type=PATH_TEXT, multiple=True, help="Extra agents directory."
)
@click.option(
    "--session",
    type=SESSION,
    help="Session id (default: $SUBAGENTS_SESSION, else this terminal's Unix session).",
)
@click.pass_obj
@user_errors
def mcp_command(obj: Ctx, agents_dirs: tuple[str, ...], session: str | None) -> None:
    """Serve the launcher as a stdio MCP server (tools: agents, run, status, logs, wait,
    stop, resume, rerun, attach, append, pause, approve, reject) for agent CLIs such as Claude
    Code, Codex CLI and Gemini CLI. TERM, HUP or INT stop its foreground runs, then end it.

    It uses the node at --address, else that of a --state-dir given here, else the one at
    $SUBAGENTS_NODE (an agent child inherits its run tree's budget, depth and session), else
    the state dir's node, else an embedded node that lives as long as the server. See
    docs/mcp.md.
    """
    from subagents_node.launch.environ import carried_environment
    from subagents_node.mcp.endsignals import EndSignals
    from subagents_node.mcp.server import node_address, serve
    from subagents_node.mcp.stdio import check_stdio

    check_stdio()  # before a node is embedded: nothing starts for a server that cannot talk
    # Held from before its node is embedded until after it is stopped: a signal in between
    # only ends the server (at once once it serves), never cuts either short.
    with (
        EndSignals() as signals,
        node_address(obj.address, obj.state_dir, obj.timeout) as address,
    ):
        signum = serve(
            address, obj.timeout, carried_environment(os.environ), signals, agents_dirs, session
        )
    if signum is not None:
        # Ended by TERM, HUP or INT (or PIPE: the client stopped reading stdout) after its
        # calls were cancelled (a foreground run stopped): 128 + the signal, as a foreground
        # `subagents-node run` ends.
        raise SystemExit(128 + signum)


COMMANDS = (mcp_command,)
