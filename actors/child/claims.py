"""The node's side of a shim's claim of its child (`shim.json`, records.py) after a restart.

Owns one decision: which shim claimed a child still recorded as running, read from its row or
its claim file, or, when no shim claimed it, the claim taken for the node (`{"abandoned":
true}`, exclusively: link(2)), so that no shim forked before the restart starts the child
late. A shim claims with the same exclusive write before it starts its child: exactly one of
the two wins. It never signals a process and never writes a row.
"""

from __future__ import annotations

import os
from typing import Any

from subagents_node.actors.child.procfs import ProcessIdentity
from subagents_node.actors.child.readback import read_record
from subagents_node.actors.child.records import SHIM_RECORD, write_atomically


def claimed_shim(row: Any, record_dir: str) -> ProcessIdentity | None:
    """The shim's identity, from the row or its own record; None when it never claimed the
    child, which is then claimed here for the node, so no late shim starts it."""
    if row["shim_pid"] is not None:
        return ProcessIdentity(row["shim_pid"], row["shim_start"])
    path = os.path.join(record_dir, SHIM_RECORD)
    if record_dir:
        os.makedirs(record_dir, mode=0o700, exist_ok=True)
        if write_atomically(path, {"abandoned": True}, exclusive=True):
            return None
    claim = read_record(path) or {}
    if claim.get("abandoned") or "shim_pid" not in claim:
        return None
    return ProcessIdentity(int(claim["shim_pid"]), float(claim["shim_start"]))
