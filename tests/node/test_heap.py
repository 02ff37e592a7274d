"""The node's processes return their heap's free pages to the kernel after start-up (heap.py):
what a process freed no longer counts in its RSS, nor in that of an owner forked from it."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A child process, so the test's own heap plays no part: 400 blocks of 48 KiB (under glibc's
# mmap threshold, so they come from the heap), all freed but the last, which pins the heap's top
# so a free() cannot shrink it; then the anonymous RSS before and after the release.
_PROBE = """
import sys
from subagents_node.node.heap import release_free_pages

def anon_kib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))

blocks = [bytearray(b"x" * (48 * 1024)) for _ in range(400)]
pin = blocks[-1]
del blocks[:-1]
before = anon_kib()
released = release_free_pages()
print(released, before, anon_kib())
"""


def _probe() -> tuple[bool, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True, timeout=60
    ).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_freed_heap_pages_leave_the_process_rss() -> None:
    released, before_kib, after_kib = _probe()
    if not released:
        pytest.skip("this C library has no malloc_trim (not glibc): nothing to release")
    # 399 freed blocks are 18.7 MiB; most of it must be gone from the RSS.
    assert before_kib - after_kib > 12 * 1024, (before_kib, after_kib)
