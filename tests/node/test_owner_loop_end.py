"""An owner whose loop ends on an error ends, and the node restarts it (DESIGN §4
"Supervision": a dead owner process is restarted by the node; past its restart intensity it is
`failed`, and its callers are told so at once).

On a full disk, a group whose commit failed reopened the store, and the reopen failed too (the
last connection's close had removed the WAL's files, and the disk had no room to make them
again: `disk I/O error`). The error ended the owner's loop, whose clean-up handled the next
message in the mailbox on the closed connection, raised again and never closed the sockets:
the process's `zctx.term()` waited for them for good. The run supervisor stayed `running` in
`status`, answered nothing (every `runs`, `show`, `launch` timed out) and was never
restarted, even once the disk had room again; only a node restart brought it back.

Here the same end is forced without a full disk: the capacity owner's database is moved aside
and a directory put in its place, so the reopen after an injected crash fails, with more
requests queued behind the crash (the owner is stopped while they are sent).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from subagents_node.messages.capacity import Snapshot
from subagents_node.messages.errors import OwnerUnavailable, SubagentsError
from subagents_node.messages.node import DebugRaise
from tests.support.nodes import running_node
from tests.support.runs import stopped, wait_until

pytestmark = [pytest.mark.processes]

QUEUED = 5


def test_an_owner_whose_store_cannot_be_reopened_ends_and_is_failed_not_left_hanging() -> None:
    with running_node("--faults") as node:
        client = node.client(timeout=5)
        transport = node.transport()
        client.capacity.snapshot("s-1", 1)  # connected, and the owner has served
        capacity = next(a.pid for a in node.status().actors if a.name == "capacity")
        assert capacity is not None
        database = Path(node.state_dir, "capacity.db")
        os.rename(database, database.with_name("capacity.db.aside"))
        database.mkdir()
        with stopped(capacity):  # all of them wait in its mailbox for the same pass
            crash = transport.submit(DebugRaise(), target="capacity")
            queued = [
                transport.submit(Snapshot(session_id=f"s-{i}", limit=1)) for i in range(QUEUED)
            ]
        for pending in (crash, *queued):
            # Answered or not (the owner's end may take them with it); never a hang.
            with contextlib.suppress(SubagentsError):
                pending.result(10)

        def gone_or_failed() -> bool:
            [owner] = [a for a in node.status().actors if a.name == "capacity"]
            return owner.pid != capacity or owner.state == "failed"

        wait_until(gone_or_failed, timeout=20, what="the capacity owner ended and restarted")
        [owner] = wait_until(
            lambda: [
                a for a in node.status().actors if a.name == "capacity" and a.state == "failed"
            ],
            timeout=20,
            what="the capacity owner failed with its reason",
        )
        assert "cannot open the state database" in owner.reason
        with pytest.raises(OwnerUnavailable):  # at once, not a timeout
            client.capacity.snapshot("s-1", 1)
        assert node.client().ping().pid == node.pid
