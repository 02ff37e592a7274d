"""Child logs are capped per child (issue 12 item 7: a child wrote 300 MiB with no cap).

A real child writes far more than `child_log_max_bytes` to stdout and stderr and then keeps
running (it waits on the test's gate): while it runs its logs stay under the cap, keep their
head and their tail, and say what was cut; then it is released and exits normally.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from subagents_node.node.node import Node
from tests.support.manage import embedded
from tests.support.run_fixtures import gate as gate
from tests.support.runs import Gate, launch_context, wait_until, write_agent

CAP = 64 << 10
#: 400x the cap, in 64 KiB writes, on each of stdout and stderr
FLOOD_BYTES = 400 * CAP

_FLOOD = f"""
import os, socket, sys
block = b"x" * 65535 + b"\\n"
streams = (sys.stdout.buffer, sys.stderr.buffer)
for stream in streams:
    stream.write(b"HEAD-LINE\\n")
    for _ in range({FLOOD_BYTES} // len(block)):
        stream.write(block)
    stream.flush()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(f"{{os.getpid()}}\\n".encode())
code = int(sock.recv(64).decode().strip() or 3)
for stream in streams:  # still the same process, after its logs were cut
    stream.write(b"TAIL-LINE\\n")
    stream.flush()
sys.exit(code)
"""


@pytest.fixture
def flood_agents(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    command = json.dumps([sys.executable, "-c", _FLOOD, "{task}"])
    write_agent(directory, "flood", "Writes far more than the log cap, then waits.", command)
    return directory


@pytest.fixture
def node(state_dir: Path) -> Iterator[Node]:
    with embedded(state_dir, settings={"child_log_max_bytes": CAP}) as started:
        yield started


def test_issue_12_child_logs_stay_under_the_cap_with_head_tail_and_a_cut_line(
    node: Node, flood_agents: Path, gate: Gate
) -> None:
    client = node.client()
    ctx = launch_context(flood_agents)
    run = client.runs.launch(ctx.single("flood", str(gate.path), True, None))
    [child] = gate.accept(1)  # it wrote everything and is still running
    view = client.runs.show(run.run_id)
    assert view.children[0].state == "running"
    paths = [Path(view.children[0].stdout_path), Path(view.children[0].stderr_path)]
    for path in paths:
        wait_until(lambda p=path: p.stat().st_size <= CAP, what=f"{path} to be cut")
    child.release(0)
    done = client.runs.wait(run.run_id, timeout=30)
    assert done.state == "complete" and done.children[0].exit_code == 0
    for path in paths:
        data = path.read_bytes()
        assert len(data) <= CAP, (path, len(data))
        assert data.startswith(b"HEAD-LINE\n")
        assert data.rstrip().endswith(b"TAIL-LINE")
        assert b"bytes of this log were cut here (child_log_max_bytes = 65536)" in data
