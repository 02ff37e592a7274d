"""A bad argument to the client is a one-line BadRequest naming it, before anything is sent:
never pydantic's ValidationError, msgpack's OverflowError, float's ValueError or an
AttributeError from deep inside, and never a request that means something else (a string
read as one path per character). Sync and asyncio clients alike (they share the plans).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from subagents_node import AsyncClient, ChainStep, LaunchContext, TaskItem
from subagents_node.client.client import Client, connect
from subagents_node.launch.agents import discover_agents
from subagents_node.messages.codec import encode_request
from subagents_node.messages.envelope import Envelope
from subagents_node.messages.errors import AgentInvalid, BadRequest, ConfigError, RunCwdMissing
from subagents_node.messages.fanout import encode_descriptor
from subagents_node.messages.node import Ping, Pong
from tests.support.nodes import REPO, NodeProcess, running_node

AGENTS = REPO / "examples" / "agents"
NAN = float("nan")
INF = float("inf")


#: No node is ever there: each argument is refused before anything looks for one.
NOWHERE = "ipc:///tmp/no-node-here/node.sock"


@pytest.fixture(scope="module")
def fanout_node() -> Iterator[NodeProcess]:
    with running_node() as node:
        yield node


@pytest.fixture
def client() -> Iterator[Client]:
    with connect(NOWHERE) as client:
        yield client


def _refused(call: Callable[[], Any], field: str) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        call()
    assert info.value.details.get("field") == field, info.value.details
    assert "\n" not in info.value.message
    return info.value


@pytest.mark.parametrize("timeout", [NAN, INF, -1.0], ids=["nan", "inf", "negative"])
def test_a_timeout_that_is_nan_infinite_or_negative_is_refused_naming_it(
    timeout: float, client: Client
) -> None:
    _refused(lambda: connect(NOWHERE, timeout=timeout), "timeout")
    _refused(lambda: client.ping(timeout=timeout), "timeout")

    async def from_a_loop() -> None:
        with pytest.raises(BadRequest):
            AsyncClient(NOWHERE, timeout=timeout)
        async with AsyncClient(NOWHERE) as aclient:
            with pytest.raises(BadRequest) as info:
                await aclient.ping(timeout=timeout)
            assert info.value.details["field"] == "timeout"

    asyncio.run(from_a_loop())


@pytest.mark.parametrize("timeout", [NAN, -1.0], ids=["nan", "negative"])
def test_a_run_wait_with_a_nan_or_negative_timeout_is_refused_not_followed_forever(
    timeout: float, client: Client
) -> None:
    _refused(lambda: client.runs.wait("abc123", timeout=timeout), "timeout")
    _refused(lambda: client.runs.settle(["abc123"], timeout=timeout), "timeout")


def test_a_capacity_handle_rebuilt_from_garbage_is_refused_in_one_line(client: Client) -> None:
    for garbage in ("garbage", None, {"slot": 1}):
        _refused(lambda garbage=garbage: client.capacity.handle(garbage), "handle")
    aclient = AsyncClient(NOWHERE)  # opens nothing until its first request
    _refused(lambda: aclient.capacity.handle("garbage"), "handle")  # type: ignore[arg-type]


@pytest.mark.parametrize("launch", [None, {"agent": "echo", "task": "hi"}], ids=["none", "dict"])
def test_runs_launch_refuses_anything_but_a_launch_request(launch: Any, client: Client) -> None:
    _refused(lambda: client.runs.launch(launch), "launch")

    async def from_a_loop() -> None:
        async with AsyncClient(NOWHERE) as aclient:
            with pytest.raises(BadRequest):
                await aclient.runs.launch(launch)

    asyncio.run(from_a_loop())


def test_a_single_string_as_paths_is_refused_not_claimed_one_character_at_a_time(
    fanout_node: NodeProcess,
) -> None:
    client = fanout_node.client()
    budget = client.fanout.create(root_run_id="one-string", limit=64)
    message = _refused(lambda: client.fanout.claim(budget, "tasks[0]"), "paths").message
    assert "['tasks[0]']" in message
    _refused(lambda: client.fanout.reserve(budget, "tasks[0]", ttl_s=30), "paths")

    async def from_a_loop() -> None:
        async with AsyncClient(fanout_node.address) as aclient:
            for call in (
                aclient.fanout.claim(budget, "tasks[0]"),
                aclient.fanout.reserve(budget, "tasks[0]", ttl_s=30),
            ):
                with pytest.raises(BadRequest):
                    await call

    asyncio.run(from_a_loop())
    assert client.fanout.snapshot(budget).used == 0  # nothing was claimed


@pytest.mark.parametrize("limit", [2**64, 2**63, -(2**64)])
def test_an_integer_no_wire_can_carry_is_refused_naming_its_field(
    limit: int, client: Client
) -> None:
    _refused(lambda: client.fanout.create(root_run_id="x", limit=limit), "limit")


def test_a_frame_with_an_integer_past_64_bits_is_refused_naming_where_it_is() -> None:
    # What a request that escaped its schema would carry: the seam says where, not msgpack.
    env = Envelope(type="fanout.create", body={"root_run_id": "x", "limit": [1, {"n": 2**70}]})
    _refused(lambda: encode_request(env), "limit.1.n")


@pytest.mark.parametrize(
    "paths", [None, 5, {"tasks[0]": 1}, Path("tasks[0]")], ids=["none", "int", "dict", "path"]
)
def test_paths_that_are_no_list_are_refused_naming_them_and_nothing_is_claimed(
    paths: Any, fanout_node: NodeProcess
) -> None:
    client = fanout_node.client()
    budget = client.fanout.create(root_run_id=f"no-list-{type(paths).__name__}", limit=8)
    _refused(lambda: client.fanout.claim(budget, paths), "paths")
    _refused(lambda: client.fanout.reserve(budget, paths, ttl_s=30), "paths")
    assert client.fanout.snapshot(budget).used == 0


def test_one_run_id_descriptor_or_step_where_a_list_is_expected_is_refused_naming_it(
    fanout_node: NodeProcess,
) -> None:
    """`settle(run_id)` waited for one 'run' per character (each a prefix that may match
    another run), `snapshots(budget)` read the model's fields, `attach(run_id, step)` failed
    deep in pydantic, and None anywhere was a TypeError."""
    client = fanout_node.client()
    budget = client.fanout.create(root_run_id="one-thing", limit=8)
    message = _refused(lambda: client.runs.settle("abc123", timeout=1), "run_ids").message
    assert "['abc123']" in message
    _refused(lambda: client.runs.settle(None, timeout=1), "run_ids")  # type: ignore[arg-type]
    _refused(lambda: client.fanout.snapshots(budget), "descriptors")  # type: ignore[arg-type]
    _refused(lambda: client.fanout.snapshots(encode_descriptor(budget)), "descriptors")
    _refused(lambda: client.fanout.snapshots(None), "descriptors")  # type: ignore[arg-type]
    step = ChainStep(kind="checkpoint")
    _refused(lambda: client.runs.attach("abc123", step), "steps")  # type: ignore[arg-type]
    _refused(lambda: client.runs.attach("abc123", None), "steps")  # type: ignore[arg-type]

    async def from_a_loop() -> None:
        async with AsyncClient(fanout_node.address) as aclient:
            with pytest.raises(BadRequest) as info:
                await aclient.fanout.snapshots(budget)  # type: ignore[arg-type]
            assert info.value.details["field"] == "descriptors"
            with pytest.raises(BadRequest) as info:
                await aclient.runs.attach("abc123", "steps")  # type: ignore[arg-type]
            assert info.value.details["field"] == "steps"

    asyncio.run(from_a_loop())


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"agents_dirs": "examples/agents"}, "agents_dirs"),
        ({"agents_dirs": Path("examples/agents")}, "agents_dirs"),
        ({"agents_dirs": None}, "agents_dirs"),
        ({"cwd": 5}, "cwd"),
        ({"env": ["A=1"]}, "env"),
        ({"session_id": 5}, "session_id"),
        ({"overrides": ["timeout_ms"]}, "overrides"),
    ],
    ids=["dirs-str", "dirs-path", "dirs-none", "cwd-int", "env-list", "session-int", "overrides"],
)
def test_a_launch_context_argument_of_the_wrong_type_is_refused_naming_it(
    arguments: dict[str, Any], field: str
) -> None:
    """A directory string as `agents_dirs` was read one character at a time ("Invalid agent
    file s"); the others failed with an AttributeError or ValueError from deep inside."""
    _refused(lambda: LaunchContext.from_environment(**arguments), field)


def test_a_launch_context_takes_its_cwd_as_a_string_and_refuses_items_that_are_no_list() -> None:
    ctx = LaunchContext.from_environment(cwd=str(REPO), agents_dirs=[AGENTS])  # not Path only
    assert ctx.cwd == REPO.resolve()
    item = TaskItem(agent=ctx.plan("sleeper"), task="seconds=0")
    assert ctx.launch("parallel", background=True, items=[item]).items == [item]
    _refused(lambda: ctx.launch("parallel", background=True, items=None), "items")  # type: ignore[arg-type]
    _refused(lambda: ctx.launch("parallel", background=True, items=item), "items")  # type: ignore[arg-type]
    step = ChainStep(items=[item])
    _refused(lambda: ctx.launch("chain", background=True, chain=step), "chain")  # type: ignore[arg-type]


async def _declines(preview: object) -> bool:
    return False


class _AsyncCallable:
    async def __call__(self, preview: object) -> bool:
        return False


@pytest.mark.parametrize(
    "confirm",
    [_declines, functools.partial(_declines), _AsyncCallable(), lambda preview: "n"],
    ids=["async-def", "async-partial", "async-call", "string"],
)
def test_r_spn_6_a_confirm_that_is_async_or_answers_no_bool_is_refused_and_grants_nothing(
    confirm: Any, fanout_node: NodeProcess
) -> None:
    """Its coroutine (or a string such as "n" from input()) is true: the grant used to be
    applied without anyone being asked."""
    client = fanout_node.client()
    session = f"s-confirm-{uuid.uuid4().hex[:8]}"
    client.session.open(session, configured_limit=2)
    client.session.reserve(session, requested=2)
    _refused(lambda: client.session.grant(session, 2, confirm=confirm), "confirm")

    async def from_a_loop() -> None:
        async with AsyncClient(fanout_node.address) as aclient:
            with pytest.raises(BadRequest) as info:
                await aclient.session.grant(session, 2, confirm=confirm)
            assert info.value.details["field"] == "confirm"

    asyncio.run(from_a_loop())
    assert client.session.snapshot(session).limit == 2  # nothing was granted
    granted = client.session.grant(session, 2, confirm=lambda preview: True)
    assert granted.outcome == "granted" and client.session.snapshot(session).limit == 4


@pytest.mark.parametrize("callback", [_declines, 5], ids=["async-def", "not-callable"])
def test_a_wait_callback_that_is_async_or_no_function_is_refused_before_the_wait(
    callback: Any, client: Client
) -> None:
    """An async `on_event` was called and never awaited: every event was lost, silently."""
    _refused(lambda: client.runs.wait("abc123", on_event=callback), "on_event")
    _refused(lambda: client.runs.wait("abc123", on_gap=callback), "on_gap")
    _refused(lambda: client.runs.settle(["abc123"], on_end=callback), "on_end")

    async def from_a_loop() -> None:
        aclient = AsyncClient(NOWHERE)  # refused before it looks for a node
        with pytest.raises(BadRequest) as info:
            await aclient.runs.wait("abc123", on_event=callback)
        assert info.value.details["field"] == "on_event"

    asyncio.run(from_a_loop())


@pytest.mark.parametrize(
    ("cwd", "why"),
    [
        ("/tmp/\0", "it holds a NUL byte"),
        ("/tmp/" + "a" * 300, "File name too long"),
        ("/tmp/" + "a/" * 2100, "File name too long"),
    ],
    ids=["nul", "long-component", "long-path"],
)
def test_a_launch_context_cwd_no_directory_can_have_is_refused_naming_it(
    cwd: str, why: str
) -> None:
    """`Path(cwd).resolve()` raised ValueError (embedded null byte) and the look for the
    project's subagents.toml OSError (ENAMETOOLONG): a traceback, from the CLI, the MCP
    server's `run` tool and the Python API alike."""
    refused = _refused(lambda: LaunchContext.from_environment(cwd=cwd), "cwd")
    assert isinstance(refused, RunCwdMissing)
    assert refused.message.startswith(f"working directory is not usable: {why}: /tmp/")
    assert len(refused.message) < 240, "the path is shown shortened"


def test_a_launch_context_cwd_in_a_symlink_loop_is_refused_naming_it(tmp_path: Path) -> None:
    """pathlib's resolve() raised RuntimeError ("Symlink loop from ...")."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    refused = _refused(lambda: LaunchContext.from_environment(cwd=tmp_path / "a"), "cwd")
    assert "a symbolic link loop" in refused.message


def test_a_launch_context_cwd_that_is_a_file_is_refused_as_no_directory(tmp_path: Path) -> None:
    """A file given as the working directory (an MCP `run` with `cwd` naming one, `run --cwd
    FILE`) was refused as `cannot read FILE/subagents.toml: Not a directory`, a config error
    about a config file nobody named."""
    afile = tmp_path / "notes.txt"
    afile.write_text("")
    refused = _refused(lambda: LaunchContext.from_environment(cwd=afile), "cwd")
    assert isinstance(refused, RunCwdMissing)
    assert refused.message == f"working directory is not a directory: {afile}"


def test_an_agents_dir_or_config_home_the_system_refuses_is_a_typed_error_not_an_oserror(
    tmp_path: Path,
) -> None:
    """`is_dir()` / `is_file()` raise every OSError but a missing file's: an over-long
    --agents-dir or $XDG_CONFIG_HOME was an OSError (ENAMETOOLONG) from deep inside."""
    long_name = str(tmp_path / ("c" * 300))
    with pytest.raises(AgentInvalid) as bad_dir:
        LaunchContext.from_environment(cwd=tmp_path, agents_dirs=[long_name])
    assert bad_dir.value.message.startswith(f"Invalid agents directory {long_name[:100]}")
    assert bad_dir.value.message.endswith(
        "(--agents-dir, SUBAGENTS_AGENT_DIRS or agent_dirs): agents directory is not usable: "
        "File name too long"
    )
    with pytest.raises(ConfigError) as bad_home:
        LaunchContext.from_environment(cwd=tmp_path, env={"XDG_CONFIG_HOME": long_name})
    assert bad_home.value.message.startswith(f"cannot read {long_name[:100]}")
    assert bad_home.value.message.endswith(": File name too long")
    # Only the configuration refuses it: the user's agents dir under it is skipped, not fatal.
    catalog = discover_agents(tmp_path, [AGENTS], {"XDG_CONFIG_HOME": long_name})
    assert "sleeper" in catalog.names()


def test_a_client_made_with_the_largest_timeout_it_accepts_follows_runs(
    fanout_node: NodeProcess,
) -> None:
    """A week (MAX_DURATION_S) is accepted as a client's timeout, but each long poll added its
    wait at the node to it and checked the sum again: watch, wait, settle and a followed log
    were refused with a BadRequest about a `timeout` of 604810 that the caller never passed."""
    week = 7 * 24 * 3600
    ctx = LaunchContext.from_environment(cwd=REPO, agents_dirs=[AGENTS], session_id="s-week")
    client = connect(fanout_node.address, timeout=week)
    try:
        run = client.runs.launch(ctx.single("sleeper", "seconds=0.2", True, None))
        assert client.runs.watch(run.run_id).run.run_id == run.run_id
        assert client.runs.wait(run.run_id, timeout=30).state == "complete"
        assert [view.state for view in client.runs.settle([run.run_id], timeout=30)] == ["complete"]
        list(client.runs.logs(run.run_id, follow=True))  # it ended: the follow ends too
        client.runs.watch_all(wait_s=0)
    finally:
        client.close()

    async def from_a_loop() -> None:
        async with AsyncClient(fanout_node.address, timeout=week) as aclient:
            assert (await aclient.runs.wait(run.run_id, timeout=30)).state == "complete"
            assert (await aclient.runs.watch(run.run_id)).run.state == "complete"

    asyncio.run(from_a_loop())


def test_a_state_dir_that_is_no_path_is_refused_naming_it() -> None:
    """`Path(5)` failed inside with a TypeError ("expected str, bytes or os.PathLike")."""
    _refused(lambda: connect(state_dir=5), "state_dir")  # type: ignore[arg-type]
    _refused(lambda: AsyncClient(state_dir=5), "state_dir")  # type: ignore[arg-type]
    _refused(lambda: connect(state_dir=b"/tmp/x"), "state_dir")  # type: ignore[arg-type]


@pytest.mark.parametrize("credentials", ["x", {"client": "k"}], ids=["str", "dict"])
def test_credentials_that_are_no_client_credentials_are_refused_naming_them(
    credentials: Any,
) -> None:
    """They failed at the first call with an AttributeError (`'str' object has no attribute
    'client'`), the new socket left to the collector."""
    tcp = "tcp://127.0.0.1:1"
    _refused(lambda: connect(tcp, timeout=1, credentials=credentials), "credentials")
    _refused(lambda: AsyncClient(tcp, timeout=1, credentials=credentials), "credentials")


@pytest.mark.parametrize("request_", [None, "node.ping", {"type": "node.ping"}])
def test_ask_with_anything_but_a_request_is_refused_naming_it(
    request_: Any, client: Client
) -> None:
    """`client.ask(None, Pong)` failed with an AttributeError ('NoneType' object has no
    attribute 'target'), in both clients."""
    _refused(lambda: client.ask(request_, Pong), "request")
    _refused(lambda: client.ask(Ping(), None), "result")  # type: ignore[arg-type]

    async def from_a_loop() -> None:
        aclient = AsyncClient(NOWHERE)  # refused before it looks for a node
        for bad, field in ((request_, "request"), (Ping(), "result")):
            with pytest.raises(BadRequest) as info:
                await aclient.ask(bad, Pong if field == "request" else None)  # type: ignore[arg-type]
            assert info.value.details["field"] == field

    asyncio.run(from_a_loop())
