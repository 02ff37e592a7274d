"""Sleeper: a tiny agent for tests of deadlines, stops and process-group kills.

Task: `seconds=N [grandchild=1] [ignore_term=1] [daemon=M] [ready=FIFO] [exit=CODE]`. With
`grandchild=1` it first starts a grandchild (in the same process group) that sleeps as long;
with `ignore_term=1` both ignore SIGTERM, so only SIGKILL ends them; with `daemon=M` it starts
a grandchild that calls `setsid()` (a daemon escaping the process group) and sleeps M seconds;
with `ready=FIFO` it writes `<own pid> <grandchild pid or 0>` (then ` <daemon pid>` when
`daemon` is given) into that FIFO once they run. Then it sleeps, prints `slept N` and exits with
CODE (default 0).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agentlib import parse_fields, positional, read_task


def main(argv: list[str]) -> int:
    fields = {
        k: v.strip()
        for k, v in parse_fields(
            read_task(positional(argv)),
            ("seconds", "grandchild", "ignore_term", "daemon", "ready", "exit"),
        ).items()
    }
    seconds = float(fields.get("seconds", "1"))
    if fields.get("ignore_term") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the grandchild's exec
    grandchild_pid = 0
    if fields.get("grandchild") == "1":
        grandchild = subprocess.Popen(
            [sys.executable, "-c", f"import time; time.sleep({seconds})"],
            stdin=subprocess.DEVNULL,
        )
        grandchild_pid = grandchild.pid
    daemon = ""
    if fields.get("daemon"):
        escaped = subprocess.Popen(
            [sys.executable, "-c", f"import time; time.sleep({float(fields['daemon'])})"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # setsid(): its own session and process group
        )
        daemon = f" {escaped.pid}"
    if fields.get("ready"):
        with open(fields["ready"], "w") as fifo:
            fifo.write(f"{os.getpid()} {grandchild_pid}{daemon}\n")
    time.sleep(seconds)
    print(f"slept {seconds:g}")
    return int(fields.get("exit", "0"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
