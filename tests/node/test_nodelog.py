"""The node's log records (runtime/node/nodelog.py): one inert line each, a traceback after its
record kept as Python wrote it (the request-borne case is in test_gateway_bad_frames.py)."""

from __future__ import annotations

import io
import logging

from subagents_node.node.nodelog import LOG_FORMAT, InertFormatter


def test_a_record_is_one_inert_line_and_its_traceback_keeps_its_lines() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(InertFormatter(LOG_FORMAT))
    logger = logging.getLogger("tests.nodelog")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("refused %s", "name\x1b[2J\nFORGED line")
    finally:
        logger.removeHandler(handler)

    first, *rest = out.getvalue().splitlines()
    assert first.endswith(r"tests.nodelog: refused name\x1b[2J\nFORGED line")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"
    assert not any(line.startswith("FORGED") for line in rest)
