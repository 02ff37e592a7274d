"""Hosts: a home node's runs across every host it has, for clients (DESIGN §1 "Multi-host").

Owns the client side of the home's views: which hosts there are (the home's membership
listing), one client per worker reached through the home (`Client.on`), and the gathering of
runs from each host, labelled with the host they are on (`RunView.host`). A worker the home
lists as not `up` is not asked (its runs are unknown, and said so); one that does not answer
within the per-host timeout is reported the same way, so a view never hangs on a lost host.

It never changes anything on any host, and never asks a ledger: the ledgers are the home's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from subagents_node.messages.errors import MembershipRefused, RunNotFound, SubagentsError
from subagents_node.messages.members import HOME_NAME, MemberList, MemberListing
from subagents_node.messages.supervisor import RunView

if TYPE_CHECKING:
    from subagents_node.client.client import Client

#: How long a view waits for one worker's answer before it reports the host as not answering.
HOST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HostRuns:
    """One host's part of a view: its runs, or why they are unknown."""

    host: str
    state: str  # the home's word for the host: up, unreachable, lost
    runs: list[RunView]
    error: str = ""


def runs_json(parts: list[HostRuns]) -> dict[str, object]:
    """A view's runs over every host as JSON, naming the hosts whose runs are unknown."""
    data: dict[str, object] = {
        "runs": [run.model_dump(mode="json") for part in parts for run in part.runs]
    }
    missing = {part.host: part.error for part in parts if part.error}
    if missing:
        data["hosts_not_listed"] = missing
    return data


class Hosts:
    def __init__(self, client: Client, timeout_s: float = HOST_TIMEOUT_S) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._clients: dict[str, Client] = {}

    def listing(self) -> MemberListing | None:
        """The home's membership listing (None: this node is no home, so it is one host)."""
        try:
            return self._client.ask(MemberList(), MemberListing)
        except MembershipRefused as err:
            if err.details.get("reason") == "not_home":
                return None
            raise

    def on(self, host: str) -> Client:
        """The client for `host` (this client itself for the home), kept until `close`."""
        if host == HOME_NAME:
            return self._client
        found = self._clients.get(host)
        if found is None:
            found = self._clients[host] = self._client.on(host)
            found.timeout = min(self._client.timeout, self._timeout_s)
        return found

    def runs(
        self, session: str | None = None, active_only: bool = False, limit: int = 50
    ) -> list[HostRuns]:
        """Each host's runs (the home's first, then each worker's by name), newest first
        within each host; one host when the node is no home."""
        listing = self.listing()
        if listing is None:
            return [HostRuns("", "up", self._client.runs.list(session, active_only, limit))]
        parts = []
        for member in listing.nodes:
            if member.state != "up":
                parts.append(HostRuns(member.name, member.state, [], f"{member.state}: not asked"))
                continue
            try:
                found = self.on(member.name).runs.list(session, active_only, limit)
            except SubagentsError as err:
                parts.append(HostRuns(member.name, member.state, [], err.message))
                continue
            labelled = [run.model_copy(update={"host": member.name}) for run in found]
            parts.append(HostRuns(member.name, member.state, labelled))
        return parts

    def find(self, run_id: str) -> tuple[Client, RunView]:
        """The host a run is on, and the run (exact id or unique prefix over every host; on
        a node that is no home, that node's own). Raises RunNotFound naming the hosts that
        could not be asked."""
        listing = self.listing()
        if listing is None:
            return self._client, self._client.runs.show(run_id)
        found: list[tuple[Client, RunView]] = []
        unasked: list[str] = []
        for member in listing.nodes:
            if member.state != "up":
                unasked.append(f"{member.name} ({member.state})")
                continue
            client = self.on(member.name)
            try:
                run = client.runs.show(run_id)
            except RunNotFound:
                continue
            except SubagentsError as err:
                unasked.append(f"{member.name} ({err.code})")
                continue
            found.append((client, run.model_copy(update={"host": member.name})))
        if len(found) == 1:
            return found[0]
        if found:
            hosts = ", ".join(run.host for _, run in found)
            raise RunNotFound(
                f"{run_id!r} matches runs on several hosts ({hosts}); give more of the id",
                run_id=run_id,
                reason="ambiguous",
            )
        unknown = f"; not asked: {', '.join(unasked)}" if unasked else ""
        raise RunNotFound(
            f"no run {run_id!r} on any host of this home{unknown}", run_id=run_id, hosts=unasked
        )

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
