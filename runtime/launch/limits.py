"""The spec's lenient limit rules as pure functions: spawn caps, capacity, depth, timeouts.

Owns R-CFG-1/2/3/4/8 and R-TMO-1/3/4/5 exactly as the spec states them, one function per rule,
each taking raw values (an environment string, a config value of any type) and never raising
for a value the spec says to ignore. It reads no environment and no file: runtime.config feeds
it, after validating what came from files (SPEC §0.4), and launchers call it directly.
"""

from __future__ import annotations

import math
import re

from subagents_node.messages.constants import MAX_TIMEOUT_MS
from subagents_node.messages.errors import InvalidTimeout

#: R-TMO-2: the built-in foreground and async-single default.
DEFAULT_TIMEOUT_MS = 1_800_000
DEFAULT_SPAWNS_PER_RUN = 64
DEFAULT_MAX_DEPTH = 2


def as_integer(value: object) -> int | None:
    """A config value as an integer, the way the original's JSON numbers behave: ints and
    integral floats count, booleans, strings and everything else do not."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


#: A number as an environment variable may spell it: ASCII decimal (int() and float() would
#: also take "1_000" and other scripts' digits).
DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def parse_env_int(raw: str | None) -> int | None:
    """An environment value parsed as a number (R-CFG-3/4: "string -> number"), if integral.

    Unset and blank values are None (treated as unset). Decimal forms such as "8", " 8 ",
    "8.0" and "1e1" parse; anything else (including hex, which JavaScript would accept) is None.
    """
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    # Plain ASCII decimal only: int() would also take "1_000" and full-width digits.
    if not DECIMAL.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return as_integer(float(text))
    except ValueError:
        return None


def resolve_capacity_limit(value: object) -> int:
    """R-CFG-1/2: a positive integer is the cap; unset, 0, negatives, non-integers and
    non-numbers mean unlimited, reported as 0."""
    number = as_integer(value)
    return number if number is not None and number > 0 else 0


def resolve_spawns_per_run(env_value: str | None, config_value: object) -> int:
    """R-CFG-3: env wins when it parses to a positive integer, else a positive config value,
    else 64. Zero, negative and invalid values fall through."""
    number = parse_env_int(env_value)
    if number is not None and number > 0:
        return number
    number = as_integer(config_value)
    if number is not None and number > 0:
        return number
    return DEFAULT_SPAWNS_PER_RUN


def resolve_spawns_per_session(env_value: str | None, config_value: object) -> int:
    """R-CFG-4: env wins when it parses to a non-negative integer (0 = unlimited, overriding a
    config cap), else a non-negative config value, else unlimited. Returns 0 for unlimited.

    Empty env values are unset (the original read them as 0, i.e. "unlimited")."""
    number = parse_env_int(env_value)
    if number is not None and number >= 0:
        return number
    number = as_integer(config_value)
    if number is not None and number >= 0:
        return number
    return 0


def resolve_max_depth(env_value: str | None, config_value: object) -> int:
    """R-CFG-8: SUBAGENTS_MAX_DEPTH when a non-negative integer, else the config's
    max_subagent_depth when one, else 2. Empty env values are unset (the original: 0)."""
    number = parse_env_int(env_value)
    if number is not None and number >= 0:
        return number
    number = as_integer(config_value)
    if number is not None and number >= 0:
        return number
    return DEFAULT_MAX_DEPTH


def resolve_timeout_ms(value: object) -> int | None:
    """R-TMO-1: the config default counts only as an integer in [1, 2147483647]; else None
    (the built-in defaults apply)."""
    number = as_integer(value)
    if number is None or not 1 <= number <= MAX_TIMEOUT_MS:
        return None
    return number


def validate_call_timeout(timeout_ms: object = None, max_runtime_ms: object = None) -> int | None:
    """R-TMO-3: the call's timeout from two aliases, each a positive integer if given.

    §0.4 (resolving A-8): call values are capped like the config's, at 2147483647 ms.
    """
    given: list[tuple[str, int]] = []
    for name, value in (("timeout_ms", timeout_ms), ("max_runtime_ms", max_runtime_ms)):
        if value is None:
            continue
        number = as_integer(value)
        if number is None or number <= 0:
            raise InvalidTimeout(
                f"{name} must be a positive integer.", name=name, value=repr(value)
            )
        if number > MAX_TIMEOUT_MS:
            raise InvalidTimeout(
                f"{name} must be at most {MAX_TIMEOUT_MS} ms.", name=name, value=repr(value)
            )
        given.append((name, number))
    if len(given) == 2 and given[0][1] != given[1][1]:
        raise InvalidTimeout(
            "timeout_ms and max_runtime_ms are aliases; provide only one value or use the same "
            "value for both.",
            name="timeout_ms",
            value=repr(timeout_ms),
        )
    return given[0][1] if given else None
