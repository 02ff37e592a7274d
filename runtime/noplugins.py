"""Our own processes (the command line, the node it starts, the owners it forks) load no
pydantic plugins, and so never pay for looking for them.

pydantic looks for plugins when it builds its first model: its loader imports
`importlib.metadata` (with email, zipfile, csv, shutil: ~1.5 MiB of heap that every owner forked
from the node inherits, ~15 ms of every CLI call and node start) and then reads the entry points
of every distribution installed. A node runs no plugin on purpose: one installed in the same
environment would see every ledger message validated in every owner. So an entry point calls
`keep_pydantic_plugins_out()` before anything of ours builds a model, and pydantic finds, in its
loader's place, a module whose `get_plugins()` finds none (what it answers itself when
`PYDANTIC_DISABLE_PLUGINS=__all__`, without the import).

It owns that stand-in and nothing else. It must never run inside a user's program: importing
`subagents_node` (the programmatic API, an embedded node) leaves pydantic as it finds it; only
the command line's package (`subagents-node`, `python -m subagents_node`) calls it. It
imports nothing of ours and not pydantic.
"""

from __future__ import annotations

import sys
from types import ModuleType

#: The module pydantic imports its `get_plugins` from (pydantic.plugin._schema_validator,
#: pydantic 2.5 to 2.x). tests/cli/test_noplugins.py checks that the installed pydantic
#: still asks it, and only for that name.
LOADER = "pydantic.plugin._loader"


def _no_plugins() -> tuple[()]:
    return ()


def keep_pydantic_plugins_out() -> None:
    """Put the stand-in in the loader's place, unless the real loader already ran in this
    process (then its plugins stay as they are: nothing is taken back)."""
    if LOADER not in sys.modules:
        stand_in = ModuleType(LOADER, "subagents_node's stand-in for pydantic's plugin loader")
        stand_in.get_plugins = _no_plugins  # type: ignore[attr-defined]
        sys.modules[LOADER] = stand_in
