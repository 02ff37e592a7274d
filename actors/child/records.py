"""The two files a child shim keeps beside its run: who the shim is, and how the child ended.

Owns their names and the one way they are written (`write_atomically`: temp, rename or link,
fsync when asked, by messages/statefiles.py's rules), shared by the shim that writes them and
the run supervisor that claims a child at recovery (link(2): exactly one of them wins).
Standard library only, and messages/statefiles.py (the shim template imports it). It never
reads a record: readback.py does, for the run supervisor.
"""

from __future__ import annotations

import json
from typing import Any

from subagents_node.messages import statefiles

#: Who the shim is (written once, exclusively: it claims the child before starting it).
SHIM_RECORD = "shim.json"
#: The exit status and whether the tree ended, written before each report that tells of it.
EXIT_RECORD = "exit.json"


def write_atomically(
    path: str, data: dict[str, Any], *, exclusive: bool = False, sync: bool = True
) -> bool:
    """Write `data` as JSON to `path`: temp file, fsync, then rename (or link, which fails when
    `path` exists: `exclusive`), then fsync the directory (both unless `sync` is False).
    False when exclusive lost. The temp file's name is fresh and made O_EXCL
    (messages/statefiles.py): a child that knows its shim's pid could otherwise plant a
    symlink under the name, and the record would be written through it."""
    return statefiles.replace_file(path, json.dumps(data).encode(), exclusive=exclusive, sync=sync)
