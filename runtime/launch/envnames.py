"""The `SUBAGENTS_*` environment variable names this program knows, and the warning for one it
does not (a typo such as `SUBAGENTS_MAX_SPAWN_PER_RUN` was ignored without a word, and the
setting it meant kept its default).

Owns the list of known names: every configuration key's variable (`ENV_NAMES`, which config.py
reads), the variables a node sets for its children and a client reads (messages/constants.py,
`ENV_*`), the tests' fault switches (`SUBAGENTS_TEST_*`) and the examples' `SUBAGENTS_LAUNCH`
(examples/agents/recursive.py). An unknown name is only warned about, never refused: other
tools may set a variable of their own under this prefix. It never shows a variable's value
(it may be a secret) and never changes the environment.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from subagents_node.messages import constants

#: The environment variable of each key (SPEC §0.1 names the first three).
ENV_NAMES: Mapping[str, str] = {
    "max_subagent_spawns_per_run": "SUBAGENTS_MAX_SPAWNS_PER_RUN",
    "max_subagent_spawns_per_session": "SUBAGENTS_MAX_SPAWNS_PER_SESSION",
    "max_subagent_depth": constants.ENV_MAX_DEPTH,
    "max_active_async_runs_per_session": "SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION",
    "timeout_ms": "SUBAGENTS_TIMEOUT_MS",
    "reservation_ttl_s": "SUBAGENTS_RESERVATION_TTL_S",
    "agent_dirs": "SUBAGENTS_AGENT_DIRS",
    "listen": "SUBAGENTS_LISTEN",
    "grant_authority": "SUBAGENTS_GRANT_AUTHORITY",
    "state_dir": constants.ENV_STATE_DIR,
    "max_watchers": "SUBAGENTS_MAX_WATCHERS",
    "child_log_max_bytes": "SUBAGENTS_CHILD_LOG_MAX_BYTES",
    "node_log_max_bytes": "SUBAGENTS_NODE_LOG_MAX_BYTES",
    "node_log_backups": "SUBAGENTS_NODE_LOG_BACKUPS",
    "run_retention_days": "SUBAGENTS_RUN_RETENTION_DAYS",
    "containment": "SUBAGENTS_CONTAINMENT",
}

PREFIX = "SUBAGENTS_"
#: Variables under these prefixes are someone else's to check (the tests' fault injection).
_OTHERS = ("SUBAGENTS_TEST_",)
#: What the examples' recursive agent reads: the command that launches its children.
_EXAMPLES = ("SUBAGENTS_LAUNCH",)
#: Most characters of a name a warning repeats.
_SHOWN_CHARS = 100


def known_names() -> frozenset[str]:
    """Every `SUBAGENTS_*` variable this program (or its documented examples) reads."""
    set_by_node = {
        value
        for name, value in vars(constants).items()
        if name.startswith("ENV_") and isinstance(value, str) and value.startswith(PREFIX)
    }
    return frozenset({*ENV_NAMES.values(), *set_by_node, *_EXAMPLES})


def unknown_names(env: Mapping[str, str]) -> list[str]:
    """The `SUBAGENTS_*` names in `env` that nothing here reads, sorted."""
    known = known_names()
    return sorted(
        name
        for name in env
        if name.startswith(PREFIX) and name not in known and not name.startswith(_OTHERS)
    )


def unknown_variables(env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each unknown `SUBAGENTS_*` name in `env` (cut to a readable length) and the known name
    closest to it (None when none is close)."""
    # Compared without the prefix they all share: with it, any name looked close to some
    # known one (`SUBAGENTS_FOO`, "did you mean SUBAGENTS_NODE?").
    known = {name.removeprefix(PREFIX): name for name in sorted(known_names())}
    found = []
    for name in unknown_names(env):
        close = difflib.get_close_matches(name.removeprefix(PREFIX), list(known), n=1)
        shown = name if len(name) <= _SHOWN_CHARS else f"{name[: _SHOWN_CHARS - 1]}…"
        found.append((shown, known[close[0]] if close else None))
    return found


def unknown_warning(name: str, closest: str | None) -> str:
    """The warning for unknown variable `name`: its name (never its value) and the hint."""
    hint = f"did you mean {closest}?" if closest else "no setting has this name"
    return f"unknown environment variable {name} is ignored ({hint})"


def unknown_warnings(env: Mapping[str, str]) -> list[str]:
    """One line per unknown `SUBAGENTS_*` variable in `env` (`unknown_warning`)."""
    return [unknown_warning(name, closest) for name, closest in unknown_variables(env)]
