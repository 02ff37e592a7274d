"""A child shim's reports to the run supervisor, delivered until acknowledged.

Owns the `child.report` frame (its envelope, sequence number and body: every fact known so
far) and its delivery over the shim's `ReportLink` (actors/child/zmtp.py): the newest report
supersedes an unacknowledged one (a child that ends at once costs one report, not two), is
resent with backoff until an answer acknowledges it (any answer but a retry code), and the
shim asks `next_send_at()` when to wake for the resend. With the node gone the reports keep
waiting, and a new node adopts the shim by acknowledging.

Standard library and msgpack only (the shim template imports it: a shim costs a fork, not an
interpreter). It never decides what a report says or when one is due (the shim does), never
blocks, and never reads or writes a record.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import msgpack

from subagents_node.actors.child.zmtp import ReportLink

#: The wire names the shim speaks (checked against messages/ by the tests).
REPORT_TYPE = "child.report"
SUPERVISOR = "supervisor"
PROTOCOL_VERSION = 1
#: Error codes that mean "not taken, try again"; any other answer acknowledges the report. A
#: store error (a full disk: `store_full`) undid the report's commit: acknowledged, it is lost.
#: So is one refused because its child's row cannot be read (`record_quarantined`): kept, it is
#: applied once the row is repaired (an ended child's shim waits for that, up to its give-up).
RETRY_CODES = frozenset(
    {"busy", "internal", "unavailable", "store_error", "store_full", "record_quarantined"}
)
#: How many processes a report names at most: as messages/runs.py MAX_REPORTED_PROCESSES
#: (the shim imports nothing of messages/).
MAX_REPORTED_PROCESSES = 256
#: A report to a live node is never lost (one connection, in order): a resend is for a node
#: that died or restarted. Resending sooner only makes a busy node apply it twice.
_FIRST_RETRY_S = 0.5
_MAX_RETRY_S = 2.0


class ReportDelivery:
    """One shim's reports: `post` the newest, `send_due` it when its (re)send is due,
    `receive` the answers; `unacked` is empty once the newest is acknowledged."""

    def __init__(self) -> None:
        self.seq = 0
        #: The report waiting for its acknowledgement, as (message id, frame): at most one.
        self.unacked: list[tuple[str, bytes]] = []
        self.retry_at = 0.0
        self.backoff = _FIRST_RETRY_S

    def post(self, kind: str, facts: Mapping[str, Any], *, tree_ended: bool, ended_by: str) -> None:
        """Number the report of `kind` carrying `facts` and make it the one to send now."""
        self.seq += 1
        body = {
            **facts,
            "kind": kind,
            "seq": self.seq,
            "tree_ended": tree_ended,
            "ended_by": ended_by,
        }
        mid = os.urandom(12).hex()  # not `random`: its at-fork reseed runs in every shim
        envelope = {
            "v": PROTOCOL_VERSION,
            "id": mid,
            "corr": None,
            "sender": f"shim-{os.getpid()}",
            "target": SUPERVISOR,
            "type": REPORT_TYPE,
            "body": body,
        }
        # Every report carries every fact known so far, so the newest supersedes any report
        # not yet acknowledged: a child that ended before its `started` left is one report
        # (one round trip, one row update), and a new node never sees facts out of order.
        self.unacked = [(mid, msgpack.packb(envelope, use_bin_type=True))]
        self.retry_at = 0.0  # send it now
        self.backoff = _FIRST_RETRY_S

    def next_send_at(self) -> float | None:
        """When (time.monotonic()) the unacknowledged report is due; None when there is none."""
        return self.retry_at if self.unacked else None

    def send_due(self, link: ReportLink) -> None:
        """Send the unacknowledged report (the newest: it supersedes the others) when its
        retry is due. No node to talk to: the next try comes after the backoff (a resend on
        a live connection is for a node that restarted)."""
        if not self.unacked or time.monotonic() < self.retry_at:
            return
        link.send(self.unacked[0][1])
        self.retry_at = time.monotonic() + self.backoff
        self.backoff = min(_MAX_RETRY_S, self.backoff * 2)

    def receive(self, link: ReportLink) -> None:
        """Read the answers that arrived: one to the unacknowledged report acknowledges it,
        unless it is an error with a retry code."""
        for frame in link.receive():
            try:
                reply = msgpack.unpackb(frame, raw=False)
                corr = reply.get("corr")
                code = (reply.get("body") or {}).get("code")
            except Exception:
                continue  # not an answer we can read: the report is resent
            if not self.unacked or corr != self.unacked[0][0]:
                continue  # an answer to a resend we already counted
            if reply.get("type") == "error" and code in RETRY_CODES:
                continue
            self.unacked.pop(0)
            self.retry_at = 0.0
            self.backoff = _FIRST_RETRY_S
