"""Running a process out of file descriptors, for the tests that check what EMFILE does.

Used inside a process of its own (a `python -c` script run from the repository root): the
limit it sets must never reach the test runner.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path


def exhaust_descriptors(limit: int = 128) -> list[int]:
    """Lower this process's soft RLIMIT_NOFILE to `limit`, then open descriptors until none is
    left; the ones opened (close them to give the process room again)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    hog: list[int] = []
    try:
        while True:
            hog.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        return hog


def run_python(script: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`python -c script` in a process of its own, from the repository root (so it can import
    this module); its output as text."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
