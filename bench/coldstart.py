"""Cold start of the command line: what every CLI call and every child agent pays before work.

Measures, in one run and alternating so that load drifts hit every command alike, the median
wall time of:
- the floor: `python -c "import zmq, msgpack, click"` (the libraries a client cannot avoid);
- `subagents-node --version` (the CLI's own start-up);
- `subagents-node ping` against a running node (start-up, the client, one round trip);
- `python -c "import subagents_node; subagents_node.connect(...)"` (what a Python child agent
  pays to reach its node).
Target (issue 9): `ping` <= 2x the floor. It also lists the heaviest imports of `ping`
(`-X importtime`), so a miss says where the time goes. It reports; it never asserts.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import detached_node, markdown_table

REPEATS = 15
SCRIPT = Path(sys.executable).with_name("subagents-node")


def _timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _heaviest_imports(argv: list[str], env: dict[str, str], top: int = 6) -> list[tuple[str, int]]:
    """The libraries (top-level modules, wherever first imported) by cumulative import time
    (µs), from one `-X importtime` run; our own package is listed apart, without them."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], env=env, capture_output=True, text=True
    ).stderr
    libraries: dict[str, int] = {}
    for line in out.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        if "." not in name.strip():
            libraries[name.strip()] = max(libraries.get(name.strip(), 0), int(cumulative))
    return sorted(libraries.items(), key=lambda item: -item[1])[:top]


def main() -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    with detached_node() as address:
        commands = {
            "floor: import zmq, msgpack, click": [
                sys.executable,
                "-c",
                "import zmq, msgpack, click",
            ],
            "subagents-node --version": [str(SCRIPT), "--version"],
            "subagents-node ping": [str(SCRIPT), "--address", address, "ping"],
            "python: import subagents_node + connect + ping": [
                sys.executable,
                "-c",
                f"import subagents_node; subagents_node.connect({address!r}).ping()",
            ],
        }
        for argv in commands.values():  # warm the page cache once
            _timed(argv, env)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(REPEATS):
            for name, argv in commands.items():
                samples[name].append(_timed(argv, env))
        heavy = _heaviest_imports(["-m", "subagents_node", "--address", address, "ping"], env)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    floor = medians["floor: import zmq, msgpack, click"]
    table = markdown_table(
        ["command", "median ms", "min ms", "÷ floor"],
        [
            (name, medians[name] * 1000, min(samples[name]) * 1000, f"{medians[name] / floor:.2f}x")
            for name in commands
        ],
    )
    ping_ratio = medians["subagents-node ping"] / floor
    verdict = "met" if ping_ratio <= 2.0 else "missed"
    imports = ", ".join(f"`{name}` {us / 1000:.0f} ms" for name, us in heavy)
    return (
        "## Cold start: the CLI and a Python client, against the libraries' import floor\n\n"
        f"Median of {REPEATS} runs each, alternating; `ping` goes to a running node over ipc. "
        f"Target: `ping` <= 2x the floor: **{verdict}** ({ping_ratio:.2f}x).\n\n"
        f"{table}\n\nHeaviest top-level imports of `ping` (cumulative, including what each one "
        f"imports; one `-X importtime` run): {imports}."
    )


if __name__ == "__main__":
    print(main())
