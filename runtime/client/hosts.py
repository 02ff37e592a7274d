"""Hosts: a home node's runs across every host it has, for clients (DESIGN §1 "Multi-host").

Owns the client side of the home's views: which hosts there are (the home's membership
listing), one client per worker reached through the home (`Client.on`), and the gathering of
runs from each host, labelled with the host they are on (`RunView.host`). A worker the home
lists as not `up` is not asked (its runs are unknown, and said so); one that does not answer
within the per-host timeout is reported the same way, so a view never hangs on a lost host.

What a view means is written once here, for both clients: the listing is a plan
(`listing_plan`), and which hosts to ask (`asked_hosts`) and what their answers make
(`runs_parts`, `found_run`) are pure functions. `Hosts` asks the workers in turn;
`AsyncHosts` (client/aio_hosts.py) asks them at once.

It never changes anything on any host, and never asks a ledger: the ledgers are the home's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from subagents_node.client.plans import Ask, Plan
from subagents_node.messages.errors import MembershipRefused, RunNotFound, SubagentsError
from subagents_node.messages.members import HOME_NAME, MemberList, MemberListing
from subagents_node.messages.supervisor import RunView

if TYPE_CHECKING:
    from subagents_node.client.client import Client

T = TypeVar("T")

#: How long a view waits for one worker's answer before it reports the host as not answering.
HOST_TIMEOUT_S = 5.0

#: One host's answer to a view's question: its result, or the typed error it ended with.
Answer: TypeAlias = T | SubagentsError


@dataclass(frozen=True)
class HostRuns:
    """One host's part of a view: its runs, or why they are unknown."""

    host: str
    state: str  # the home's word for the host: up, unreachable, lost
    runs: list[RunView]
    error: str = ""


def regrouped(parts: Sequence[HostRuns], runs: Sequence[RunView]) -> list[HostRuns]:
    """`parts` with their runs, in order, replaced by `runs`: the same runs read again as one
    list (a home's ledger owners answer for every host's runs at once)."""
    shown, start = [], 0
    for part in parts:
        end = start + len(part.runs)
        shown.append(dataclasses.replace(part, runs=list(runs[start:end])))
        start = end
    return shown


def runs_json(
    parts: list[HostRuns],
    recorded: Mapping[str, str] | None = None,
    capacity_recorded: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """A view's runs over every host as JSON, naming the hosts whose runs are unknown; a run
    in `recorded` (run id -> why) says its fan-out figures are its record, not a live reading,
    and one in `capacity_recorded` says so of its capacity figures."""
    runs = []
    for part in parts:
        for run in part.runs:
            view = run.model_dump(mode="json")
            if recorded and run.run_id in recorded:
                view["fanout_recorded"] = recorded[run.run_id]
            if capacity_recorded and run.run_id in capacity_recorded:
                view["capacity_recorded"] = capacity_recorded[run.run_id]
            runs.append(view)
    data: dict[str, object] = {"runs": runs}
    missing = {part.host: part.error for part in parts if part.error}
    if missing:
        data["hosts_not_listed"] = missing
    return data


def listing_plan() -> Plan[MemberListing | None]:
    """The home's membership listing (None: the node is no home, so it is one host)."""
    try:
        listing: MemberListing = yield Ask(MemberList(), MemberListing)
    except MembershipRefused as err:
        if err.details.get("reason") == "not_home":
            return None
        raise
    return listing


def asked_hosts(listing: MemberListing) -> list[str]:
    """The hosts a view asks, in the listing's order: those the home lists as `up`."""
    return [member.name for member in listing.nodes if member.state == "up"]


def runs_parts(
    listing: MemberListing, answers: Mapping[str, Answer[list[RunView]]]
) -> list[HostRuns]:
    """Each host's part of a runs view, in the listing's order, from the answers of the hosts
    that were asked: runs labelled with their host, or why they are unknown."""
    parts = []
    for member in listing.nodes:
        found = answers.get(member.name)
        if member.state != "up" or found is None:
            parts.append(HostRuns(member.name, member.state, [], f"{member.state}: not asked"))
        elif isinstance(found, SubagentsError):
            parts.append(HostRuns(member.name, member.state, [], found.message))
        else:
            labelled = [run.model_copy(update={"host": member.name}) for run in found]
            parts.append(HostRuns(member.name, member.state, labelled))
    return parts


def found_run(
    run_id: str, listing: MemberListing, answers: Mapping[str, Answer[RunView]]
) -> RunView:
    """The one run the hosts' answers to `show(run_id)` found, labelled with its host (its
    `host` names the client to use). Raises RunNotFound: ambiguous over several hosts, or
    found on none, naming the hosts that could not be asked."""
    found: list[RunView] = []
    unasked: list[str] = []
    for member in listing.nodes:
        answer = answers.get(member.name)
        if member.state != "up" or answer is None:
            unasked.append(f"{member.name} ({member.state})")
        elif isinstance(answer, RunNotFound):
            continue
        elif isinstance(answer, SubagentsError):
            unasked.append(f"{member.name} ({answer.code})")
        else:
            found.append(answer.model_copy(update={"host": member.name}))
    if len(found) == 1:
        return found[0]
    if found:
        hosts = ", ".join(run.host for run in found)
        raise RunNotFound(
            f"{run_id!r} matches runs on several hosts ({hosts}); give more of the id",
            run_id=run_id,
            reason="ambiguous",
        )
    unknown = f"; not asked: {', '.join(unasked)}" if unasked else ""
    raise RunNotFound(
        f"no run {run_id!r} on any host of this home{unknown}", run_id=run_id, hosts=unasked
    )


class Hosts:
    """The home's views for a `Client` (`client.hosts`): the workers are asked in turn, each
    within the per-host timeout."""

    def __init__(self, client: Client, timeout_s: float = HOST_TIMEOUT_S) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._clients: dict[str, Client] = {}

    def listing(self) -> MemberListing | None:
        """The home's membership listing (None: this node is no home, so it is one host)."""
        return self._client.perform(listing_plan())

    def on(self, host: str) -> Client:
        """The client for `host` (this client itself for the home), kept until `close`."""
        if host == HOME_NAME:
            return self._client
        found = self._clients.get(host)
        if found is None:
            found = self._clients[host] = self._client.on(host)
            found.timeout = min(self._client.timeout, self._timeout_s)
        return found

    def _ask_each(self, hosts: list[str], ask: Callable[[Client], T]) -> dict[str, Answer[T]]:
        """Each host's answer to `ask`, the hosts asked in turn; a host's typed error is its
        answer (reported by the view, never raised past it)."""
        answers: dict[str, Answer[T]] = {}
        for host in hosts:
            try:
                answers[host] = ask(self.on(host))
            except SubagentsError as err:
                answers[host] = err
        return answers

    def runs(
        self, session_id: str | None = None, active_only: bool = False, limit: int = 50
    ) -> list[HostRuns]:
        """Each host's runs (the home's first, then each worker's by name), newest first
        within each host; one host when the node is no home."""
        listing = self.listing()
        if listing is None:
            return [HostRuns("", "up", self._client.runs.list(session_id, active_only, limit))]
        answers = self._ask_each(
            asked_hosts(listing), lambda client: client.runs.list(session_id, active_only, limit)
        )
        return runs_parts(listing, answers)

    def find(self, run_id: str) -> tuple[Client, RunView]:
        """The host a run is on, and the run (exact id or unique prefix over every host; on
        a node that is no home, that node's own). Raises RunNotFound naming the hosts that
        could not be asked."""
        listing = self.listing()
        if listing is None:
            return self._client, self._client.runs.show(run_id)
        answers = self._ask_each(asked_hosts(listing), lambda client: client.runs.show(run_id))
        run = found_run(run_id, listing, answers)
        return self.on(run.host), run

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
