"""NodeBinding: which runs' children end with the embedded node that runs them.

A child's shim outlives its node so that the next node adopts it (DESIGN §1). A node embedded in
a process that dies with -9 is the exception for two kinds of runs, whose shims are bound to
that process at spawn and stop their trees themselves when it dies (actors/child/shim.py):
- `foreground`: a foreground CLI command's own run (its `Launch.foreground_pid` is the node's
  own process, the command that embeds it), and the runs it launched (nested runs, workflow
  children). Ctrl-C stops them; so must a kill of the command, which can stop nothing. Other
  commands' runs on that node (a `run --async`, another terminal's foreground run) are not
  bound: the next node adopts them, as after any node's loss.
- `all`: every run of a node whose state dir is temporary (`Node.embedded()` without one):
  nobody could ever adopt its children.
A detached or `start`ed node (`never`) binds nothing.

Pure: it decides, from the node's settings and the launch, and never signals anything.
"""

from __future__ import annotations

from collections.abc import Mapping

from subagents_node.actors.child.procfs import ProcessIdentity, identity_of
from subagents_node.actors.runs.liverun import LiveRun
from subagents_node.messages.supervisor import Launch

#: The node setting that says which runs end with the node (runtime/node/ownerspecs.py).
SETTING = "children_end_with_node"
MODES = ("never", "foreground", "all")


class NodeBinding:
    """The embedded node's process identity and which runs are bound to it."""

    def __init__(self, mode: str, node: ProcessIdentity | None) -> None:
        self.mode = mode if mode in MODES and node is not None else "never"
        self.node = node

    @classmethod
    def from_settings(cls, settings: Mapping[str, object]) -> NodeBinding:
        mode = str(settings.get(SETTING) or "never")
        pid = int(str(settings.get("node_pid") or 0))
        return cls(mode, identity_of(pid) if pid > 0 and mode != "never" else None)

    def ends_with(self, launch: Launch, parent: LiveRun | None) -> ProcessIdentity | None:
        """The process a new run's children end with (None: they outlive the node)."""
        if self.node is None:
            return None
        if self.mode == "all" or (parent is not None and parent.ends_with is not None):
            return self.node
        own = not launch.background and launch.foreground_pid == self.node.pid
        return self.node if own else None
