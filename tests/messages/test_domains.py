"""Every request field has a bounded domain (issue 12, "Domain-bounded schemas"; DESIGN §4).

A meta-test over the request union, read from each model's JSON schema (what pydantic enforces):
every integer has both bounds inside SQLite's 64-bit range, every number is bounded, every
string, list and map has a maximum size. A new field without a domain from
`messages/domains.py` fails here, before a hostile frame finds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import TypeAdapter

from subagents_node.messages.base import validate_request
from subagents_node.messages.capacity import Snapshot
from subagents_node.messages.constants import SQLITE_MAX_INT, SQLITE_MIN_INT
from subagents_node.messages.domains import SessionId
from subagents_node.messages.errors import BadRequest
from subagents_node.messages.protocol import REQUEST_CLASSES

#: Fields that are free-form on purpose, with the reason (checked by their own validator).
FREE_FORM = {("fanout.create", "limit"): "ShallowValue: depth, element count and strings bounded"}


def leaves(schema: dict[str, Any], defs: dict[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    if "$ref" in schema:
        yield from leaves(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, path)
        return
    for option in schema.get("anyOf", ()):
        yield from leaves(option, defs, path)
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        for name, sub in schema["properties"].items():
            yield from leaves(sub, defs, f"{path}.{name}" if path else name)
        return
    if kind == "array":
        yield path, schema
        yield from leaves(schema.get("items", {}), defs, f"{path}[]")
        return
    if kind == "object":
        yield path, schema
        for sub in schema.get("patternProperties", {}).values():
            yield from leaves(sub, defs, f"{path}{{}}")
        return
    if kind is not None or "anyOf" not in schema:
        yield path, schema


def unbounded(schema: dict[str, Any]) -> str | None:
    kind = schema.get("type")
    if "const" in schema or "enum" in schema or kind in ("boolean", "null"):
        return None
    if kind == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum", schema.get("exclusiveMaximum"))
        if lo is None or hi is None or lo < SQLITE_MIN_INT or hi > SQLITE_MAX_INT:
            return f"integer range [{lo}, {hi}] is not inside SQLite's"
        return None
    if kind == "number":
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum", schema.get("exclusiveMaximum"))
        return None if lo is not None and hi is not None else "number without both bounds"
    if kind == "string":
        return None if "maxLength" in schema or "enum" in schema else "string without maxLength"
    if kind == "array":
        return None if "maxItems" in schema else "list without maxItems"
    if kind == "object":
        return None if "maxProperties" in schema else "map without maxProperties"
    return f"no type: {schema}"


CASES = [
    (str(kind.model_fields["type"].default), path, schema)
    for kind in REQUEST_CLASSES
    for path, schema in leaves(
        kind.model_json_schema(), kind.model_json_schema().get("$defs", {}), ""
    )
    if path != "type"
]


@pytest.mark.parametrize(("type_", "path", "schema"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_issue12_every_request_field_has_a_bounded_domain(
    type_: str, path: str, schema: dict[str, Any]
) -> None:
    if (type_, path) in FREE_FORM:
        return
    problem = unbounded(schema)
    assert problem is None, f"{type_} field {path}: {problem}"


@pytest.mark.parametrize("session_id", ["a\nb", "a\tb", "\x1b[31mred", "a\x7fb", "a\x00b"])
def test_a_session_id_with_a_control_character_is_refused_naming_the_field(
    session_id: str,
) -> None:
    """The CLI refuses control characters in a session id; so does every request that names
    one (a newline would forge a line of a table or a log, and name a session nobody can
    type back)."""
    with pytest.raises(ValueError, match="control character"):
        TypeAdapter(SessionId).validate_python(session_id)
    with pytest.raises(BadRequest) as refused:
        validate_request(Snapshot, {"session_id": session_id, "limit": 1})
    assert refused.value.details.get("field") == "session_id"
    assert "\n" not in str(refused.value)  # one line, whatever the id held
    accepted = validate_request(Snapshot, {"session_id": "ops-1 (night shift) é", "limit": 1})
    assert accepted.session_id == "ops-1 (night shift) é"
