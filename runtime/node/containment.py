"""The node's containment probe, run on a thread from the moment the start command knows its
state dir and setting, so that it overlaps the node's imports instead of following them, and
the rule of the `containment` setting that picks what the node's children get.

The probe (actors/child/cgroup.py `probe`) moves the node's process into a cgroup of its own
and back: the kernel waits for an RCU grace period at each move, ~15 ms in all in which the
process does nothing. Owns that thread, its result, the setting's rule and the node's mark in
its cgroup directory (`resolve_containment`). The node takes
the result before it forks anything (a process forked while the node sits in the probe's
cgroup would be born there) and sweeps what killed nodes left only once it knows no other node
serves its state dir (`children_containment`, called by runtime/node/node.py). It imports
nothing the start command has not loaded already: the probe must not wait for the node's code.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from subagents_node.actors.child import cgroup
from subagents_node.messages.errors import ConfigError
from subagents_node.messages.node import ContainmentStatus

log = logging.getLogger(__name__)


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


def children_containment(
    setting: str, key: str, early: ContainmentProbe | None
) -> cgroup.Containment:
    """Setting `containment`: `auto` (cgroup v2 where this process may make cgroups, else
    the subreaper alone), `cgroup` (required: the node does not start without it) or
    `subreaper`. `early` is taken only if it probed this setting for this `key` (the state
    dir); called once the node is the only one serving `key`, so the sweep is safe."""
    if early is not None and (early.setting, early.key) == (setting, key):
        found = early.result()
    else:
        found = cgroup.probe(setting, key)
    if found.mode == "cgroup":  # this node is the only one serving the state dir by now
        cgroup.sweep(found.path)
    if setting == "cgroup" and found.mode != "cgroup":
        raise ConfigError(
            f"containment = cgroup, but no cgroup v2 subtree is writable: {found.why}",
            key="containment",
            source="settings",
            reason="cgroup",
        )
    return found


def resolve_containment(
    setting: str, state_dir: Path, early: ContainmentProbe | None
) -> tuple[ContainmentStatus, str]:
    """The node's children's containment, as the setting asks, and the node's mark in its
    cgroup directory ("" without one; removed at the node's stop)."""
    found = children_containment(setting, str(state_dir), early)
    mark = ""
    if found.mode == "cgroup":
        try:  # other nodes' sweeps leave the directory alone while this node serves
            mark = cgroup.mark_serving(found.path)
        except OSError as err:  # only the directory's tidiness depends on it
            log.warning("cannot mark %s as serving: %s", found.path, err)
    log.info("children's containment: %s", found.mode)
    return ContainmentStatus(mode=found.mode, path=found.path, why=found.why), mark
