"""The workflow host: the process that runs a workflow script (SPEC §12).

    python -m subagents_node.workflow.host SCRIPT [--agents-dir D ...] [--intercom on|off]

Started by the RunSupervisor as a workflow run's only child (`subagents-node workflow` builds
that run), with SUBAGENTS_NODE, SUBAGENTS_SESSION, SUBAGENTS_RUN_ID (the workflow run),
SUBAGENTS_RUN_FANOUT (its budget), SUBAGENTS_WORKFLOW_TOKEN, SUBAGENTS_DEPTH (the workflow's
own), SUBAGENTS_CHILD_DIR and, with an aggregate output, SUBAGENTS_OUTPUT.

Owns one script execution. The script is run as a module with `runs` (runtime.workflow_api),
`emit` and `console` in its globals and must define `main(runs)`: its return value is the
workflow's value, `emit(value)` adds to the result, and `console(...)` or `print(...)` add
console lines. A resumed workflow run (`source_run_id`) reuses what its source's children
finished: those keys are not run again and no key its source admitted is claimed again. When it
ends, the host writes the aggregate output (R-WF-9), `result.json` (R-RUN-7) and `status.json`
(R-RUN-4, also rewritten at every admission) in the workflow's run dir, prints the summary on
stdout (the run's output) and, unless the script returned, the error on stderr (the run's error)
and exits non-zero. On SIGTERM (a stop, or the script's deadline, R-TMO-7) it stops the children
it awaits, marks them stopped (R-WF-10) and writes the same files within the node's stop grace.

It never writes the node's state (only requests do), never hands its token to a child, and
admits nothing once the script has ended.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import functools
import inspect
import io
import os
import runpy
import signal
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TextIO, TypeVar

from subagents_node.client.client import Client, connect
from subagents_node.client.nodewait import across_lost_nodes
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.constants import (
    ENV_CHILD_DIR,
    ENV_FANOUT,
    ENV_NODE,
    ENV_OUTPUT,
    ENV_RUN_ID,
    ENV_SESSION,
    ENV_WORKFLOW_TOKEN,
    NODE_BACK_S,
)
from subagents_node.messages.errors import SubagentsError, WorkflowHostError
from subagents_node.messages.fanout import decode_descriptor
from subagents_node.messages.supervisor import IntercomMode
from subagents_node.workflow.api import MAX_NODE_LOSSES, WorkflowEnv, WorkflowRuns
from subagents_node.workflow.calls import to_jsonable
from subagents_node.workflow.launch import RESULT_FILE
from subagents_node.workflow.limits import RECORD_MAX_BYTES, check_value
from subagents_node.workflow.report import (
    STATUS_FILE,
    Outcome,
    display_text,
    result_document,
    scalar_text,
    status_document,
    summary_line,
    write_aggregate,
    write_json,
)
from subagents_node.workflow.resumed import Prior, prior_steps
from subagents_node.workflow.stop import WorkflowStopped

_REQUIRED = (
    ENV_NODE,
    ENV_SESSION,
    ENV_RUN_ID,
    ENV_FANOUT,
    ENV_WORKFLOW_TOKEN,
    ENV_CHILD_DIR,
)
T = TypeVar("T")
#: The event the supervisor records when a run is told to stop (actors.supervisor).
_STOP_EVENT = "run.stopping"


def workflow_env(environ: Mapping[str, str], cwd: Path, intercom: IntercomMode) -> WorkflowEnv:
    """The workflow run this host serves, from the variables its node set."""
    missing = [name for name in _REQUIRED if not environ.get(name, "").strip()]
    if missing:
        raise WorkflowHostError(
            f"the workflow host runs inside a workflow run (missing {', '.join(missing)}); "
            "start one with `subagents-node workflow SCRIPT`",
            variable=missing[0],
        )
    aggregate = environ.get(ENV_OUTPUT, "").strip()
    return WorkflowEnv(
        run_id=environ[ENV_RUN_ID],
        session_id=environ[ENV_SESSION],
        token=environ[ENV_WORKFLOW_TOKEN],
        descriptor=decode_descriptor(environ[ENV_FANOUT]),
        run_dir=Path(environ[ENV_CHILD_DIR]).parent,
        cwd=cwd,
        aggregate=Path(os.path.normpath(aggregate)) if aggregate else None,
        intercom=intercom,
    )


class ConsoleWriter(io.TextIOBase):
    """sys.stdout while the script runs: complete lines become the workflow's console lines.

    A text stream as sys.stdout is one (io.TextIOBase: `isatty()`, `writelines`, `closed`,
    `encoding`, and `buffer` for bytes, read as UTF-8 with U+FFFD for what is not): a script
    or a library that asked it for more than `write` (`rich`, `tqdm`, `sys.stdout.buffer`)
    failed with AttributeError before."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, runs: WorkflowRuns) -> None:
        super().__init__()
        self._runs = runs
        self._partial = ""
        self.buffer = _ConsoleBytes(self)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._runs.console(line)
        if len(self._partial) > RECORD_MAX_BYTES:  # a line that never ends is not held whole
            self.flush()
        return len(text)

    def flush(self) -> None:
        self.buffer.drain()
        if self._partial:
            self._runs.console(self._partial)
            self._partial = ""


class _ConsoleBytes(io.BufferedIOBase):
    """`sys.stdout.buffer` of the console: bytes decoded as UTF-8 (a character split across
    writes is kept whole; bytes that are no UTF-8 become U+FFFD), then written as text."""

    def __init__(self, text: ConsoleWriter) -> None:
        super().__init__()
        self._text = text
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._text.write(self._decoder.decode(chunk))
        return len(chunk)

    def drain(self) -> None:
        """Whatever a split character left undecoded, as U+FFFD (the console is flushed)."""
        rest = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        if rest:
            self._text.write(rest)


def run_script(path: Path, runs: WorkflowRuns) -> Any:
    """Execute the script with `runs`, `emit` and `console` in its globals; call `main(runs)`."""
    # Checked again here, not only when the workflow was launched: a resume runs the script
    # found at its path now, and runpy opening a FIFO put there waited for a writer for good.
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise TypeError(f"the workflow script {path} is not a regular file")
    sys.path.insert(0, str(path.parent))  # the script may import its neighbours
    writer = ConsoleWriter(runs)
    try:
        with contextlib.redirect_stdout(writer):
            namespace = runpy.run_path(
                str(path),
                init_globals={"runs": runs, "emit": runs.emit, "console": runs.console},
                run_name="__workflow__",
            )
            entry = namespace.get("main")
            if not callable(entry):
                raise TypeError(f"the workflow script {path} must define main(runs)")
            value = entry(runs)
            if inspect.iscoroutine(value):
                # `async def main` ran nothing: the workflow "completed" with the coroutine's
                # repr as its value (and Python's "never awaited" warning on stderr).
                value.close()
                raise TypeError(
                    "main(runs) is an async function: the workflow API is synchronous; "
                    "define it with `def` (runs.all runs children side by side)"
                )
            return value
    finally:
        writer.flush()


def _error_text(exc: BaseException) -> str:
    message = exc.message if isinstance(exc, SubagentsError) else _shown(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _shown(value: object) -> str:
    """str(value), or what Python's own traceback shows when that raises: a script's exception
    (or `sys.exit` argument) whose __str__ raised ended the host with its traceback as the
    run's error, and no result.json."""
    try:
        return str(value)
    except Exception:
        return "<exception str() failed>"


def _stop_reason(client: Client, run_id: str) -> tuple[str, str]:
    """A stop request shows as `run.stopping` in the run's events; without one, the SIGTERM
    came from the script's own deadline (R-TMO-7): failed, not stopped (R-WF-10)."""
    with contextlib.suppress(SubagentsError):
        seq, more = 0, True
        while more:  # every page of the run's events (runs.watch answers at most a page)
            batch = client.runs.watch(run_id, seq, wait_s=0)
            for event in batch.events:
                if event.kind == _STOP_EVENT:
                    return "stopped", str(event.data.get("reason") or "Stopped by request.")
            seq, more = batch.last_seq, batch.more
    return "failed", "The workflow script was ended before it finished (its timeout passed)."


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop is enough: the files come next
    raise WorkflowStopped()


class Host:
    """One script execution and what it leaves behind."""

    def __init__(
        self,
        client: Client,
        launcher: LaunchContext,
        env: WorkflowEnv,
        script: Path,
        prior: Prior | None = None,
    ) -> None:
        self.client = client
        prior = prior or Prior()
        self.runs = WorkflowRuns(
            client,
            launcher,
            env,
            on_change=self.write_status,
            prior=prior.runs,
            prior_claimed=prior.claimed,
        )
        self.script = script
        self.outcome = Outcome(started_at=time.time())

    def write_status(self) -> None:
        with contextlib.suppress(OSError):  # status.json is for people; the node has the truth
            doc = status_document(self.outcome, self.runs, time.time())
            write_json(self.runs.env.run_dir / STATUS_FILE, doc)

    def execute(self) -> None:
        outcome = self.outcome
        outcome.state = "running"
        # R-WF-1 step 6 / R-RUN-4: the initial status carries the budget as it stands, not only
        # after the first admission; without the fanout owner it says null, as status.json
        # is for people and the node has the truth.
        with contextlib.suppress(SubagentsError):
            self.runs.fanout = self.runs.budget()
        self.write_status()
        signal.signal(signal.SIGTERM, _raise_stop)
        try:
            # As JSON data now: a value that cannot be one fails the script, with its reason.
            value = to_jsonable(run_script(self.script, self.runs))
            check_value(value)  # WorkflowResultTooLarge: failed, and the value is not kept
            outcome.value, outcome.state = value, "complete"
        except WorkflowStopped:
            outcome.state, outcome.error = _stop_reason(self.client, self.runs.env.run_id)
            self.runs.abort(outcome.error)
        except SystemExit as exc:
            if exc.code in (None, 0):
                outcome.state = "complete"
            else:
                outcome.state, outcome.error = "failed", f"SystemExit: {_shown(exc.code)}"
        except BaseException as exc:  # KeyboardInterrupt, GeneratorExit, asyncio's CancelledError…
            # Any other BaseException a script raises fails it as an exception does: one not
            # caught here ended the host with its traceback as the run's error, no result.json
            # and a status.json left `running`.
            outcome.state, outcome.error = "failed", _error_text(exc)
            outcome.traceback = "".join(traceback.format_exception(exc))
        finally:
            # The files must be written even if a second SIGTERM arrives meanwhile.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.runs.settle()
            outcome.ended_at = time.time()

    def finish(self, out: TextIO, err: TextIO) -> int:
        """R-WF-9 then R-RUN-7: the aggregate, the result file, the final status, the text."""
        outcome, env = self.outcome, self.runs.env
        if outcome.state != "stopped":
            self.runs.refresh()  # background children may have ended already
        if env.background:
            text = summary_line(outcome, self.runs)
        else:
            text = display_text(outcome, self.runs)
        if env.aggregate is not None:
            problem = write_aggregate(env.aggregate, text)
            if problem is not None:
                text = f"{text}\n\n{problem}"
        now = time.time()
        try:
            write_json(env.run_dir / RESULT_FILE, result_document(outcome, self.runs, text, now))
        except OSError as exc:
            print(f"cannot write {env.run_dir / RESULT_FILE}: {exc}", file=err)
        self.write_status()
        print(scalar_text(text), file=out, flush=True)
        if outcome.state == "complete":
            return 0
        print(scalar_text(outcome.error or "Workflow failed."), file=err, flush=True)
        return 143 if outcome.state == "stopped" else 1


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m subagents_node.workflow.host")
    parser.add_argument("script", type=Path)
    parser.add_argument("--agents-dir", dest="agents_dirs", action="append", default=[])
    parser.add_argument("--intercom", choices=("on", "off"), default="on")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        env = workflow_env(os.environ, Path.cwd(), args.intercom)
    except SubagentsError as err:
        print(f"workflow host: {err.message}", file=sys.stderr)
        return 2
    with connect(os.environ[ENV_NODE]) as client:
        try:
            # Read from the node, waiting for the next one if it is stopped or killed as the
            # host starts (an upgrade right after a `resume`): a host that went on without
            # knowing it resumes its source ran the source's finished keys again and claimed
            # them a second time. Without a node in time it fails; nothing is guessed.
            env = _across_lost_nodes(client, functools.partial(_with_mode, env, client))
            launcher = LaunchContext.from_environment(
                cwd=env.cwd,
                env=os.environ,
                agents_dirs=args.agents_dirs,
                session_id=env.session_id,
            )
            # A resumed workflow must know what its source did, or it would run it again.
            source = env.source_run_id
            prior = _across_lost_nodes(client, functools.partial(prior_steps, client, source))
        except SubagentsError as err:
            print(f"workflow host: {err.message}", file=sys.stderr)
            return 2
        host = Host(client, launcher, env, args.script.resolve(), prior)
        # The host's own copies of its stdout and stderr (the run's output and error): a
        # script that closed descriptor 1 or 2 (or pointed it elsewhere) made the summary's
        # print fail, and a complete workflow's run ended `failed` ("exited with code 1").
        with _own_stream(sys.stdout) as out, _own_stream(sys.stderr) as errors:
            host.execute()
            return host.finish(out, errors)


@contextlib.contextmanager
def _own_stream(stream: TextIO) -> Iterator[TextIO]:
    """A text stream on a duplicate of `stream`'s descriptor, as `stream` writes."""
    stream.flush()
    fd = os.dup(stream.fileno())
    with open(fd, "w", encoding=stream.encoding, errors=stream.errors) as own:
        yield own


def _across_lost_nodes(client: Client, read: Callable[[], T]) -> T:
    """`read()` (a read, safe to make twice), made again on the state dir's next node each time
    the node is lost under it, as the script's own calls are (workflow/api.py)."""
    return across_lost_nodes(client, read, NODE_BACK_S, MAX_NODE_LOSSES)


def _with_mode(env: WorkflowEnv, client: Client) -> WorkflowEnv:
    """Foreground or background decides the text (R-WF-9), and a resumed workflow reuses its
    source's steps (R-WF-5); the node knows both."""
    run = client.runs.show(env.run_id)
    source = run.source_run_id if run.source_kind == "resume" else None
    return dataclasses.replace(env, background=run.background, source_run_id=source)


def _exit(code: int) -> NoReturn:
    """End the host with `code` once the script settled and its files are written. Threads
    the script left running are not waited for (their calls already raise WorkflowSettled):
    the interpreter's exit joined them, so a thread still sleeping kept a complete workflow
    `running` until it was stopped or its deadline failed it (a background one, with no
    deadline, for good, with its slot). A thread awaiting a foreground child holds the runs'
    lock, which the files' writing takes: the host has waited for that child by now."""
    main_thread = threading.main_thread()
    if not any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
