"""Hands the C heap's free pages back to the kernel, at the moments a node process has just
finished its start-up: the node before it forks an owner, an owner once it is ready.

glibc keeps what a process freed (the start-up's imports, schemas built and dropped, an owner's
recovery) resident for its next allocation, and a forked owner inherits those pages as its own
RSS. `malloc_trim(0)` releases every whole free page of every arena: 0.6 to 0.8 MiB in each
process of an idle node that compiled its modules from source (the compiler's garbage), next to
nothing when they came from a bytecode cache. It costs a walk of the heap (about 0.2 ms here),
so it must never run on a request's path; on a C library without it (musl), nothing happens.

Owns no state (the C library's handle is looked up at each call: a few microseconds, at a
moment that has none to save)."""

from __future__ import annotations

import ctypes


def release_free_pages() -> bool:
    """Return the free pages of the C heap to the kernel; False where the C library has no
    `malloc_trim` (nothing was released)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
