"""NodeBinding: which runs' children end with the embedded node that runs them.

A child's shim outlives its node so that the next node adopts it (DESIGN §1). A node embedded in
a process that dies with -9 is the exception for two kinds of runs, whose shims are bound to
that process and stop their trees themselves when it dies (actors/child/shim.py):
- `foreground`: the runs of the foreground CLI command that embeds the node. A run belongs to
  the command that launched it to follow it (its `Launch.foreground_pid`, kept as the
  process's identity, pid and start time, in the run's row: `foreground_of`), and a run its
  child launched (a nested run, a workflow child) belongs to its parent's command. Ctrl-C
  stops them; so must a kill of the command, which can stop nothing. Other commands' runs on
  that node (a `run --async`, another terminal's foreground run, what a `wait` waits on) are
  not bound: the next node adopts them, as after any node's loss.
- `all`: every run of a node whose state dir is temporary (`Node.embedded()` without one):
  nobody could ever adopt its children.
A detached or `start`ed node (`never`) binds nothing.

Who is bound to whom is decided twice by the same rule (`ends_with`): when a run's children
are spawned, and when a new node adopts a run still going (actors/runs/rebinding.py). So a
foreground command whose node was lost, and which took the state dir over with a node of its
own, has its run bound to it again, as if it had launched it there; a run whose command is
another process keeps the binding its shims have (none, or that command while it lives).

Pure: it decides, from the node's settings and the run, and never signals anything.
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

    def foreground_of(self, launch: Launch, parent: LiveRun | None) -> ProcessIdentity | None:
        """The foreground command a new run belongs to: its parent run's, else the command
        that launched it in the foreground (by pid and start time: a pid reused later names
        another process); None for a run nobody follows (a background one). Read on every
        node, bound or not: a node that adopts the run later decides by it."""
        if parent is not None and parent.foreground is not None:
            return parent.foreground
        pid = launch.foreground_pid
        if launch.background or pid is None:
            return None
        if self.node is not None and pid == self.node.pid:
            return self.node  # the command that embeds this node (no /proc read)
        return identity_of(pid)

    def ends_with(self, foreground: ProcessIdentity | None) -> ProcessIdentity | None:
        """The process the children of a run that belongs to `foreground` end with (None:
        they outlive the node): this node's own, when it binds them."""
        if self.node is None:
            return None
        if self.mode == "all" or foreground == self.node:
            return self.node
        return None
