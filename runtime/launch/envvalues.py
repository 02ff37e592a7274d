"""How a `SUBAGENTS_*` variable's text becomes a setting's value, and this process's depth.

Owns the conversion of one variable's text to its key's type (`parse_env_value`: paths
anchored at the working directory, lists split, numbers in plain ASCII decimal) and the reading
of SUBAGENTS_DEPTH (`current_depth`, R-CFG-8). Validation is the configuration loader's
(config.py): what cannot be converted is returned as text, for the loader to refuse naming its
variable. It never reads a file and never changes the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from subagents_node.launch.limits import DECIMAL, parse_env_int
from subagents_node.messages.constants import ENV_DEPTH
from subagents_node.messages.errors import ConfigError

#: The number variables `parse_env_value` converts, by type (each spelled as limits.DECIMAL allows).
_FLOAT_KEYS = frozenset({"reservation_ttl_s", "run_retention_days"})
_INT_KEYS = frozenset(
    {
        "timeout_ms",
        "max_active_async_runs_per_session",
        "max_watchers",
        "child_log_max_bytes",
        "node_log_max_bytes",
        "node_log_backups",
    }
)


def parse_env_value(key: str, raw: str, cwd: Path) -> Any:
    """Turn a variable's text into the key's type; what cannot be converted stays text so
    validation reports it with the variable's name."""
    text = raw.strip()
    if key == "agent_dirs":
        return tuple(str(cwd / Path(p).expanduser()) for p in raw.split(os.pathsep) if p.strip())
    if key == "listen":
        return tuple(part for part in text.replace(",", " ").split() if part)
    if key == "state_dir":
        return str(cwd / Path(text).expanduser())
    convert = float if key in _FLOAT_KEYS else int if key in _INT_KEYS else None
    # Plain ASCII decimal only, as for every other number variable (limits.py): int() and
    # float() also take "1_000" and other scripts' digits ("١٢٣" was 123). What does not
    # convert stays text: validation names the variable and says what it should be.
    if convert is not None and DECIMAL.fullmatch(text):
        try:
            return convert(text)
        except ValueError:
            return text
    return text


#: Depths travel as signed 32-bit integers like every count (SPEC §0.4).
MAX_DEPTH_VALUE = 2_147_483_647


def current_depth(env: Mapping[str, str] | None = None) -> int:
    """R-CFG-8: this process's depth from SUBAGENTS_DEPTH (unset or empty: 0).

    The node sets it for every child; a value that is not a non-negative integer means the
    environment was tampered with, so it is an error rather than a silent depth 0.
    """
    raw = (os.environ if env is None else env).get(ENV_DEPTH)
    if raw is None or not raw.strip():
        return 0
    number = parse_env_int(raw)
    if number is None or not 0 <= number <= MAX_DEPTH_VALUE:
        raise ConfigError(
            f"invalid value for 'depth' in environment variable {ENV_DEPTH}: "
            f"expected an integer from 0 to {MAX_DEPTH_VALUE} (got {raw[:40]!r})",
            key="depth",
            source=f"environment variable {ENV_DEPTH}",
            reason="invalid_value",
            value=repr(raw),
        )
    return number
