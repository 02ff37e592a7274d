"""Hypothesis strategies for request bodies, derived from the wire models themselves.

What it owns: turning a request model's JSON schema (pydantic builds it from the same
annotations the node validates with) into a strategy for bodies the model accepts, and the
mutations that make a body hostile: integers at and past SQLite's range, long strings, NUL
bytes, deep nesting, wrong types, unknown and missing fields. It never talks to a node.

Sizes are kept small on purpose (lists of up to 3 items, strings of up to 24 characters unless
the schema asks for more): the point is coverage of every field, not volume.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

from subagents_node.messages.base import Request

Json = dict[str, Any]

#: Values that sit at or past the edges of every integer domain msgpack can carry.
EXTREME_INTS = (2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**31) - 1, -(2**63))
EXTREME_FLOATS = (float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 5e-324)
#: Shapes no field expects: each stands for a wrong type somewhere.
WRONG_TYPES: tuple[Any, ...] = ({}, [], True, b"\x00bytes", None, 1.5, "text", [[[]]])


def body_strategy(kind: type[Request]) -> st.SearchStrategy[Json]:
    """Bodies `kind` accepts (mostly: cross-field validators may still refuse some)."""
    schema = kind.model_json_schema()
    defs = schema.get("$defs", {})
    return _of(schema, defs, 0).map(lambda body: {k: v for k, v in body.items() if k != "type"})


def _of(schema: Json, defs: Json, depth: int) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        return _of(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, depth)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([_of(s, defs, depth) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, defs, depth)
    if kind == "array":
        lo = schema.get("minItems", 0)
        hi = min(schema.get("maxItems", 3), max(lo, 3))
        items = schema.get("items", {})
        return st.lists(_of(items, defs, depth + 1), min_size=lo, max_size=hi)
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        lo = schema.get("minimum", _plus(schema.get("exclusiveMinimum"), 1))
        hi = schema.get("maximum", _plus(schema.get("exclusiveMaximum"), -1))
        return st.integers(lo, hi)
    if kind == "number":
        return st.floats(
            schema.get("minimum", schema.get("exclusiveMinimum")),
            schema.get("maximum", schema.get("exclusiveMaximum")),
            exclude_min="exclusiveMinimum" in schema,
            exclude_max="exclusiveMaximum" in schema,
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    # an unconstrained value (`Any`): small scalars and a shallow list
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10), st.text(max_size=8))
    return st.one_of(scalars, st.lists(scalars, max_size=3))


def _plus(bound: int | None, step: int) -> int | None:
    return None if bound is None else bound + step


def _object(schema: Json, defs: Json, depth: int) -> st.SearchStrategy[Json]:
    properties: Json = schema.get("properties", {})
    if "patternProperties" in schema:  # a map with constrained keys (an environment)
        pattern, values = next(iter(schema["patternProperties"].items()))
        keys = _string({**schema.get("propertyNames", {}), "pattern": pattern})
        return st.dictionaries(keys, _of(values, defs, depth + 1), max_size=3)
    if not properties and isinstance(schema.get("additionalProperties"), dict):
        values = schema["additionalProperties"]
        keys = _string(schema.get("propertyNames", {"minLength": 1}))
        return st.dictionaries(keys, _of(values, defs, depth + 1), max_size=3)
    required = set(schema.get("required", ()))
    fields = {
        name: _of(sub, defs, depth + 1) for name, sub in properties.items() if name in required
    }
    optional = {
        name: _of(sub, defs, depth + 1) for name, sub in properties.items() if name not in required
    }
    return st.fixed_dictionaries(fields, optional=optional)


def _string(schema: Json) -> st.SearchStrategy[str]:
    lo = schema.get("minLength", 0)
    hi = min(schema.get("maxLength", 24), max(lo, 24))
    if "pattern" in schema:
        pattern = schema["pattern"]
        # `^[class]+$` with an exact or narrow length (a key of 40 z85 characters): ask the regex
        # for that length instead of filtering almost everything away
        repeated = re.fullmatch(r"\^(\[[^\]]*(?:\\\][^\]]*)*\])[+*]\$", pattern)
        if repeated:
            pattern = f"^{repeated.group(1)}{{{lo},{hi}}}$"
        # `^[^=]+$` matches NUL and newlines too; keep keys printable so the mutations decide
        # what is hostile, not the regex.
        printable = st.from_regex(
            pattern,
            fullmatch=True,
            alphabet=st.characters(codec="ascii", min_codepoint=32, max_codepoint=126),
        )
        return printable.filter(lambda s: lo <= len(s) <= hi)
    alphabet = st.characters(codec="utf-8", exclude_characters="\x00")
    return st.text(alphabet, min_size=lo, max_size=hi)


# -- mutations --------------------------------------------------------------------------------


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a body a value sits (map keys and list indexes)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _replace(body: Json, path: tuple[Any, ...], new: Any) -> Json:
    def rebuilt(value: Any, rest: tuple[Any, ...]) -> Any:
        if not rest:
            return new
        head, tail = rest[0], rest[1:]
        if isinstance(value, dict):
            return {**value, head: rebuilt(value[head], tail)}
        copy = list(value)
        copy[head] = rebuilt(copy[head], tail)
        return copy

    result: Json = rebuilt(body, path)
    return result


def _nested(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


@st.composite
def hostile(draw: st.DrawFn, body: Json) -> Json:
    """`body` with one hostile change (or unchanged: valid bodies are part of the mix)."""
    paths = _paths(body)
    how = draw(
        st.sampled_from(
            ["none", "int", "float", "long", "nul", "deep", "wrong", "unknown", "missing"]
        )
    )
    if how == "unknown":
        return {**body, draw(st.sampled_from(["extra", "type2", "é" * 300])): 1}
    if how == "missing" and body:
        drop = draw(st.sampled_from(sorted(body)))
        return {k: v for k, v in body.items() if k != drop}
    if how == "none" or not paths:
        return body
    path = draw(st.sampled_from(paths))
    new: Any
    if how == "int":
        new = draw(st.sampled_from(EXTREME_INTS))
    elif how == "float":
        new = draw(st.sampled_from(EXTREME_FLOATS))
    elif how == "long":
        new = draw(st.sampled_from(["r" * 50_000, "a" * 256, "/" + "b" * 256, "é" * 70_000]))
    elif how == "nul":
        new = "x\x00y"
    elif how == "deep":
        new = _nested(draw(st.sampled_from([b"", 0, "x", {}])), draw(st.integers(10, 300)))
    else:
        new = draw(st.sampled_from(WRONG_TYPES))
    return _replace(body, path, new)
