"""LiveRun: what the RunSupervisor keeps in memory about one run that is still going.

Owns nothing durable: everything here can be rebuilt from the supervisor's tables after a
restart (a recovered run has no `launch`, so it starts no new children and settles once its
running children have). It holds the run's plan, its queue, its ChildActors, and the facts its
settlement needs (outputs, proofs, the first error).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka

from actors import runplan
from actors.base import Cancel
from messages.capacity import SlotHandle
from messages.fanout import FanoutDescriptor
from messages.supervisor import Launch


@dataclass
class LiveRun:
    run_id: str
    session_id: str
    runner_id: str
    run_dir: Path
    handle: SlotHandle | None
    launch: Launch | None  # None for runs recovered after a node restart: no new children
    descriptor: FanoutDescriptor | None
    groups: list[list[runplan.ChildPlan]] = field(default_factory=list)
    next_group: int = 0
    queue: deque[runplan.ChildPlan] = field(default_factory=deque)
    running: dict[str, int] = field(default_factory=dict)  # child id -> child index
    refs: dict[str, pykka.ActorRef[Any]] = field(default_factory=dict)
    outputs: dict[int, str] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    error: str = ""
    failed: bool = False
    stop_state: str | None = None  # "stopped" (by request) or "failed" (run deadline)
    proofs: list[str] = field(default_factory=list)  # proof states of ended children
    settling: bool = False
    cancel_deadline: Cancel | None = None
    deadline_ms: int | None = None  # the run-level deadline (R-TMO-5), if it has one
    #: The pid mark_started recorded for the run's runner (this node). None for a run adopted
    #: after a restart: the node that started it is gone, so its proof names the runner by id.
    runner_pid: int | None = None
    parent_run_id: str | None = None
    mode: str = ""
    pending_appends: int = 0
    pending_steps: int = 0

    def output(self) -> str:
        """The run's output: the last child's, or every task's, labelled, for parallel runs."""
        if not self.outputs:
            return ""
        if self.launch is not None and self.launch.mode == "parallel":
            return "\n\n".join(
                f"[{self.labels.get(i, i)}]\n{out.strip()}"
                for i, out in sorted(self.outputs.items())
            )
        return self.outputs[max(self.outputs)]

    def final_state(self) -> str:
        if self.stop_state == "stopped":
            return "stopped"
        if self.stop_state == "failed" or self.failed:
            return "failed"
        return "complete"
