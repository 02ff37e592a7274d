"""The node's containment probe, run on a thread from the moment the start command knows its
state dir and setting, so that it overlaps the node's imports instead of following them.

The probe (actors/child/cgroup.py `probe`) moves the node's process into a cgroup of its own
and back: the kernel waits for an RCU grace period at each move, ~15 ms in all in which the
process does nothing. Owns that thread and its result only. The node takes the result before
it forks anything (a process forked while the node sits in the probe's cgroup would be born
there) and sweeps what killed nodes left only once it knows no other node serves its state
dir (runtime/node/node.py).
"""

from __future__ import annotations

import threading

from subagents_node.actors.child import cgroup


class ContainmentProbe:
    """`cgroup.probe(setting, key)`, started at once on its own thread; `result()` waits."""

    def __init__(self, setting: str, key: str) -> None:
        self.setting = setting
        self.key = key
        self._found: cgroup.Containment | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="containment-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._found = cgroup.probe(self.setting, self.key)
        except BaseException as exc:  # handed to the caller of result(), on its own thread
            self._error = exc

    def result(self) -> cgroup.Containment:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._found is not None
        return self._found
