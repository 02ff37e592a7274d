"""RepeatedWarnings (actors/loglimit.py): what a peer makes a loop warn about at will is logged
once a second per kind and peer, and the count of what was held back is never lost."""

from __future__ import annotations

import logging

import pytest

from subagents_node.actors.loglimit import RepeatedWarnings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def warned(caplog: pytest.LogCaptureFixture) -> tuple[RepeatedWarnings, Clock, list[str]]:
    clock = Clock()
    caplog.set_level(logging.WARNING, logger="loglimit-test")
    lines: list[str] = []
    logger = logging.getLogger("loglimit-test")

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger.addHandler(Keep())
    return RepeatedWarnings(logger, 1.0, clock), clock, lines


def test_a_flood_from_one_peer_is_one_line_then_one_count(
    warned: tuple[RepeatedWarnings, Clock, list[str]],
) -> None:
    warnings, clock, lines = warned
    for n in range(500):
        warnings.warn("refused frames", b"peer-a", f"refused a frame #{n}")
    assert lines == ["refused a frame #0"]
    assert warnings.next_deadline() == pytest.approx(1.0)
    clock.now += 0.5
    warnings.flush_due()
    assert len(lines) == 1  # the window has not ended
    clock.now += 0.5
    warnings.flush_due()
    assert lines[1].startswith("499 more like it (refused frames, from the same peer)")
    assert lines[1].endswith("the last: refused a frame #499")
    assert warnings.next_deadline() is None  # nothing held: the loop may wait for good


def test_another_peer_and_another_kind_are_logged_as_they_come(
    warned: tuple[RepeatedWarnings, Clock, list[str]],
) -> None:
    warnings, _, lines = warned
    warnings.warn("refused frames", b"a", "from a")
    warnings.warn("refused frames", b"a", "from a again")
    warnings.warn("refused frames", b"b", "from b")
    warnings.warn("dropped replies", b"a", "a reply to a")
    assert lines == ["from a", "from b", "a reply to a"]


def test_a_new_window_counts_the_last_one_first(
    warned: tuple[RepeatedWarnings, Clock, list[str]],
) -> None:
    warnings, clock, lines = warned
    warnings.warn("k", b"p", "one")
    warnings.warn("k", b"p", "two")
    clock.now += 2.0
    warnings.warn("k", b"p", "three")  # before any flush: the count comes first, then it
    assert lines[0] == "one"
    assert lines[1].startswith("1 more like it") and lines[2] == "three"
