"""Models shared by the RunSupervisor and the child shims (SPEC §9 R-RUN-2/3/5, R-EXT-3).

Owns the shapes of a child process's life: what to start (`ChildSpec`), the process-terminal
proof (`ProcessProof`), the report a child shim sends (`ChildReport`, the one request here, on
the wire), the two events the supervisor derives from reports (`ChildStarted`, `ChildExited`),
and the run and child state names.

A ChildSpec's argv and stdin file may hold the task text; nothing here logs or persists them
(R-MISC-1).

Times are wall-clock seconds since the epoch; durations are seconds unless named `_ms`.
"""

import json
import os
import re
from typing import ClassVar, Literal

from pydantic import Field

from subagents_node.messages import statefiles
from subagents_node.messages.base import Ack, Message, Request, ResultType, validated_reply
from subagents_node.messages.domains import Timestamp

SUPERVISOR = "supervisor"
#: Linux pid_max is at most 2**22; anything above is not a pid.
MAX_PID = 1 << 22

CHILDREN = "children"

RunState = Literal["queued", "running", "paused", "complete", "failed", "stopped", "rejected"]
#: R-RUN-3: terminal is any state other than queued, running or paused.
TERMINAL_RUN_STATES: frozenset[str] = frozenset({"complete", "failed", "stopped", "rejected"})

ChildState = Literal["running", "complete", "failed", "stopped"]
TERMINAL_CHILD_STATES: frozenset[str] = frozenset({"complete", "failed", "stopped"})

#: R-RUN-5: `observed` releases capacity; `unknown` keeps it retained; `not-started` means no
#: process ever existed; `pending` is the state of a live child's proof.
ProofState = Literal["pending", "observed", "unknown", "not-started"]

#: R-EXT-3: the in-memory tails of stdout and stderr.
OUTPUT_TAIL_BYTES = 64 * 1024
#: The line a capped child log holds where bytes were cut (between newlines, after the kept
#: head, before the kept tail; padded with spaces): `cut` bytes of the child's output so far.
#: The node writes it (actors/child/logcap.py); a follower reads it to go on across a cut.
LOG_CUT_LINE = (
    "[subagents-node: {cut} bytes of this log were cut here (child_log_max_bytes = {cap}); "
    "the head and the tail are kept]"
)
#: Beside a capped log, how its last cut left it (a `LogCut`, JSON, replaced atomically).
LOG_CUT_SUFFIX = ".cut"
LOG_CUT_PATTERN = re.compile(
    rb"\[subagents-node: (\d+) bytes of this log were cut here \(child_log_max_bytes = \d+\); "
    rb"the head and the tail are kept\] *"
)
#: R-EXT-3: SIGTERM, then SIGKILL this many seconds later.
DEFAULT_GRACE_S = 2.0
#: R-EXT-3: the exit code reported for a child ended by a timeout or a stop.
ENDED_EXIT_CODE = 1

REASON_EXITED = "exit observed by the parent"
REASON_GONE = "process gone before node restart"
REASON_ADOPTED_EXITED = (
    "adopted after node restart; exited with an unknown exit code (not its parent)"
)
REASON_NOT_STARTED = "spawn failed"
REASON_TREE_UNVERIFIED = "process-tree-unverified: process group members survived SIGKILL"

UNKNOWN_EXIT_ERROR = (
    "The process ended while the node was not its parent; its exit status is unknown."
)


def is_terminal(state: str) -> bool:
    """R-RUN-3 for run states (a child's `running` is the only non-terminal child state)."""
    return state in TERMINAL_RUN_STATES


def exit_error(code: int) -> str:
    """R-EXT-3: the error of a non-zero exit with nothing on stderr."""
    return f"External CLI exited with code {code}."


def signal_error(signum: int) -> str:
    return f"External CLI was terminated by signal {signum}."


def timeout_error(timeout_s: float) -> str:
    """The error of a child ended by its deadline (R-EXT-3 'the timeout message')."""
    return f"Subagent timed out after {round(timeout_s * 1000)} ms."


class ChildSpec(Message):
    """Everything a child shim needs to start one child OS process.

    `env` is complete (the supervisor merged the node's variables and the agent's); `deadline_s`
    counts from the spawn; `argv` may carry the task and is never logged.
    """

    child_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    session_id: str = ""
    argv: list[str] = Field(min_length=1)
    cwd: str
    env: dict[str, str]
    stdin_path: str | None = None
    stdout_path: str
    stderr_path: str
    deadline_s: float | None = Field(default=None, gt=0)
    grace_s: float = Field(default=DEFAULT_GRACE_S, ge=0)
    #: Where the shim keeps `shim.json` and the exit record (default: beside the stdout log).
    record_dir: str | None = None

    @property
    def records(self) -> str:
        return self.record_dir or os.path.join(os.path.dirname(self.stdout_path), self.child_id)


class ProcessProof(Message):
    """R-RUN-5 process-terminal proof of one child process, written by the process's observer.

    `runner_id` is the child id (the "runner process instance id" of §0.1). `exit_code` and
    `signal` are what the observer saw: both None when it could not know (not its parent).
    """

    version: Literal[1] = 1
    state: ProofState
    run_id: str
    runner_id: str
    pid: int | None = None
    process_start_time: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    observed_at: float
    reason: str
    error: str | None = None


class ChildStarted(Message):
    """Emitted after the child's row (pid, start time, state running) is committed; again,
    with `adopted`, when a restarted node found the process alive and watches it."""

    type: Literal["child.started"] = "child.started"
    child_id: str
    run_id: str
    pid: int
    process_start_time: float
    started_at: float
    adopted: bool = False


class ChildExited(Message):
    """Emitted after the proof and the terminal state are committed; the last event of a child.

    `exit_code` is the one reported to users (R-EXT-3: 1 after a timeout or a stop; None when
    unknown); the proof keeps what was observed. `output` is the trimmed stdout tail.
    """

    type: Literal["child.exited"] = "child.exited"
    child_id: str
    run_id: str
    state: ChildState
    proof: ProcessProof
    exit_code: int | None
    output: str = ""
    error: str | None = None
    timed_out: bool = False
    stopped: bool = False
    #: Its shim stopped it because the embedded node it was bound to died without stopping it
    #: (a foreground command killed with -9): its run ends `stopped`, as after Ctrl-C.
    node_gone: bool = False
    started_at: float | None = None
    ended_at: float


ChildEvent = ChildStarted | ChildExited


ShimReportKind = Literal["started", "not_started", "exited", "tree_ended"]
#: What ended a tree before its leader exited by itself: a stop (the supervisor's SIGTERM to the
#: shim), the child's deadline, or `node_gone`: the embedded node the shim was bound to at spawn
#: died without stopping it, and nothing would ever adopt the child (DESIGN §1, embedded mode).
EndedBy = Literal["", "stop", "deadline", "node_gone"]


#: The most escaped processes one report names (the rest are still waited for by the shim).
MAX_REPORTED_PROCESSES = 256


class ReportedProcess(Message):
    """A process of a child's tree the shim saw, by identity (pid + start time since boot)."""

    pid: int = Field(ge=1, le=MAX_PID)
    start: Timestamp


class ChildReport(Request):
    """What a child shim tells the run supervisor (DESIGN §1), resent until acknowledged.

    Every report carries every fact the shim knows so far, so any one of them (a new node may
    see only the last) settles what it can; the supervisor applies them idempotently, in `seq`
    order per child. `tree_ended` is the only proof that the child's whole tree is gone.
    """

    type: Literal["child.report"] = "child.report"
    target: ClassVar[str] = SUPERVISOR
    Result: ClassVar[ResultType] = Ack
    kind: ShimReportKind
    seq: int = Field(ge=1, le=1_000)
    child_id: str = Field(min_length=1, max_length=128)
    run_id: str = Field(min_length=1, max_length=128)
    shim_pid: int = Field(ge=1, le=MAX_PID)
    shim_start: Timestamp
    boot_id: str = Field(default="", max_length=64)
    pid: int | None = Field(default=None, ge=1, le=MAX_PID)
    identity_start: Timestamp | None = None
    start_time: Timestamp | None = None
    exit_code: int | None = Field(default=None, ge=0, le=255)
    signal: int | None = Field(default=None, ge=1, le=128)
    ended_at: Timestamp | None = None
    ended_by: EndedBy = ""
    tree_ended: bool = False
    tree_ended_at: Timestamp | None = None
    error: str | None = Field(default=None, max_length=4096)
    #: The processes left when the leader exited (escaped sessions included): should the shim
    #: die, the tree's end is proven only once every one of them is gone.
    descendants: list[ReportedProcess] = Field(
        default_factory=list, max_length=MAX_REPORTED_PROCESSES
    )
    #: The child's own cgroup (cgroup v2 containment), None when the subreaper alone holds it.
    cgroup: str | None = Field(default=None, max_length=4096)


REQUESTS: tuple[type[Request], ...] = (ChildReport,)


def output_tail(path: str, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The trimmed last `limit` bytes of a log (R-EXT-3's in-memory tail), read at the end.

    A child's output is this tail of its stdout; the node and the fleet view read it the same
    way, so it lives with the wire models both sides import."""
    try:
        # A regular file only, never through a symlink (statefiles.py): the child can replace
        # its log, and the supervisor reads it on its loop, where a FIFO's open() wedged it.
        fd = statefiles.open_file(path)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, limit, max(0, size - limit))
    except OSError:
        return ""
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").strip()


class LogCut(Message):
    """How the last cut of a capped child log left the file: `gen` is odd while a rewrite is
    under way and even once it is done; the tail then starts at `at + line` in the file (after
    the head and the cut line) and at `at + cut` in the child's output."""

    gen: int = 0
    at: int = 0
    cut: int = 0
    line: int = 0

    @classmethod
    def of(cls, log_path: str, tolerant: bool = False) -> "LogCut | None":
        """The announcement beside `log_path`, None when there is none (never cut) or it
        cannot be read. `tolerant` is a client's read: a node one release newer may add a field
        to the announcement, which is dropped as a reply's would be (`validated_reply`,
        docs/api.md "Compatibility") instead of reading the log as never cut; the node reads
        its own announcement strictly."""
        try:
            # statefiles: a FIFO there must not wedge the log cap (or a reader), nor a link
            # lead it elsewhere.
            raw = statefiles.read_file(log_path + LOG_CUT_SUFFIX, 4096)
            if not tolerant:
                return cls.model_validate_json(raw)
            return validated_reply(cls, json.loads(raw))
        except (OSError, ValueError):  # pydantic's ValidationError is a ValueError too
            return None
