"""Record: the base of the owners' small frozen value types (ticks, call keys, owner specs).

A subclass names its fields in `__slots__` and annotates each (their order is the fields'
order, and its typed `__init__` takes them in that order) and sets them once through
`init_fields`; the base makes it what a frozen, slotted dataclass is: no field can be assigned
or deleted afterwards, it compares equal to a record of the same class with equal fields,
hashes and shows itself by its fields, matches in `match` by keyword or position, and copies
and pickles as itself.

Why not `@dataclass(frozen=True, slots=True)`: on Python 3.11 a dataclass compiles six methods
from source text when its class is defined, about 1 ms each class; a node defines a score of
these types before its owners can start. It must never hold behaviour beyond that: types only.
"""

from __future__ import annotations

import inspect
from dataclasses import FrozenInstanceError
from typing import Any, ClassVar


class Record:
    __slots__ = ()
    #: Every field, base classes' first (set for each subclass when it is defined).
    _fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        slots = set(cls.__dict__.get("__slots__", ()))
        own = [name for name in inspect.get_annotations(cls) if name in slots]
        if set(own) != slots:
            raise TypeError(f"{cls.__qualname__}: annotate every field in __slots__, once")
        cls._fields = (*cls._fields, *own)
        setattr(cls, "__match_args__", cls._fields)  # noqa: B010 (mypy will not let it be assigned)

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Record) and other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({fields})"

    def __reduce__(self) -> tuple[type[Record], tuple[object, ...]]:
        # copy and pickle rebuild it through its __init__ (its parameters are its fields, in
        # order), since no field can be set afterwards.
        return (type(self), self._values())

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")


def init_fields(record: Record, **values: object) -> None:
    """Set a new record's fields (its `__init__` calls this once)."""
    for name, value in values.items():
        object.__setattr__(record, name, value)
