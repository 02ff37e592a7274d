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

import psutil
import pytest

from subagents_node.launch.config import Settings, load_config
from subagents_node.messages.errors import (
    BadAddress,
    BadRequest,
    NodeAlreadyRunning,
    NodeNotRunning,
)
from subagents_node.node.node import Node
from subagents_node.node.options import NodeOptions
from tests.support.nodes import new_state_dir
from tests.support.runs import wait_until

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
    ({"child_open_files": 0}, "child_open_files"),
    ({"child_open_files": "1024"}, "child_open_files"),
    ({"settings": None}, "settings"),
    ({"listen": "tcp://127.0.0.1:7700"}, "listen"),
    ({"ipc": "yes"}, "ipc"),
    ({"name": None}, "name"),
    # The settings each owner reads: a value outside the config key's domain (runtime/launch/
    # config.py `Settings`), a test-only key's, an unknown key, or one the node sets itself.
    ({"settings": {"reservation_ttl_s": -1}}, "settings.reservation_ttl_s"),  # freed at once
    ({"settings": {"reservation_ttl_s": "abc"}}, "settings.reservation_ttl_s"),  # float("abc")
    ({"settings": {"reservation_ttl_s": float("nan")}}, "settings.reservation_ttl_s"),
    ({"settings": {"reservation_ttl_s": 1e300}}, "settings.reservation_ttl_s"),
    ({"settings": {"reservation_ttl_s": [60]}}, "settings.reservation_ttl_s"),
    ({"settings": {"reservation_ttl_s": True}}, "settings.reservation_ttl_s"),
    ({"settings": {"run_retention_days": "x"}}, "settings.run_retention_days"),
    ({"settings": {"run_retention_days": True}}, "settings.run_retention_days"),
    ({"settings": {"max_watchers": 0}}, "settings.max_watchers"),
    ({"settings": {"child_log_max_bytes": -5}}, "settings.child_log_max_bytes"),
    ({"settings": {"containment": "bogus"}}, "settings.containment"),
    ({"settings": {"grant_authority": "sometimes"}}, "settings.grant_authority"),
    ({"settings": {"owner_call_timeout_s": "x"}}, "settings.owner_call_timeout_s"),
    ({"settings": {"owner_call_timeout_s": float("inf")}}, "settings.owner_call_timeout_s"),
    ({"settings": {"host_call_timeout_s": "1s"}}, "settings.host_call_timeout_s"),
    ({"settings": {"host_call_timeout_s": 0}}, "settings.host_call_timeout_s"),
    ({"settings": {"fault_points": "mark_started"}}, "settings.fault_points"),  # not a list
    ({"settings": {"reservaton_ttl_s": 5.0}}, "settings.reservaton_ttl_s"),  # a typo
    ({"settings": {"node_pid": 1}}, "settings.node_pid"),  # the node's: owners exited at start
    ({"settings": {"child_open_files": 8}}, "settings.child_open_files"),  # the node's too
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
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(BadRequest) as refused, Node.embedded(**options):
        pytest.fail("the block ran")
    assert refused.value.details["field"] == field
    assert refused.value.details["reason"] == "argument"
    assert field in refused.value.message and "\n" not in refused.value.message
    with pytest.raises(BadRequest):
        Node(NodeOptions(**options))
    assert _entries(work) == [] and _entries(temporary) == []  # nothing created
    assert stat.S_IMODE(work.stat().st_mode) == 0o755
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children  # no fork


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:0", "tcp://127.0.0.1:99999", "tcp://10.0.0.1:7700"]
)
def test_a_listen_endpoint_the_node_cannot_use_is_refused_before_its_state_dir_is_made(
    endpoint: str, tmp_path: Path
) -> None:
    """A bad `listen` (port 0, out of range, beyond loopback without `home`) was refused with
    `BadAddress` only after `start()` had made the named state dir: an empty directory was
    left behind, where nothing is created for a bad option."""
    state_dir = tmp_path / "state"
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(BadAddress) as refused, Node.embedded(state_dir, listen=[endpoint]):
        pytest.fail("the block ran")
    assert refused.value.details["address"] == endpoint
    assert not state_dir.exists(), "the state dir was made for a node that never started"
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children  # no fork


def test_a_mistyped_setting_is_refused_with_the_name_it_resembles_and_the_known_ones() -> None:
    with pytest.raises(BadRequest) as refused:
        Node(NodeOptions(settings={"reservaton_ttl_s": 5.0}))
    message = refused.value.message
    assert "did you mean 'reservation_ttl_s'" in message
    assert all(key in message for key in ("max_watchers", "containment", "fault_points"))


def test_the_settings_start_passes_are_accepted_and_a_short_reservation_ttl_takes_effect(
    tmp_path: Path,
) -> None:
    """What `subagents-node start` hands a node (every config key, in JSON form, and a kill
    point) passes the check; the TTL set by a program is the one the capacity owner applies."""
    config = load_config(env={"XDG_CONFIG_HOME": str(tmp_path)}, cwd=tmp_path)
    settings = {**config.actor_settings(), "fault_kill_points": [], "reservation_ttl_s": 0.3}
    with Node.embedded(state_dir=new_state_dir(), settings=settings) as node:
        client = node.client()
        assert client.capacity.acquire(session_id="s", limit=1, run_id="a") is not None
        owner = client.capacity.inspect("a").owner
        assert owner is not None and owner.expires_at is not None
        assert owner.expires_at - owner.reserved_at == pytest.approx(0.3)
        wait_until(lambda: client.capacity.snapshot("s", 1).used == 0, what="the slot expired")


@pytest.mark.parametrize("ttl", [0, -1, 86_401])
def test_a_programs_reservation_ttl_is_checked_against_the_models_domain_above_0(
    ttl: float,
) -> None:
    """The model said "at least 1 s" (a configuration's floor), and the node's check made a
    special case to let a program's 0.3 through: its refusal still read "must be a number
    from 1 to 86400, not 0" while 0.3 was taken. The model's domain is above 0 (at most a
    day); the floor is the configuration loader's (tests/launch/test_config.py)."""
    with pytest.raises(BadRequest) as refused:
        Node(NodeOptions(settings={"reservation_ttl_s": ttl}))
    assert refused.value.message == (
        f"NodeOptions.settings.reservation_ttl_s must be a number above 0, at most 86400, not {ttl}"
    )
    assert Settings(reservation_ttl_s=0.3).reservation_ttl_s == 0.3


def test_a_setting_that_reaches_the_owners_unchecked_is_served_as_its_default_not_a_crash() -> None:
    """A program that changes `options.settings` after the check (or any other path around it)
    still cannot crash an owner: the node drops the value as it hands the settings to its owners
    (each serves the default), and says so in its log.
    Before, `run_retention_days="x"` failed the fanout and runs owners at every start and
    `reservation_ttl_s="abc"` failed every acquire."""
    state_dir = new_state_dir()
    node = Node(NodeOptions(state_dir=state_dir))
    node.options.settings.update(
        reservation_ttl_s="abc", run_retention_days="x", max_watchers=[1], node_pid="me"
    )
    node.start()
    try:
        client = node.client()
        assert client.capacity.acquire(session_id="s", limit=1, run_id="a") is not None
        owner = client.capacity.inspect("a").owner
        assert owner is not None and owner.expires_at is not None
        assert owner.expires_at - owner.reserved_at == pytest.approx(60.0)  # the default
        assert client.runs.list() == []
    finally:
        node.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


def test_an_unknown_embedded_option_is_a_bad_request_naming_it() -> None:
    """api.md: an unknown option name is a BadRequest whose `details["field"]` names it, as
    for any option; it used to carry no field (the message was TypeError's text)."""
    with pytest.raises(BadRequest, match="bogus") as refused, Node.embedded(bogus=1):
        pytest.fail("the block ran")
    assert refused.value.details["reason"] == "argument"
    assert refused.value.details["field"] == "bogus"
    assert "mailbox_limit" in refused.value.message  # the known ones are listed


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
