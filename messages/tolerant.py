"""How a client reads a reply from a node one release newer, and a node a reply from another
node (a worker its home's, a home its worker's): the fields its models do not know, at any
depth, are dropped before the reply is validated (docs/api.md, "Compatibility").

Owns `known_fields`: a copy of a reply body that keeps only what the model's fields (and the
fields of the models inside them: lists, tuples, dict values, optionals, unions) name, guided by
the models' type hints. Values it cannot place stay as they are, for the model to judge.

It must never be used on a request (what a node receives as one stays strict: a typo there
must be an error), nor on the replies the owners of one node send each other (one release),
and never decides validity itself: the strict model validates what it returns. It imports
nothing of ours.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

#: The containers whose items a hint of this origin types alike (`list[X]`, `tuple[X, ...]`).
_SEQUENCES = (list, tuple, set, frozenset)


def known_fields(kind: type[BaseModel], body: dict[str, Any]) -> dict[str, Any]:
    """`body` without the keys `kind` does not know, at any nesting level (a new copy)."""
    return _fields_of((kind,), body)


def _known(hint: Any, value: Any) -> Any:
    """`value` as a field typed `hint` keeps it: unknown keys of the models in it dropped."""
    if isinstance(value, dict):
        models = _models(hint)
        if models:
            return _fields_of(models, value)
        items = _dict_values(hint)
        return {k: _known(items, v) for k, v in value.items()} if items is not None else value
    if isinstance(value, list | tuple):
        return [
            _known(item, v) for item, v in zip(_item_hints(hint, len(value)), value, strict=True)
        ]
    return value


def _fields_of(models: tuple[type[BaseModel], ...], body: dict[str, Any]) -> dict[str, Any]:
    # A union of several models keeps every key one of them knows: the model picks its member.
    hints: dict[str, Any] = {}
    for model in models:
        for name, field in model.model_fields.items():
            hints.setdefault(field.alias or name, field.annotation)
    return {key: _known(hints[key], value) for key, value in body.items() if key in hints}


def _members(hint: Any) -> tuple[Any, ...]:
    """The types a hint may be: a union's members, an Annotated's type, else itself."""
    origin = get_origin(hint)
    if origin is Annotated:
        return _members(get_args(hint)[0])
    if origin is Union or origin is types.UnionType:
        return tuple(m for arg in get_args(hint) for m in _members(arg))
    return (hint,)


def _models(hint: Any) -> tuple[type[BaseModel], ...]:
    return tuple(m for m in _members(hint) if isinstance(m, type) and issubclass(m, BaseModel))


def _dict_values(hint: Any) -> Any | None:
    """The value hint of the first `dict[K, V]` the hint may be (None: it is no dict)."""
    for member in _members(hint):
        if get_origin(member) is dict:
            args = get_args(member)
            return args[1] if len(args) == 2 else Any
    return None


def _item_hints(hint: Any, count: int) -> list[Any]:
    """The hint of each of `count` items of the first sequence the hint may be (Any when it is
    none: the items are kept as they are)."""
    for member in _members(hint):
        origin = get_origin(member)
        if origin not in _SEQUENCES:
            continue
        args = get_args(member)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            # A fixed tuple types each place; extra places are the model's to refuse.
            return [*args[:count], *[Any] * (count - len(args))]
        return [args[0] if args else Any] * count
    return [Any] * count
