"""A program's careless arguments to `Node`, `NodeOptions` and `Node.embedded()`, and a Node
used out of turn: each is a `BadRequest` (or `NodeAlreadyRunning` / `NodeNotRunning`) that says
what is wrong in one line, raised before anything is created, forked or started.

Before, a wrong type or an out-of-range number reached the owner processes (which crashed at
every restart until the node stopped, or blocked the block's exit), `state_dir=""` served the
current directory (and tightened its mode to 0700), a stopped Node started again (recreating
its removed temporary directory, with owners nobody stopped), and a client made after the stop
answered `ping` for a node that was gone.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from subagents_node.messages.errors import BadRequest, NodeAlreadyRunning, NodeNotRunning
from subagents_node.node.node import Node, NodeOptions
from tests.support.nodes import new_state_dir

CARELESS: list[tuple[dict[str, Any], str]] = [
    ({"state_dir": ""}, "state_dir"),
    ({"state_dir": 5}, "state_dir"),
    ({"mailbox_limit": "x"}, "mailbox_limit"),
    ({"mailbox_limit": -1}, "mailbox_limit"),
    ({"mailbox_limit": None}, "mailbox_limit"),
    ({"max_frame": 2**70}, "max_frame"),
    ({"max_frame": 0}, "max_frame"),
    ({"synchronous": "BOGUS"}, "synchronous"),
    ({"restart_max": -5}, "restart_max"),
    ({"restart_window_s": float("nan")}, "restart_window_s"),
    ({"heartbeat_s": 0}, "heartbeat_s"),
    ({"remote_timeout_s": float("inf")}, "remote_timeout_s"),
    ({"settings": None}, "settings"),
    ({"listen": "tcp://127.0.0.1:7700"}, "listen"),
    ({"ipc": "yes"}, "ipc"),
    ({"name": None}, "name"),
]


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize(("options", "field"), CARELESS, ids=[f for _, f in CARELESS])
def test_a_careless_option_is_a_one_line_bad_request_naming_it_and_changes_nothing(
    options: dict[str, Any], field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "cwd"
    work.mkdir(mode=0o755)
    monkeypatch.chdir(work)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    with pytest.raises(BadRequest) as refused, Node.embedded(**options):
        pytest.fail("the block ran")
    assert refused.value.details["field"] == field
    assert refused.value.details["reason"] == "argument"
    assert field in refused.value.message and "\n" not in refused.value.message
    with pytest.raises(BadRequest):
        Node(NodeOptions(**options))
    assert _entries(work) == [] and _entries(temporary) == []  # nothing created
    assert stat.S_IMODE(work.stat().st_mode) == 0o755


def test_an_unknown_embedded_option_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="bogus") as refused, Node.embedded(bogus=1):
        pytest.fail("the block ran")
    assert refused.value.details["reason"] == "argument"


def test_a_node_starts_once_and_a_client_of_a_stopped_node_is_refused() -> None:
    state_dir = new_state_dir()
    try:
        with Node.embedded(state_dir=state_dir) as node:
            with pytest.raises(NodeAlreadyRunning, match="starts once"):
                node.start()  # at once: it used to wait for its own claim, then refuse
            with pytest.raises(BadRequest) as refused:
                node.client("bogus")
            assert refused.value.details["field"] == "transport"
        with pytest.raises(NodeNotRunning):
            node.client().ping()
        with pytest.raises(NodeAlreadyRunning, match="starts once"):
            node.start()
        node.stop()  # a second stop is harmless
        assert not (state_dir / "node.pid").exists()
        assert not any(p.suffix == ".sock" for p in state_dir.iterdir())
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def test_a_temporary_embedded_node_stopped_stays_stopped_and_its_directory_gone() -> None:
    with Node.embedded() as node:
        directory = node.state_dir
    with pytest.raises(NodeAlreadyRunning):
        node.start()
    assert not directory.exists()
    assert os.path.basename(directory).startswith("subagents-")
