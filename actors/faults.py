"""Fault injection for the owners: live only on a node started with faults (tests).

Owns the reading of the fault settings once per process: which admission steps must fail with
a typed error (`points`, the run supervisor's), and where the node must die as a power cut or
an OOM kill would (`crash`: the run supervisor's launch steps, the fan-out owner's recorded
claim), so tests can prove that no step of a launch leaves a stuck run and that a request
whose answer was lost is safe to send again. It must never act on a node started without
faults.
"""

from __future__ import annotations

import logging
import os
import signal
from contextlib import suppress
from typing import Any

log = logging.getLogger(__name__)


class FaultInjection:
    """What the node's fault settings ask of this process; inert without `ctx.faults`."""

    def __init__(self, ctx: Any) -> None:
        self.live = bool(ctx.faults)
        settings = ctx.settings if self.live else {}
        #: Admission steps told to fail (runs/admission.py).
        self.points = frozenset(str(p) for p in settings.get("fault_points", ()))
        self._kill_points = frozenset(str(p) for p in settings.get("fault_kill_points", ()))
        self._node_pid = int(settings.get("node_pid", 0) or 0)

    def crash(self, point: str) -> None:
        """Die here with SIGKILL when `point` is one of the kill points: the node with this
        process, or this owner process alone when the point is given as `owner:POINT` (the
        node restarts it, as after an OOM kill of that process only)."""
        alone = f"owner:{point}" in self._kill_points
        if point not in self._kill_points and not alone:
            return
        log.warning("fault injection: killing the %s at %s", "owner" if alone else "node", point)
        if not alone and self._node_pid and self._node_pid != os.getpid():
            # The node first (its owners die with it, PDEATHSIG), then this process.
            with suppress(ProcessLookupError):
                os.kill(self._node_pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
