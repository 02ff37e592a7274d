"""What the run supervisor reads back of the records a shim keeps beside its run (records.py):
each record as the JSON object it holds, and an exit record as the report it preceded.

A record is read as a state file (messages/statefiles.py): never through a link, never blocking
on a FIFO a child put in its place, at most 1 MiB; one that cannot be read or parsed is taken as
none, with one warning. It never writes a record and never decides what one means for the child.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from subagents_node.messages import statefiles
from subagents_node.messages.runs import ChildReport

log = logging.getLogger(__name__)


def read_record(path: str) -> dict[str, Any] | None:
    """The record at `path`; None when missing or not parsing, as a FIFO or a link a child put
    there is (statefiles.py): a blocking open() here wedged the supervisor for good."""
    try:
        data = json.loads(statefiles.read_file(path, 1 << 20))  # records are < 64 KiB
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("child record %s is unreadable, taken as none: %s", path, exc)
        return None
    return data if isinstance(data, dict) else None


def report_from_record(record: dict[str, Any]) -> ChildReport | None:
    """An exit record read back as the report it preceded (None when it does not parse)."""
    fields = {k: v for k, v in record.items() if k in ChildReport.model_fields and k != "type"}
    kind = "tree_ended" if record.get("tree_ended") else "exited"
    if record.get("error") and record.get("pid") is None:
        kind = "not_started"
    try:
        return ChildReport.model_validate({**fields, "kind": kind, "seq": 1})
    except ValidationError:
        return None
