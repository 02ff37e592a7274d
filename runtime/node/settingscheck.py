"""The domain of each key of `NodeOptions.settings`, checked before a node takes anything and
again as the node hands them to its owners.

Owns which keys a node's settings may hold and the check of their values:

- the configuration keys (runtime/launch/config.py `Settings`), each validated by that model's
  own field definition, so a domain is stated once and a program's `Node.embedded(settings=...)`
  gets what `subagents.toml` gets, without the configuration loader's own floors (a
  `reservation_ttl_s` under a second, for tests of a slot's expiry, is a program's to set);
- the node's test-only keys (`TEST_KEYS`: fault injection, a shorter owner-to-owner call
  timeout and a home's shorter wait for its workers), each with its domain here.

Any other key is refused with the known names: a typo (`reservaton_ttl_s`) would otherwise be
ignored silently and the default served. No key the owners read is left out by that rule: the
keys the node composes for its owners itself (`NODE_KEYS`: where the runs live, the node's
address and pid, the children's cgroup) are refused too, because a program's value used to
override the node's (`node_pid` made every owner exit as it started).

Before, only "a dict of str keys" was checked: `reservation_ttl_s="abc"` crashed the capacity
owner at its first reservation, `run_retention_days="x"` the fanout and runs owners at every
restart, and `reservation_ttl_s=-1` freed every slot at once. `check_settings` refuses such a
value (`BadRequest`, `details["reason"] == "argument"`, `details["field"] == "settings.<key>"`)
before the state dir is created or anything forked; `usable_settings` is what the node hands
its owners (runtime/node/ownerspecs.py): a value changed since the check is dropped (its default
served) and logged, never raised. It never touches the file system.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from subagents_node.launch.config import Settings
from subagents_node.messages.errors import BadRequest

#: The longest owner-to-owner call timeout (a week, as a client's timeout).
MAX_CALL_TIMEOUT_S = 7 * 24 * 3600.0
#: Tests only: the admission steps that fail, the launch steps at which the node kills itself
#: (both live only with `faults=True`), a shorter owner-to-owner call timeout, and a home's
#: shorter wait for its workers' answers (runtime/node/hostcalls.py).
TEST_KEYS = ("fault_points", "fault_kill_points", "owner_call_timeout_s", "host_call_timeout_s")
#: The test keys that are a number of seconds.
_TIMEOUT_KEYS = ("owner_call_timeout_s", "host_call_timeout_s")
#: Composed by the node for its owners (runtime/node/ownerspecs.py), never a program's.
NODE_KEYS = (
    "runs_dir",
    "node_address",
    "runs_address",
    "node_pid",
    "cgroup_base",
    "caps_child_logs",
    "children_end_with_node",
    "child_open_files",
)
CONFIG_KEYS = tuple(Settings.model_fields)
KNOWN_KEYS = CONFIG_KEYS + TEST_KEYS


def _shown(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:80] + "…"


def _refuse(key: str, what: str) -> BadRequest:
    return BadRequest(
        f"NodeOptions.settings.{key} {what}", reason="argument", field=f"settings.{key}"
    )


def _number(bound: object) -> str:
    return str(int(bound)) if isinstance(bound, int | float) and bound == int(bound) else str(bound)


def _bounds(info: FieldInfo) -> str:
    found = {
        type(rule).__name__: getattr(rule, type(rule).__name__.lower()) for rule in info.metadata
    }
    high = f"{_number(found['Le'])}" if "Le" in found else ""
    if "Ge" in found:
        return (
            f"from {_number(found['Ge'])} to {high}" if high else f"from {_number(found['Ge'])} up"
        )
    if "Gt" in found:
        low = f"above {_number(found['Gt'])}"
        return f"{low}, at most {high}" if high else low
    return f"at most {high}" if high else ""


def _domain(info: FieldInfo) -> str | None:
    """The field's domain in words, from what config.Settings states (None: no words for it)."""
    kind = info.annotation
    args = [a for a in get_args(kind) if a is not type(None)]
    optional = type(None) in get_args(kind)
    base = args[0] if optional and len(args) == 1 else kind
    if get_origin(base) is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(base))
    nouns: dict[object, str] = {int: "an integer", float: "a number"}
    noun = nouns.get(base)
    if noun is None:
        return None
    words = f"{noun} {_bounds(info)}".strip()
    return f"None or {words}" if optional else words


def _config_problem(key: str, value: object) -> str | None:
    """Why `value` does not fit config key `key` (None: it fits), said by the model itself."""
    try:
        Settings.model_validate({key: value})
    except ValidationError as exc:
        domain = _domain(Settings.model_fields[key])
        if domain is not None:
            return f"must be {domain}, not {_shown(value)}"
        said = str(exc.errors(include_url=False, include_context=False)[0]["msg"])
        return f"is invalid: {said[:1].lower()}{said[1:]} (got {_shown(value)})"
    return None


def _test_problem(key: str, value: object) -> str | None:
    if key in _TIMEOUT_KEYS:
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not (math.isfinite(value) and 0 < value <= MAX_CALL_TIMEOUT_S)
        ):
            domain = f"a number of seconds above 0, at most {MAX_CALL_TIMEOUT_S:g}"
            return f"must be {domain}, not {_shown(value)}"
        return None
    names = isinstance(value, list | tuple) and all(isinstance(p, str) for p in value)
    return None if names else f"must be a list of step names, not {_shown(value)}"


def _problem(key: str, value: object) -> str | None:
    if key in CONFIG_KEYS:
        return _config_problem(key, value)
    if key in TEST_KEYS:
        return _test_problem(key, value)
    if key in NODE_KEYS:
        return "is set by the node for its owners, not by a program"
    close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"is not a setting ({hint}known: {', '.join(KNOWN_KEYS)})"


def check_settings(settings: Mapping[str, Any]) -> None:
    """Raise a `BadRequest` naming the first key that is unknown or whose value is outside its
    domain (`settings` is a mapping of str keys: the caller checked that)."""
    for key, value in settings.items():
        if (problem := _problem(key, value)) is not None:
            raise _refuse(key, problem)


def usable_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The owner's side: `settings` without the user keys whose values are outside their
    domain (their defaults are served), and a line for each dropped. The node's own keys pass:
    only the node writes them. Never raises."""
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in settings.items():
        try:
            problem = None if key in NODE_KEYS else _problem(key, value)
        except Exception as exc:  # a value whose own methods raise: as unusable as any
            problem = f"cannot be checked ({type(exc).__name__})"
        if problem is None:
            kept[key] = value
        else:
            dropped.append(f"setting '{key}' {problem}: ignored")
    return kept, dropped
