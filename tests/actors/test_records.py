"""Record (actors/records.py) behaves as the frozen, slotted dataclass it replaces."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from subagents_node.actors.records import Record, init_fields
from subagents_node.actors.runs.ticks import AppendKey, Expand, LaunchKey, Settle


@dataclasses.dataclass(frozen=True, slots=True)
class _AsDataclass:
    run_id: str
    token: str


def test_a_record_compares_hashes_and_shows_itself_as_the_dataclass_did() -> None:
    key, same = AppendKey("r1", "t1"), _AsDataclass("r1", "t1")
    assert key == AppendKey("r1", "t1") and key != AppendKey("r1", "t2")
    assert hash(key) == hash(same)
    assert repr(key) == repr(same).replace("_AsDataclass", "AppendKey")
    assert AppendKey.__match_args__ == _AsDataclass.__match_args__


def test_records_of_different_classes_with_equal_fields_are_different_keys() -> None:
    """Pipelines key their calls by record: a launch and a settle of one run never collide."""
    calls = {LaunchKey("r1"): "launch", Settle("r1"): "settle"}
    assert calls[LaunchKey("r1")] == "launch" and calls[Settle("r1")] == "settle"
    assert LaunchKey("r1") != Settle("r1")


def test_a_record_is_frozen_and_has_no_other_attribute() -> None:
    key = Expand("r1", 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.group = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del key.group  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.other = 1  # type: ignore[attr-defined]
    assert not hasattr(key, "__dict__")


def test_a_record_matches_by_keyword_and_by_position_in_field_order() -> None:
    match Expand("r1", 2):
        case Expand(run_id="r1", group=group):
            assert group == 2
        case _:
            pytest.fail("no keyword match")
    match Expand("r1", 2):
        case Expand(run_id, group):
            assert (run_id, group) == ("r1", 2)
        case _:
            pytest.fail("no positional match")


def test_a_record_copies_and_pickles_as_itself() -> None:
    key = AppendKey("r1", "t1")
    assert copy.copy(key) == key and copy.deepcopy(key) == key
    assert pickle.loads(pickle.dumps(key)) == key


def test_a_record_must_annotate_every_slot() -> None:
    with pytest.raises(TypeError, match="annotate every field"):

        class _Unannotated(Record):
            __slots__ = ("a",)

            def __init__(self) -> None:
                init_fields(self, a=1)
