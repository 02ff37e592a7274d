"""Recursive: launch children of itself through the `run` command and count the admissions.

Task: `depth=N width=W [agent=recursive]`. At depth 0 it is a leaf. Otherwise it launches W
children at once, each with task `depth=N-1 width=W`, using the command in `$SUBAGENTS_LAUNCH`
(a JSON list or a shell-like string; default `python -m subagents_node run`) followed by
`--agents-dir <this dir> <agent> <task>`. A launch that exits 0 was admitted; one that exits
non-zero with an admission refusal on stderr (the fan-out budget, the session spawn budget, the
depth guard) was refused; anything else failed.

Prints one line: `recursive: depth=N width=W admitted=A refused=R failed=F subtree_admitted=SA
subtree_refused=SR`, where the subtree counts add what the children reported about their own
launches. The counts are the agent's output, so it exits 0 even when launches were refused.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from agentlib import parse_fields, positional, read_task

#: Admission refusals: the fan-out budget, the session spawn budget, the depth guard.
REFUSAL = re.compile(
    r"fan-?out|RUN_FANOUT|max_subagent_spawns|Nested subagent call blocked", re.IGNORECASE
)
SUBTREE = re.compile(r"subtree_admitted=(\d+) subtree_refused=(\d+)")


def launch_command() -> list[str]:
    raw = os.environ.get("SUBAGENTS_LAUNCH", "").strip()
    if not raw:
        return [sys.executable, "-m", "subagents_node", "run"]
    return [str(a) for a in json.loads(raw)] if raw.startswith("[") else shlex.split(raw)


def main(argv: list[str]) -> int:
    fields = parse_fields(read_task(positional(argv)), ("depth", "width", "agent"))
    try:
        depth = int(fields.get("depth", "1").strip())
        width = int(fields.get("width", "2").strip())
    except ValueError:
        print("recursive: depth and width must be integers", file=sys.stderr)
        return 1
    agent = fields.get("agent", "recursive").strip() or "recursive"
    admitted = refused = failed = sub_admitted = sub_refused = 0
    if depth > 0:
        agent_dir = str(Path(__file__).resolve().parent)
        child_task = f"depth={depth - 1} width={width} agent={agent}"
        command = [*launch_command(), "--agents-dir", agent_dir, agent, child_task]
        launches = [
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(width)
        ]
        for proc in launches:
            out, err = proc.communicate()
            if proc.returncode == 0:
                admitted += 1
                for match in SUBTREE.finditer(out):
                    sub_admitted += int(match[1])
                    sub_refused += int(match[2])
            elif REFUSAL.search(err):
                refused += 1
            else:
                failed += 1
                print(f"recursive: a launch failed: {err.strip()[-300:]}", file=sys.stderr)
    print(
        f"recursive: depth={depth} width={width} admitted={admitted} refused={refused} "
        f"failed={failed} subtree_admitted={admitted + sub_admitted} "
        f"subtree_refused={refused + sub_refused}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
