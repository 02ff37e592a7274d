"""`subagents-node mcp`: a stdio MCP server (the official `mcp` SDK's MCPServer) whose tools
are the launcher's operations.

Owns the tool surface (names, input schemas with descriptions, annotations), the translation
of a `SubagentsError` into a tool error (isError) whose text is the error's own message (the
ledger's refusal, word for word), each tool's text with any terminal control from a child or an
agent file shown as an escape (messages/inert.py; the structured content keeps the data as it
is), and the node the server talks to: the one the environment
names (`$SUBAGENTS_NODE`, set for every agent child, so the child's launches count against its
run tree), else the state dir's, else an embedded node it owns and stops on exit.

It must never write to stdout (the MCP channel) nor decide admission: the node does.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, ParamSpec

import anyio
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from subagents_node.client.aio import AsyncClient
from subagents_node.client.client import connect, default_address
from subagents_node.launch.launcher import LaunchContext
from subagents_node.mcp.arguments import ToolServer, refusal
from subagents_node.mcp.endsignals import EndSignals
from subagents_node.mcp.stdio import serve_stdio
from subagents_node.mcp.tools import MAX_LOG_BYTES, LauncherTools, ToolAnswer
from subagents_node.messages.base import schema_error
from subagents_node.messages.constants import VERSION
from subagents_node.messages.errors import NodeAlreadyRunning, NodeNotRunning, SubagentsError
from subagents_node.messages.inert import printable

P = ParamSpec("P")

#: How long a server whose embedded node lost the state dir to another process's node waits
#: for that node to serve (as cli/nodestart.py's RACE_WAIT_S).
RACE_WAIT_S = 20.0
#: The `wait` tool's default: under the shortest default tool timeout of the agent CLIs (Codex
#: CLI's 60 s), so a plain `wait` answers "still running" instead of being abandoned.
WAIT_DEFAULT_S = 50.0

INSTRUCTIONS = (
    "Launch sub-agents under the node's ledgers: list agents, run one (or several in parallel, "
    "or a chain), then follow background runs with wait, logs, stop, resume, attach and "
    "append, and rerun a child with a new task. "
    "A refusal by a ledger (capacity, fan-out budget, spawn budget, depth) is a tool error "
    "whose text says which limit was reached; it is final for that launch."
)


class TaskSpec(BaseModel):
    """One agent and its task, as in a run file's [[tasks]]."""

    # As strict as a run file: `"background": "yes"` or a stray key is the caller's mistake to
    # read, never a guess.
    model_config = ConfigDict(extra="forbid", strict=True)

    agent: str = Field(description="Agent name (see the agents tool).")
    task: str = Field(description="The task text given to the agent.")
    cwd: str | None = Field(default=None, description="Working directory of this child.")
    output: str | None = Field(default=None, description="File the child writes its output to.")


class ChainStepSpec(BaseModel):
    """One chain step: one agent and task, or a parallel group (`parallel`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    agent: str | None = Field(default=None, description="Agent of a single step.")
    task: str | None = Field(
        default=None, description="Task of a single step; {previous} is the last step's output."
    )
    cwd: str | None = Field(default=None, description="Working directory of this step.")
    output: str | None = Field(default=None, description="File the step writes its output to.")
    parallel: list[TaskSpec] | None = Field(
        default=None, description="Instead of agent/task: tasks run side by side as one step."
    )
    expand: bool | None = Field(
        default=None,
        description="With agent/task: run once per item of the previous step's output (its "
        "JSON list, else its lines), {item} in the task; claimed as one batch.",
    )
    max_items: int | None = Field(default=None, ge=1, description="An expand step's item cap.")
    checkpoint: str | None = Field(
        default=None,
        description="Instead of agent/task: pause the run here (this note) until approved.",
    )

    def as_step(self) -> dict[str, Any]:
        """The run file's shape (what `LaunchContext.from_mapping` reads)."""
        step = self.model_dump(exclude_none=True, exclude={"parallel"})
        if step.get("expand") is False:
            del step["expand"]
        if self.parallel is not None:
            # Whatever else the step names goes along: the launcher refuses it beside
            # `parallel` rather than this dropping it.
            step["parallel"] = [t.model_dump(exclude_none=True) for t in self.parallel]
        return step


def not_bool(value: object) -> object:
    """JSON's true is no number: pydantic would read it as 1 (`timeout_ms: true` a 1 ms
    deadline); a number given as a string ("100") is still read, as the SDK intends."""
    if isinstance(value, bool):
        raise ValueError("expected a number, not true or false")
    return value


NOT_BOOL = BeforeValidator(not_bool)

RunId = Annotated[str, Field(description="A run id, or a unique prefix of one.")]
AgentsDirs = Annotated[
    list[str], Field(description="Extra agent directories to search (highest priority first).")
]


def tool_result(
    answer: Callable[P, Awaitable[ToolAnswer]],
) -> Callable[P, Awaitable[CallToolResult]]:
    """A tool's answer as a CallToolResult; a typed error as a tool error with its message."""

    @functools.wraps(answer)
    async def call(*args: P.args, **kwargs: P.kwargs) -> CallToolResult:
        try:
            try:
                done = await answer(*args, **kwargs)
            except ValidationError as exc:  # a request model refused what the tool built
                raise schema_error(answer.__name__, exc) from None
        except SubagentsError as err:
            return refusal(err)
        # The text is what a host shows (often on a terminal) and a model reads: a child's
        # escape sequences in it are shown as escapes. The structured content is the data.
        return CallToolResult(
            content=[TextContent(type="text", text=printable(done.text))],
            structured_content=done.data,
        )

    return call


def build_server(tools: LauncherTools) -> ToolServer:
    """The MCP server with one tool per launcher operation, bound to `tools`."""
    server = ToolServer(
        name="subagents-node",
        version=VERSION,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
    )
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    launches = ToolAnnotations(destructive_hint=False, open_world_hint=True)
    #: stop, pause, reject: they end or interrupt work, on this host only
    ends = ToolAnnotations(destructive_hint=True, open_world_hint=False)

    @server.tool(annotations=reads, structured_output=False)
    @tool_result
    async def agents(agents_dirs: AgentsDirs = []) -> ToolAnswer:  # noqa: B006 (a schema default)
        """List the agents this server can launch: name, description, whether it fans out."""
        return await tools.agents(agents_dirs)

    @server.tool(annotations=launches, structured_output=False)
    @tool_result
    async def run(
        agent: Annotated[str | None, Field(description="Agent of a single run.")] = None,
        task: Annotated[str | None, Field(description="Task of a single run.")] = None,
        tasks: Annotated[
            list[TaskSpec] | None, Field(description="A parallel run: these tasks side by side.")
        ] = None,
        chain: Annotated[
            list[ChainStepSpec] | None,
            Field(description="A chain run: these steps in order ({previous} = last output)."),
        ] = None,
        concurrency: Annotated[
            int, Field(ge=1, description="Parallel runs: children at once."), NOT_BOOL
        ] = 4,
        background: Annotated[
            bool | None,
            Field(
                strict=True,
                description="True: return the run id at once (follow it with wait/logs). "
                "False: wait and return the output. Default: the agent's own setting, "
                "else foreground.",
            ),
        ] = None,
        timeout_ms: Annotated[
            int | None, Field(description="Deadline of the run in milliseconds."), NOT_BOOL
        ] = None,
        intercom: Annotated[
            Literal["on", "off"], Field(description="Whether its children may message it.")
        ] = "on",
        agents_dirs: AgentsDirs = [],  # noqa: B006 (a schema default)
        cwd: Annotated[str | None, Field(description="Working directory of the run.")] = None,
    ) -> ToolAnswer:
        """Launch a run under the ledgers: `agent` + `task` (single), `tasks` (parallel) or
        `chain`. Foreground returns the output; background returns the run id."""
        return await tools.run(
            agent,
            task,
            [t.model_dump(exclude_none=True) for t in tasks or ()],
            [s.as_step() for s in chain or ()],
            concurrency,
            background,
            timeout_ms,
            intercom,
            agents_dirs,
            cwd,
        )

    @server.tool(annotations=reads, structured_output=False)
    @tool_result
    async def status() -> ToolAnswer:
        """The node, this session's spawn budget and capacity, and the run tree's fan-out."""
        return await tools.status()

    @server.tool(annotations=reads, structured_output=False)
    @tool_result
    async def logs(
        run_id: RunId,
        child: Annotated[
            int | None,
            Field(ge=0, description="Only this child (its index); default: all."),
            NOT_BOOL,
        ] = None,
        max_bytes: Annotated[
            int,
            Field(ge=1, le=MAX_LOG_BYTES, description="At most this many bytes per stream."),
            NOT_BOOL,
        ] = 16_000,
    ) -> ToolAnswer:
        """A run's child logs (stdout and stderr, labelled), the last `max_bytes` of each."""
        return await tools.logs(run_id, child, max_bytes)

    @server.tool(annotations=reads, structured_output=False)
    @tool_result
    async def wait(
        run_id: RunId,
        timeout_s: Annotated[
            float,
            Field(
                gt=0,
                le=86_400,
                allow_inf_nan=False,  # NaN is no time (and would fail `le`, misleadingly)
                description="Give up after this many seconds.",
            ),
            NOT_BOOL,
        ] = WAIT_DEFAULT_S,
    ) -> ToolAnswer:
        """Wait until a run settles and return its end and output (or that it still runs)."""
        return await tools.wait(run_id, timeout_s)

    @server.tool(annotations=ends, structured_output=False)
    @tool_result
    async def stop(run_id: RunId) -> ToolAnswer:
        """Stop a run: its children's process groups get SIGTERM, then SIGKILL."""
        return await tools.stop(run_id)

    @server.tool(annotations=launches, structured_output=False)
    @tool_result
    async def resume(
        run_id: RunId,
        message: Annotated[str, Field(description="Follow-up appended to the task.")] = "",
    ) -> ToolAnswer:
        """Relaunch a finished background run in the background on its own fan-out budget,
        moving its capacity slot (asked from inside a run, it takes no slot)."""
        return await tools.resume(run_id, message)

    @server.tool(annotations=ends, structured_output=False)
    @tool_result
    async def pause(run_id: RunId) -> ToolAnswer:
        """Pause a background run: its children stop; it keeps its slot; resume goes on."""
        return await tools.pause(run_id)

    @server.tool(annotations=launches, structured_output=False)
    @tool_result
    async def approve(run_id: RunId) -> ToolAnswer:
        """Approve the checkpoint a run waits at: the run goes on past it."""
        return await tools.approve(run_id)

    @server.tool(annotations=ends, structured_output=False)
    @tool_result
    async def reject(
        run_id: RunId,
        reason: Annotated[str, Field(description="Why; recorded as the run's error.")] = "",
    ) -> ToolAnswer:
        """Reject the checkpoint a run waits at: the run ends rejected."""
        return await tools.reject(run_id, reason)

    @server.tool(annotations=launches, structured_output=False)
    @tool_result
    async def rerun(
        run_id: RunId,
        task: Annotated[str, Field(min_length=1, description="The new task.")],
        child: Annotated[
            int, Field(ge=0, description="Which child's parameters to reuse."), NOT_BOOL
        ] = 0,
    ) -> ToolAnswer:
        """Run a run's child again with a new task in the foreground and wait for it; a live
        foreground run with one child is superseded (stopped and linked to the rerun)."""
        return await tools.rerun(run_id, task, child)

    @server.tool(annotations=launches, structured_output=False)
    @tool_result
    async def attach(
        run_id: RunId,
        steps: Annotated[
            list[ChainStepSpec],
            Field(min_length=1, description="Steps that run after the live run ends."),
        ],
        agents_dirs: AgentsDirs = [],  # noqa: B006 (a schema default)
    ) -> ToolAnswer:
        """Start a background chain whose step 0 is a live background run: its steps run once
        that run ended ({previous} is its output), with a budget of their own and a capacity
        slot of their own (none when asked from inside a run)."""
        return await tools.attach(run_id, [s.as_step() for s in steps], agents_dirs)

    @server.tool(annotations=launches, structured_output=False)
    @tool_result
    async def append(
        run_id: RunId,
        steps: Annotated[
            list[ChainStepSpec], Field(min_length=1, description="Steps to queue on the chain.")
        ],
        agents_dirs: AgentsDirs = [],  # noqa: B006 (a schema default)
    ) -> ToolAnswer:
        """Queue steps on a running background chain (their fan-out claims come first)."""
        return await tools.append(run_id, [s.as_step() for s in steps], agents_dirs)

    tools_ = (agents, run, status, logs, wait, stop, resume, pause, approve, reject, rerun, attach)
    # A tool call naming an argument its tool does not take is refused (arguments.py).
    server.takes.update(
        {fn.__name__: frozenset(inspect.signature(fn).parameters) for fn in (*tools_, append)}
    )
    return server


@contextlib.contextmanager
def node_address(address: str | None, state_dir: Path, timeout: float) -> Iterator[str]:
    """The node to serve: `address` (explicit or $SUBAGENTS_NODE) must answer; without one the
    state dir's node is used when it runs, else an embedded node that is stopped on exit."""
    target = address or default_address(state_dir)
    with connect(target, timeout=timeout) as probe:
        try:
            probe.ping(timeout=min(timeout, 2.0))
            running = True
        except NodeNotRunning:
            if address:
                raise
            running = False
    if running:
        yield target
        return
    from subagents_node.node.node import Node

    settings = LaunchContext.from_environment().config.actor_settings()
    with contextlib.ExitStack() as stack:
        try:
            node = stack.enter_context(Node.embedded(state_dir=state_dir, settings=settings))
        except NodeAlreadyRunning:
            # Another process's node won the state dir meanwhile (servers an agent CLI started
            # at once, a `start`): use it once it serves, as a launching command does
            # (cli/nodestart.py). The server used to exit 1 with "another node is starting".
            if not _winner_serves(target, state_dir, timeout):
                raise
        else:
            yield node.address
            return
    yield target


def _winner_serves(address: str, state_dir: Path, timeout: float) -> bool:
    """Whether the node another process started on `state_dir` serves within RACE_WAIT_S."""
    from subagents_node.client.nodewait import wait_for_node

    def answering() -> bool | None:
        with connect(address, timeout=timeout) as probe:
            try:
                probe.ping(timeout=min(timeout, 2.0))
            except NodeNotRunning:
                return None
        return True

    return wait_for_node(state_dir, answering, RACE_WAIT_S) is not None


def serve(
    address: str,
    timeout: float,
    env: Mapping[str, str],
    signals: EndSignals,
    agents_dirs: tuple[str, ...] = (),
    session_id: str | None = None,
) -> int | None:
    """Serve MCP over stdin/stdout until the client closes the stream (None), or one of
    `signals` ends it (its number, once the calls it cut short were cancelled)."""
    # The session is resolved once, as the CLI would: every launch of this server's client
    # (one agent CLI session) counts against the same session's ledgers.
    ctx = LaunchContext.from_environment(env=env, agents_dirs=agents_dirs, session_id=session_id)

    async def main() -> int | None:
        async with AsyncClient(address, timeout=timeout) as client:
            tools = LauncherTools(client, ctx.session_id, env, agents_dirs, ctx.cwd)
            return await serve_stdio(build_server(tools), signals)

    return anyio.run(main)
