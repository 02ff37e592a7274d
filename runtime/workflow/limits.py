"""How large a workflow's record may grow: its return value, its emits and its console lines.

Owns the largest batch one admission group may claim (`check_batch`) and the one size
limit of what a script leaves in `result.json` and in its text (R-RUN-7,
R-WF-9): the return value and the emitted values together are each at most
`RECORD_MAX_BYTES` as UTF-8 JSON, over it is a `WorkflowResultTooLarge` naming the size and
the limit (data cut short would be wrong data); console lines are text, so, like a child's
capped log, the ones past the limit are dropped and one marker line says how many bytes went.
It never writes a file and never talks to a node.
"""

from __future__ import annotations

import json
from typing import Any

from subagents_node.messages.codec import MAX_FRAME_BYTES
from subagents_node.messages.errors import WorkflowCallInvalid, WorkflowResultTooLarge
from subagents_node.messages.fanout import MAX_PATHS

#: The node's own frame cap: a value a client could not even be sent in one request is no
#: result to keep. The record is held in memory, written twice in the text (`summary` and
#: `output`, R-RUN-7) and once as data, so this bounds result.json to a few MiB.
RECORD_MAX_BYTES = MAX_FRAME_BYTES
CONSOLE_CUT_LINE = (
    "[subagents-node: {dropped} bytes of console output were dropped here "
    "(the console limit is {limit} bytes)]"
)


def json_size(data: Any) -> int:
    """Bytes of `data` (already JSON data) as compact UTF-8 JSON."""
    return len(json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def check_batch(new_keys: int) -> None:
    """One admission group's claim (one fan-out claim request) names at most MAX_PATHS paths,
    or WorkflowCallInvalid. Past it, the owner's request schema refused the claim, and the
    script read an internal "invalid fanout.claim request: paths: List should have at most …"
    (after every entry's launch was built)."""
    if new_keys > MAX_PATHS:
        raise WorkflowCallInvalid(
            f"runs.all admits at most {MAX_PATHS:,} new keys in one batch (one fan-out claim), "
            f"not {new_keys:,}; split the batch",
            field="specs",
            requested=new_keys,
            limit=MAX_PATHS,
        )


def check_value(data: Any) -> None:
    """The script's return value (JSON data) fits the limit, or WorkflowResultTooLarge."""
    size = json_size(data)
    if size > RECORD_MAX_BYTES:
        raise WorkflowResultTooLarge(
            f"the workflow's return value is {size:,} bytes as JSON, over the "
            f"{RECORD_MAX_BYTES:,}-byte limit",
            size=size,
            limit=RECORD_MAX_BYTES,
        )


def check_emit(size: int, emitted: int) -> None:
    """One more emit of `size` bytes after `emitted` bytes fits, or WorkflowResultTooLarge
    (nothing is added, so a script that catches it keeps what it emitted)."""
    if emitted + size > RECORD_MAX_BYTES:
        raise WorkflowResultTooLarge(
            f"emit() of {size:,} bytes as JSON would bring the workflow's emitted values to "
            f"{emitted + size:,} bytes, over the {RECORD_MAX_BYTES:,}-byte limit",
            size=emitted + size,
            limit=RECORD_MAX_BYTES,
        )


class ConsoleLines:
    """The workflow's console lines, at most `RECORD_MAX_BYTES` of them (UTF-8); the rest is
    counted, not kept, and shows as one marker line at the end."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._kept = 0
        self._dropped = 0

    def add(self, line: str) -> None:
        size = len(line.encode("utf-8", "surrogatepass")) + 1  # its newline
        if self._dropped or self._kept + size > RECORD_MAX_BYTES:
            self._dropped += size
            return
        self._lines.append(line)
        self._kept += size

    def lines(self) -> list[str]:
        if not self._dropped:
            return list(self._lines)
        cut = CONSOLE_CUT_LINE.format(dropped=self._dropped, limit=RECORD_MAX_BYTES)
        return [*self._lines, cut]

    def __bool__(self) -> bool:
        return bool(self._lines) or bool(self._dropped)
