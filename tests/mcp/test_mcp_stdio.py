"""`subagents-node mcp` over raw stdio frames, as a hostile or careless client writes them: a
frame that is not a JSON-RPC message is answered (JSON-RPC 2.0: a parse error or an invalid
request), never dropped, and the server goes on; every request read before stdin's end is
answered before the server exits (a call still running after the grace is cut short as a
signal would, and answered); a signal that ends the server (an agent CLI exits: TERM; its
terminal closes: HUP; Ctrl-C: INT) first stops a foreground run it was following, as the CLI
does, and exits 128 + the signal."""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from subagents_node.client.client import Client, connect
from subagents_node.mcp.frames import MAX_DEPTH, MAX_ID_SHOWN, MAX_LINE_BYTES
from subagents_node.mcp.stdio import EOF_GRACE_S
from subagents_node.messages.supervisor import RunView
from subagents_node.node.claim import StateDirClaim
from tests.support.foreground import watches_inotify
from tests.support.nodes import REPO, NodeProcess, node_files_left
from tests.support.runs import wait_until, wait_view

AGENTS = REPO / "examples" / "agents"
#: Longest the server may take to answer one frame in these tests.
ANSWER_S = 30.0

pytestmark = pytest.mark.processes

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


class RawServer:
    """`python -m subagents_node mcp` with its stdin and stdout as plain pipes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            self.answers.put(json.loads(line))  # the server writes only JSON-RPC frames
        self.answers.put(None)

    def send(self, frame: bytes | dict[str, Any] | list[Any]) -> None:
        raw = frame if isinstance(frame, bytes) else json.dumps(frame).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        got = self.answers.get(timeout=ANSWER_S)
        assert got is not None, "the server closed its output without answering"
        return got

    def initialize(self) -> None:
        self.send(INITIALIZE)
        assert self.answer()["id"] == 0
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


@contextmanager
def raw_server(node: NodeProcess | Path) -> Iterator[RawServer]:
    with server_process(node, subprocess.PIPE) as proc:
        yield RawServer(proc)


@contextmanager
def server_process(
    node: NodeProcess | Path, stdin: int | IO[bytes]
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m subagents_node mcp` on `node` (a state dir: its node, else one embedded in
    the server), reading `stdin`, its stdout a pipe."""
    if isinstance(node, Path):
        env = {**os.environ, "SUBAGENTS_STATE_DIR": str(node)}
        env.pop("SUBAGENTS_NODE", None)
    else:
        env = {**os.environ, "SUBAGENTS_NODE": node.address}
    args = [sys.executable, "-m", "subagents_node", "mcp", "--agents-dir", str(AGENTS)]
    with open(os.devnull, "w") as quiet:
        proc = subprocess.Popen(
            args, stdin=stdin, stdout=subprocess.PIPE, stderr=quiet, env=env, cwd=REPO
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=ANSWER_S)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def test_a_frame_that_is_no_json_rpc_message_is_answered_and_the_server_goes_on(
    node: NodeProcess,
) -> None:
    with raw_server(node) as server:
        server.initialize()
        server.send(b"this is not json")
        parse = server.answer()
        assert parse["id"] is None and parse["error"]["code"] == -32700
        assert parse["error"]["message"].startswith("Parse error")
        server.send(b'{"jsonrpc":"2.0","id":3,"method":"ping","params":{"a":"x}}')
        assert server.answer()["error"]["code"] == -32700  # an unterminated string
        server.send([{"jsonrpc": "2.0", "id": 4, "method": "ping"}])
        batch = server.answer()
        assert batch["id"] is None and batch["error"]["code"] == -32600
        assert "batches are not supported" in batch["error"]["message"]
        server.send(b"42")
        assert server.answer()["error"]["code"] == -32600
        # A request whose id can be read is answered with it, naming what is wrong.
        server.send({"id": 5, "method": "tools/list"})
        wrong = server.answer()
        assert wrong["id"] == 5 and wrong["error"]["code"] == -32600
        assert "jsonrpc" in wrong["error"]["message"]
        server.send({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": [1]})
        listed = server.answer()
        assert listed["id"] == 6 and "params" in listed["error"]["message"]
        server.send(b"   ")  # whitespace is no frame: nothing to answer
        server.send({"jsonrpc": "2.0", "id": 7, "method": "ping"})
        assert server.answer() == {"jsonrpc": "2.0", "id": 7, "result": {}}
    assert node.client().runs.list() == [], "nothing was launched"


def test_a_lone_surrogate_escape_is_read_as_u_fffd_and_a_request_too_deep_is_answered_its_id(
    node: NodeProcess,
) -> None:
    """Both are JSON (RFC 8259 takes them), but the SDK's reader refuses them: a request with
    "\\ud83d" (JSON.stringify's half of a cut emoji) or nested 5,000 deep was answered with a
    parse error and id null, so its caller's id was never answered."""
    with raw_server(node) as server:
        server.initialize()
        for rid, escape in [(1, b"\\ud83d"), (2, b"\\ude00"), (3, b"\\ud83d\\ud83d")]:
            arguments = b'{"agent":"sleeper' + escape + b'","task":"seconds=0"}'
            server.send(
                b'{"jsonrpc":"2.0","id":%d,"method":"tools/call",' % rid
                + b'"params":{"name":"run","arguments":'
                + arguments
                + b"}}"
            )
            answer = server.answer()
            assert answer["id"] == rid, answer
            replaced = "sleeper" + "\ufffd" * escape.count(b"\\u")  # as bad UTF-8 would be
            assert answer["result"]["content"][0]["text"].startswith(f"Unknown agent '{replaced}'")
        # A pair is one character, as ever: nothing to replace.
        server.send(call_frame(4, "run", agent="sleeper\U0001f600", task="seconds=0"))
        assert "sleeper\U0001f600" in server.answer()["result"]["content"][0]["text"]
        deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
        server.send(
            b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"run",'
            + b'"arguments":{"agent":"sleeper","task":"seconds=0","cwd":'
            + deep
            + b"}}}"
        )
        assert server.answer() == {
            "jsonrpc": "2.0",
            "id": 5,
            "error": {
                "code": -32600,
                "message": "Invalid Request: nested 5,003 levels deep; the server reads JSON "
                f"at most {MAX_DEPTH} levels deep",
            },
        }
        for rid, levels in [("at", MAX_DEPTH), ("over", MAX_DEPTH + 1)]:
            nested = "[" * (levels - 2) + "1" + "]" * (levels - 2)  # the request, params: 2 more
            server.send(
                f'{{"jsonrpc":"2.0","id":"{rid}","method":"ping","params":{{"x":{nested}}}}}'.encode()
            )
            answer = server.answer()
            assert answer["id"] == rid
            assert ("error" in answer) == (rid == "over"), answer
        server.send({"jsonrpc": "2.0", "id": 6, "method": "ping"})
        assert server.answer() == {"jsonrpc": "2.0", "id": 6, "result": {}}
    assert node.client().runs.list() == [], "nothing was launched"


def test_a_request_whose_id_is_no_string_or_integer_is_answered_as_invalid_with_a_null_id(
    node: NodeProcess,
) -> None:
    """The SDK reads such a request as a notification (its models ignore the id) and would
    answer nothing; JSON-RPC 2.0 answers an invalid request with -32600 and id null."""
    with raw_server(node) as server:
        server.initialize()
        for rid, shown in [({"a": 1}, '{"a": 1}'), (1.5, "1.5"), (True, "true"), (None, "null")]:
            server.send({"jsonrpc": "2.0", "id": rid, "method": "tools/list"})
            assert server.answer() == {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": -32600,
                    "message": f"Invalid Request: id must be a string or an integer, not {shown}",
                },
            }
        server.send({"jsonrpc": "2.0", "id": ["x" * 200], "method": "ping"})
        shown = json.dumps(["x" * 200])[: MAX_ID_SHOWN - 3] + "..."  # the id shown is bounded
        assert server.answer()["error"]["message"].endswith(f" not {shown}")
        server.send({"jsonrpc": "2.0", "id": "ok", "method": "ping"})
        assert server.answer() == {"jsonrpc": "2.0", "id": "ok", "result": {}}


SLEEPER = {"agent": "sleeper", "task": "seconds=0"}

#: Arguments the tools' input schemas refuse, and the one line each is answered with.
SCHEMA_REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    (
        "run",
        {**SLEEPER, "timeout_ms": True},
        "invalid run argument timeout_ms: expected a number, not true or false",
    ),
    ("run", {"agent": 5, "task": "x"}, "invalid run argument agent: should be a valid string"),
    (
        "run",
        {**SLEEPER, "timeout_ms": 1e308},
        "invalid run argument timeout_ms: should be an integer, and this one is too large",
    ),
    (
        "run",
        {**SLEEPER, "concurrency": 0},
        "invalid run argument concurrency: should be greater than or equal to 1",
    ),
    (
        "run",
        {"tasks": [{**SLEEPER, "session": "other"}]},
        "invalid run argument tasks[0]: takes no key 'session'",
    ),
    (
        "run",
        {"tasks": [1, 2]},
        "invalid run argument tasks[0]: should be an object (and 1 more)",
    ),
    (
        "wait",
        {"run_id": "x", "timeout_s": math.nan},  # was "should be less than or equal to 86400"
        "invalid wait argument timeout_s: should be a finite number",
    ),
    ("append", {"run_id": "x"}, "invalid append argument steps: required, and not given"),
]


def test_an_argument_the_schema_refuses_is_one_line_naming_it_with_the_typed_error(
    node: NodeProcess,
) -> None:
    """The SDK validates arguments before the tool runs: its refusal was a four-line pydantic
    dump ("1 validation error for runArguments ... For further information visit https://...")
    with no structured error, unlike every other refusal of bad input."""
    with raw_server(node) as server:
        server.initialize()
        for rid, (name, arguments, text) in enumerate(SCHEMA_REFUSALS, start=1):
            server.send(call_frame(rid, name, **arguments))
            answer = server.answer()
            assert answer["id"] == rid
            result = answer["result"]
            assert result["isError"] is True
            assert result["content"] == [{"type": "text", "text": text}]
            error = result["structuredContent"]["error"]
            assert error["code"] == "bad_request" and error["message"] == text
            assert error["details"]["reason"] == "schema" and error["details"]["errors"]
    assert node.client().runs.list() == [], "nothing was launched"


def test_before_initialize_a_call_with_a_stray_argument_is_refused_as_every_call_is(
    node: NodeProcess,
) -> None:
    """The check for an argument the tool does not take ran before the SDK's initialize gate:
    `run` with `x: 1` was answered (a tool error naming `x`) while every other call was
    refused as not initialized."""
    with raw_server(node) as server:
        server.send(call_frame(1, "run", **SLEEPER, timeout_ms=True))
        server.send(call_frame(2, "run", x=1))
        server.send(call_frame(3, "status", verbose=1))
        server.send(call_frame(4, "status"))
        answers = [server.answer() for _ in range(4)]
        assert [a["id"] for a in answers] == [1, 2, 3, 4]
        assert all(a.get("error") == answers[0].get("error") for a in answers), answers
        assert answers[0]["error"]["code"] == -32602
        server.initialize()
        server.send(call_frame(5, "run", x=1))  # once initialized, the stray argument is named
        assert server.answer()["result"]["content"][0]["text"].startswith(
            "run takes no argument 'x'"
        )
    assert node.client().runs.list() == [], "nothing was launched"


@contextmanager
def served_from_file(
    node: NodeProcess, path: Path, frames: list[dict[str, Any]]
) -> Iterator[subprocess.Popen[bytes]]:
    """Write `frames` to `path`; the server reading it as its stdin (`mcp < path`)."""
    path.write_text("".join(json.dumps(frame) + "\n" for frame in frames))
    with path.open("rb") as stdin, server_process(node, stdin) as proc:
        yield proc


def call_frame(rid: int | str, name: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def test_a_file_of_requests_on_stdin_is_answered_completely_and_the_server_exits_0(
    node: NodeProcess, tmp_path: Path
) -> None:
    """The end of the input ends the server only once every request read before it was
    answered: none is cut short (`Connection closed`) nor dropped."""
    frames = [
        INITIALIZE,
        INITIALIZED,
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        call_frame(9, "status"),
        call_frame("agents", "agents"),
        call_frame(5, "run", agent="sleeper", task="seconds=0.5"),
        {"jsonrpc": "2.0", "id": 4, "method": "ping"},
    ]
    with served_from_file(node, tmp_path / "requests.jsonl", frames) as proc:
        out, _ = proc.communicate(timeout=ANSWER_S)
        assert proc.returncode == 0
    answers = [json.loads(line) for line in out.splitlines()]
    assert Counter(a["id"] for a in answers) == Counter([0, 2, 9, "agents", 5, 4])
    assert all("error" not in a for a in answers), answers
    run = next(a for a in answers if a["id"] == 5)
    assert run["result"]["structuredContent"]["state"] == "complete"


def test_a_foreground_run_still_running_a_grace_after_the_end_of_input_is_stopped_and_answered(
    node: NodeProcess, tmp_path: Path
) -> None:
    """The server waits EOF_GRACE_S for the call, then cancels it as a signal would: its run
    is stopped (never left running unowned) and the call is answered with an error."""
    frames = [INITIALIZE, INITIALIZED, call_frame(1, "run", agent="sleeper", task="seconds=300")]
    started = time.monotonic()
    with served_from_file(node, tmp_path / "requests.jsonl", frames) as proc:
        run = first_running_run(node)
        out, _ = proc.communicate(timeout=EOF_GRACE_S + ANSWER_S)
        assert proc.returncode == 0
    assert time.monotonic() - started >= EOF_GRACE_S, "the call was cut short before its grace"
    answers = [json.loads(line) for line in out.splitlines()]
    assert [a["id"] for a in answers] == [0, 1]
    assert answers[1]["error"] == {"code": -32000, "message": "Connection closed"}
    assert node.client().runs.wait(run.run_id, timeout=ANSWER_S).state == "stopped"


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


def test_an_over_long_line_is_answered_dropped_without_being_held_and_the_server_goes_on(
    node: NodeProcess,
) -> None:
    with raw_server(node) as server:
        server.initialize()
        assert server.proc.stdin is not None
        before = peak_rss(server.proc.pid)
        chunk = b"x" * (1 << 20)
        for _ in range(200):  # 200 MiB of one line, no newline yet
            server.proc.stdin.write(chunk)
        server.send(b"")  # its newline
        too_long = server.answer()
        # The line was read and dropped as it came: the server never held it.
        assert peak_rss(server.proc.pid) - before < 64 << 20
        assert too_long["id"] is None and too_long["error"]["code"] == -32600
        assert too_long["error"]["message"] == (
            f"Invalid Request: a line of {200 << 20:,} bytes is over the "
            f"{MAX_LINE_BYTES:,}-byte limit of one message; it was dropped"
        )
        # A whole over-long line and a request in one write: the request is still answered.
        server.send(
            b'{"a": "'
            + b"y" * (MAX_LINE_BYTES + 1)
            + b'"}\n{"jsonrpc":"2.0","id":8,"method":"ping"}'
        )
        assert f"a line of {MAX_LINE_BYTES + 10:,} bytes" in server.answer()["error"]["message"]
        assert server.answer() == {"jsonrpc": "2.0", "id": 8, "result": {}}
        # A line of exactly the limit is read as a message (here: not a request, so -32600).
        server.send(b'"' + b"z" * (MAX_LINE_BYTES - 2) + b'"')
        assert server.answer()["error"]["message"] == "Invalid Request: a message is a JSON object"
        server.send({"jsonrpc": "2.0", "id": 9, "method": "ping"})
        assert server.answer() == {"jsonrpc": "2.0", "id": 9, "result": {}}


def first_run(node: NodeProcess | Client) -> str:
    """The id of the first run the node starts (followed through the node's events)."""
    client = node if isinstance(node, Client) else node.client()
    deadline = time.monotonic() + ANSWER_S
    seq = 0
    while time.monotonic() < deadline:
        batch = client.runs.watch_all(seq, wait_s=5.0)
        if batch.runs:
            return batch.runs[0].run_id
        seq = batch.last_seq
    raise AssertionError("no run started")


def first_running_run(node: NodeProcess | Client) -> RunView:
    """The first run the node starts, once its child runs."""
    client = node if isinstance(node, Client) else node.client()
    return wait_view(client, first_run(client), lambda v: bool(v.children and v.children[0].pid))


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["TERM", "HUP", "INT"]
)
def test_a_signal_that_ends_the_server_stops_its_foreground_run_first(
    node: NodeProcess, signum: signal.Signals
) -> None:
    """An agent CLI that exits sends its MCP servers TERM: the foreground run the server was
    following must not go on unowned, as the CLI stops its own foreground run."""
    with raw_server(node) as server:
        server.initialize()
        long = {"name": "run", "arguments": {"agent": "sleeper", "task": "seconds=60"}}
        server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": long})
        run = first_running_run(node)
        server.proc.send_signal(signum)
        assert server.proc.wait(timeout=ANSWER_S) == 128 + signum
    final = node.client().runs.wait(run.run_id, timeout=ANSWER_S)
    assert final.state == "stopped"


def test_a_client_that_stops_reading_stdout_ends_the_server_as_sigpipe_without_a_traceback(
    node: NodeProcess, tmp_path: Path
) -> None:
    """A client that closes its end of the server's stdout (it died, or gave up) while a
    foreground run is followed: the SDK's writer failed with EPIPE at the next answer, the
    error reached stderr as an 80-line traceback and the server exited 1. It now ends as a Unix
    tool whose reader went away (141), quietly, its foreground run stopped."""
    env = {**os.environ, "SUBAGENTS_NODE": node.address}
    args = [sys.executable, "-m", "subagents_node", "mcp", "--agents-dir", str(AGENTS)]
    errors = tmp_path / "stderr.txt"
    with open(errors, "wb") as stderr:
        proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=REPO
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 0
        long = call_frame(1, "run", agent="sleeper", task="seconds=60")
        for frame in (INITIALIZED, long):
            proc.stdin.write(json.dumps(frame).encode() + b"\n")
        proc.stdin.flush()
        run = first_running_run(node)
        proc.stdout.close()  # the client reads no more
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode())
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert proc.wait(timeout=ANSWER_S) == 128 + signal.SIGPIPE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=ANSWER_S)
        proc.stdin.close()
    assert "Traceback" not in errors.read_text(), errors.read_text()
    assert node.client().runs.wait(run.run_id, timeout=ANSWER_S).state == "stopped"


def test_a_foreground_run_whose_node_is_killed_is_followed_on_the_next_node_to_its_end(
    node: NodeProcess, start_node: Callable[..., NodeProcess]
) -> None:
    """kill -9 of the (detached) node while a foreground `run` call follows its run: the call
    ended at once with "no node is running", naming no run, while the run went on under its
    shims, its output and id lost to the model. The call now waits for the state dir's next
    node, as a foreground `subagents-node run` follows on, and answers with the run's end."""
    with raw_server(node) as server:
        server.initialize()
        server.send(call_frame(1, "run", agent="sleeper", task="seconds=2"))
        run = first_running_run(node)
        node.kill()
        wait_until(  # the call waits for the next node (or, as it did, answered at once)
            lambda: watches_inotify(server.proc.pid) or not server.answers.empty(),
            timeout=ANSWER_S,
            what="the server to learn its node is gone",
        )
        start_node(state_dir=node.state_dir)
        answer = server.answer()
    assert answer["id"] == 1 and not answer["result"]["isError"], answer
    data = answer["result"]["structuredContent"]
    assert (data["run_id"], data["state"], data["output"]) == (run.run_id, "complete", "slept 2")


def test_a_second_signal_while_the_server_ends_never_leaves_its_embedded_node_behind(
    state_dir: Path,
) -> None:
    """TERM, as an agent CLI that exits sends, then TERM again once the server answered the
    call it cut short: the second came while the server stopped its embedded node, where the
    signal was back at its default (anyio's receiver, once left, puts it there), and killed
    the server with the node's socket and pid file left behind. Until it has ended, every
    signal now only counts."""
    with raw_server(state_dir) as server:
        server.initialize()  # answered once the embedded node serves
        long = {"name": "run", "arguments": {"agent": "sleeper", "task": "seconds=60"}}
        server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": long})
        with connect(state_dir=state_dir, timeout=ANSWER_S) as client:
            first_running_run(client)
        server.proc.send_signal(signal.SIGTERM)
        cut_short = server.answer()
        assert cut_short["id"] == 1 and "error" in cut_short, cut_short
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=ANSWER_S) == 128 + signal.SIGTERM
    assert node_files_left(state_dir) == []


def test_a_signal_while_the_server_embeds_its_node_ends_it_once_the_node_serves(
    state_dir: Path,
) -> None:
    """TERM as soon as the embedded node's socket is there, before the server serves: it was
    at its default, and killed the server half started (the node's socket and pid file left
    behind). Now the server starts, finds the signal written down, ends and stops its node."""
    with raw_server(state_dir) as server:
        wait_until(lambda: (state_dir / "node.sock").exists(), ANSWER_S, "the embedded node")
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=ANSWER_S) == 128 + signal.SIGTERM
    assert node_files_left(state_dir) == []


def test_a_foreground_run_cancelled_while_its_launch_is_on_its_way_is_stopped(
    node: NodeProcess,
) -> None:
    """notifications/cancelled right behind the call: it reaches the server while the launch is
    still being admitted; the run the launch started must be stopped, not left unowned."""
    with raw_server(node) as server:
        server.initialize()
        long = {"name": "run", "arguments": {"agent": "sleeper", "task": "seconds=60"}}
        cancel = {"requestId": 1, "reason": "the user pressed Esc"}
        server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": long})
        server.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
        server.send({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert server.answer()["id"] == 2  # the cancelled call itself is never answered
        final = node.client().runs.wait(first_run(node), timeout=ANSWER_S)
        assert final.state == "stopped"


def test_a_server_whose_embedded_node_loses_the_state_dir_uses_the_node_that_won_it(
    state_dir: Path, start_node: Callable[..., NodeProcess]
) -> None:
    """Servers an agent CLI starts at once on a state dir with no node each try to embed one;
    the kernel lets one claim the dir. The others exited 1 at once ("another node is starting
    or stopping for …; retry in a moment"), leaving that session without tools. A server that
    loses the race now waits for the winner to serve and uses it, as a launching command does.
    The test holds the state dir's claim itself (a node starting), then starts a node."""
    claim = StateDirClaim(state_dir)
    claim.take()
    with server_process(state_dir, subprocess.PIPE) as proc:
        try:
            wait_until(
                lambda: proc.poll() is not None or watches_inotify(proc.pid),
                timeout=ANSWER_S,
                what="the server to wait for the node that holds the state dir",
            )
            assert proc.poll() is None, "the server gave up on the node starting"
        finally:
            claim.release()
        node = start_node(state_dir=state_dir)
        server = RawServer(proc)
        server.initialize()
        server.send(call_frame(1, "run", agent="sleeper", task="seconds=0"))
        answer = server.answer()
    assert not answer["result"]["isError"], answer
    ran = answer["result"]["structuredContent"]["run_id"]
    assert node.client().runs.show(ran).state == "complete"  # on the node that won


@pytest.mark.parametrize("closed", ["<&-", ">&-"], ids=["stdin", "stdout"])
def test_a_server_started_with_stdin_or_stdout_closed_refuses_in_one_line(
    closed: str, state_dir: Path
) -> None:
    """Descriptor 0 or 1 may then belong to a socket of the process: never the MCP channel."""
    command = f'exec "$0" -m subagents_node mcp </dev/null {closed}'
    env = {**os.environ, "SUBAGENTS_STATE_DIR": str(state_dir)}
    done = subprocess.run(
        ["sh", "-c", command, sys.executable],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=ANSWER_S,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    stream = "stdin" if closed == "<&-" else "stdout"
    assert line == f"error: {stream} is closed: the MCP server talks over stdin and stdout"


def test_an_empty_agents_dir_is_a_usage_error_as_for_every_other_command(state_dir: Path) -> None:
    """`mcp --agents-dir ''` was taken as the working directory (every .md under it, the state
    dir's task files included, read as agent files) where `run --agents-dir ''` says it is no
    usable path (exit 2)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "subagents_node",
            "--state-dir",
            str(state_dir),
            "mcp",
            "--agents-dir",
            "",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=ANSWER_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: Invalid value for '--agents-dir': '' is not a usable")
    assert list(state_dir.iterdir()) == []  # no node embedded, nothing written
