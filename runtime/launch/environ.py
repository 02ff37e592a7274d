"""Which of the caller's environment variables a launch carries to its children.

Owns one rule: a request carries an environment as UTF-8 text (msgpack strings), so a
variable whose name or value is not UTF-8 (Python holds such bytes as lone surrogates: an
OLDPWD left by a `cd` into a Latin-1 directory, a file name in some tool's variable) cannot
travel. It is left out, with one warning naming it, instead of failing every launch with
"invalid Launch request: env.OLDPWD: Input should be a valid string".

It must never change the process's own environment, and never drop a variable that can travel.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: How many of the left-out names the warning lists (the count says how many there were).
_NAMES_SHOWN = 5


def is_text(value: str) -> bool:
    """Whether `value` can travel in a request: no lone surrogate (bytes that were not UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: bytes that were not UTF-8
        return False
    return True


def carried_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the variables a launch cannot carry; a warning names those left out."""
    carried: dict[str, str] = {}
    left_out: list[str] = []
    for name, value in environ.items():
        if is_text(name) and is_text(value):
            carried[name] = value
        else:
            left_out.append(name)
    if left_out:
        shown = ", ".join(ascii(name)[:80] for name in left_out[:_NAMES_SHOWN])
        more = f" and {len(left_out) - _NAMES_SHOWN} more" if len(left_out) > _NAMES_SHOWN else ""
        log.warning(
            "the children do not get %d environment variable(s) whose name or value is not "
            "UTF-8 text (a launch carries text only): %s%s",
            len(left_out),
            shown,
            more,
        )
    return carried
