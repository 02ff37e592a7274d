"""`subagents-node nodes [--json]` and `nodes forget NAME --reason TEXT`: a home's fleet of hosts.

Owns the command-line face of multi-host membership (messages/members.py). Both commands ask
the home node serving the state dir (its ipc socket: forget is refused over tcp). It never
edits membership or a ledger itself.

    subagents-node nodes [--json]                  node.members.list
    subagents-node nodes forget NAME --reason T    node.members.forget {name, reason}

`fleet_status` is the home's `status` part for its workers.
"""

from __future__ import annotations

import time

import click

from subagents_node.cli.common import Ctx, emit, json_option, plural, user_errors
from subagents_node.cli.params import GIVEN_TEXT
from subagents_node.client.client import Client
from subagents_node.messages.base import validate_request
from subagents_node.messages.errors import SubagentsError
from subagents_node.messages.members import (
    MemberForget,
    MemberForgotten,
    MemberList,
    MemberListing,
    MemberView,
)


@click.group("nodes", invoke_without_command=True)
@json_option
@click.pass_context
@user_errors
def nodes(ctx: click.Context, as_json: bool) -> None:
    """List the home and its workers: state (up, unreachable, lost), last heartbeat, runs,
    children and capacity slots held."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    with obj.client() as client:
        listing = client.ask(MemberList(), MemberListing)
    emit(listing, as_json, render(listing, time.time()))


@nodes.command()
@click.argument("name")
@click.option(
    "--reason", type=GIVEN_TEXT, required=True, help="Why the worker is declared lost (recorded)."
)
@json_option
@click.pass_obj
@user_errors
def forget(obj: Ctx, name: str, reason: str, as_json: bool) -> None:
    """Declare worker NAME lost: release its capacity slots with an `operator` proof and fence
    it (refused until it joins again). Refused for a worker that is up (stop it first): only
    a silent or stopped one is lost. A worker that was only cut off is told at its next
    heartbeat, and stops the runs whose slots were released (`stopped`, saying why); until
    then its children run on."""
    request = validate_request(MemberForget, {"name": name, "reason": reason})
    with obj.client() as client:
        done = client.ask(request, MemberForgotten)
    emit(
        done,
        as_json,
        f"forgot {done.name} (generation {done.generation}): released "
        f"{plural(done.slots_released, 'slot')}"
        + (f": {', '.join(done.run_ids)}" if done.run_ids else ""),
    )


def render(listing: MemberListing, now: float) -> str:
    head = f"{'NAME':<20} {'ROLE':<7} {'STATE':<12} {'HEARTBEAT':<11} RUNS CHILDREN SLOTS"
    lines = [head] + [_row(view, now) for view in listing.nodes]
    lines.append(
        f"(heartbeat every {listing.heartbeat_s:g}s; unreachable after {listing.timeout_s:g}s)"
    )
    return "\n".join(lines)


def _row(view: MemberView, now: float) -> str:
    if view.role == "home":
        beat = "-"
    elif view.last_heartbeat is None:
        beat = "never"
    else:
        beat = f"{max(0.0, now - view.last_heartbeat):.1f}s ago"
    slots = "?" if view.slots is None else str(view.slots)
    line = (
        f"{view.name:<20} {view.role:<7} {view.state:<12} {beat:<11} "
        f"{view.runs:>4} {view.children:>8} {slots:>5}"
    )
    if view.state == "lost" and view.forget_reason:
        line += f"  forgotten: {view.forget_reason}"
    return line


def fleet_status(client: Client) -> tuple[list[str], dict[str, object]]:
    """A home's `status` of each worker: its membership (state, runs, children, slots) and,
    for a worker that is up, its own node's status (asked through the home), as lines and
    as JSON by worker name."""
    listing = client.hosts.listing()
    lines: list[str] = []
    data: dict[str, object] = {}
    for view in listing.nodes if listing is not None else []:
        if view.role == "home":
            continue
        slots = "? slots" if view.slots is None else plural(view.slots, "slot")
        line = (
            f"  host {view.name}: {view.state}, {plural(view.runs, 'run')}, "
            f"{plural(view.children, 'child', 'children')}, {slots}"
        )
        entry: dict[str, object] = {"member": view.model_dump(mode="json")}
        if view.state == "up":
            try:
                worker = client.hosts.on(view.name).status()
            except SubagentsError as err:
                line += f"; status not answered ({err.message[:200]})"
                entry["error"] = err.to_wire()
            else:
                owners = ", ".join(f"{a.name} {a.state}" for a in worker.actors)
                line += f"; containment {worker.containment.mode}; {owners}"
                entry["status"] = worker.model_dump(mode="json")
        lines.append(line)
        data[view.name] = entry
    return lines, data


COMMANDS = (nodes,)
