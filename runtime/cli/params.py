"""Parameter types of the command line: every value a user types is checked here, by click.

Owns the domains of CLI values (run ids, session ids, agent names, counts, seconds) and the
shell completion of run ids, sessions and agent names. A bad value is a one-line usage error
(exit 2) before any node is asked; nothing here can raise anything but click's own errors.

Completion asks the node named by the command line (`--state-dir`, `--address`, else the
environment) with a short timeout and completes nothing, silently, when no node answers: a
shell prompt must never show an error or wait. It never changes anything at the node.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from subagents_node.messages.constants import MAX_INT32

if TYPE_CHECKING:  # click's completion module loads only when a shell asks for a completion
    from click.shell_completion import CompletionItem

#: Run ids are 12 hex digits; a prefix of one, or any id a node made, fits this.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: Session ids travel as a 1..256 character string; control characters would garble output.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: How long a completion may wait for the node before it gives up (a prompt must stay snappy).
_COMPLETION_TIMEOUT_S = 0.5
#: The longest wait any command accepts, in seconds (a day; beyond it timers overflow).
MAX_WAIT_S = 86_400.0
#: The shortest: a millisecond, the resolution of ZeroMQ's and the node's timers. Less rounds
#: to no wait at all (`--timeout 1e-300` was taken, and every request then "timed out" with a
#: message blaming a node that was fine).
MIN_WAIT_S = 0.001
#: The shortest heartbeat a home takes: each one is a message from every worker and a write to
#: the home's members.db, so `--heartbeat 1e-300` would have every worker spin on its home.
MIN_HEARTBEAT_S = 0.1
#: Numbers as the command line spells them: ASCII digits, as every SUBAGENTS_* number variable
#: (launch/limits.py DECIMAL). int() and float() also took "1_000" and other scripts' digits:
#: `--timeout-ms ٣` was a 3 ms deadline.
_WHOLE = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
_DECIMAL = re.compile(r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*", re.ASCII)


def shown(value: Any) -> str:
    """A value as an error shows it: its repr, cut at 80 characters (an id pasted from a big
    file must not make the one-line error a hundred kilobytes long)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:80]}… ({len(str(value))} characters)"


def _client_for_completion(ctx: click.Context) -> Any:
    """A client for the node the command line names, or None (nothing is printed)."""
    from subagents_node.client.client import connect, default_address
    from subagents_node.client.paths import resolve_state_dir

    root = ctx.find_root().params
    address = root.get("address")
    state_dir = root.get("state_dir")
    if not address:
        address = default_address(resolve_state_dir(state_dir) if state_dir else None)
    return connect(address, timeout=_COMPLETION_TIMEOUT_S)


def _recent_runs(ctx: click.Context) -> list[Any]:
    from subagents_node.messages.errors import SubagentsError

    try:
        client = _client_for_completion(ctx)
    except SubagentsError:
        return []
    try:
        return list(client.runs.list(limit=200))
    except SubagentsError:
        return []
    finally:
        client.close()


class RunIdType(click.ParamType[str]):
    """A run id or a unique prefix of one; completes the node's recent runs."""

    name = "run_id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if not _RUN_ID.match(text):
            self.fail(
                f"{shown(value)} is not a run id (1-128 letters, digits, '.', '_' or '-', starting "
                "with a letter or digit)",
                param,
                ctx,
            )
        return text

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        return [
            CompletionItem(r.run_id, help=f"{r.state} {r.label}")
            for r in _recent_runs(ctx)
            if r.run_id.startswith(incomplete)
        ]


class SessionType(click.ParamType[str]):
    """A session id (1-256 characters, no control characters); completes known sessions."""

    name = "session"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if not text or len(text) > 256 or _CONTROL.search(text):
            self.fail(
                f"{shown(value)} is not a session id (1-256 characters, no control characters)",
                param,
                ctx,
            )
        return text

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        from subagents_node.launch.launcher import terminal_session_id

        sessions = dict.fromkeys(
            [terminal_session_id(), *(r.session_id for r in _recent_runs(ctx))]
        )
        return [CompletionItem(s) for s in sessions if s.startswith(incomplete)]


class AgentNameType(click.ParamType[str]):
    """An agent name (1-128 characters); completes the agents this directory can launch."""

    name = "agent"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if not text or len(text) > 128 or _CONTROL.search(text):
            self.fail(f"{shown(value)} is not an agent name (1-128 characters)", param, ctx)
        return text

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        from subagents_node.launch.agents import discover_agents
        from subagents_node.messages.errors import SubagentsError

        dirs = ctx.params.get("agents_dirs") or ()
        try:
            catalog = discover_agents(Path.cwd(), dirs)
        except (SubagentsError, OSError):
            return []
        return [
            CompletionItem(name, help=catalog.agents[name].description)
            for name in catalog.names()
            if name.startswith(incomplete)
        ]


class SecondsType(click.ParamType[float]):
    """A finite number of seconds from `minimum` (a millisecond unless given) up to a day (0,
    negatives, nan, inf and values too small to be a wait refused)."""

    name = "seconds"

    def __init__(self, minimum: float = MIN_WAIT_S) -> None:
        self.minimum = minimum

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            number = value
        else:
            if not _DECIMAL.fullmatch(str(value)):
                self.fail(f"{shown(value)} is not a number of seconds", param, ctx)
            number = float(str(value))
        if not math.isfinite(number) or not self.minimum <= number <= MAX_WAIT_S:
            self.fail(
                f"{shown(value)} is not in the range {self.minimum:g} <= seconds <= {MAX_WAIT_S:g}",
                param,
                ctx,
            )
        return number


class PathTextType(click.ParamType[str]):
    """A path as text: not empty, no NUL, at most 4096 bytes, each part at most 255 bytes
    (the kernel's limits, so a bad one is a usage error here, not an OSError later)."""

    name = "path"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        raw = os.fsencode(text)
        if not text.strip() or b"\0" in raw or len(raw) > 4096:
            self.fail(f"{text[:80]!r} is not a usable path", param, ctx)
        if any(len(part) > 255 for part in raw.split(b"/")):
            self.fail(f"{text[:80]!r}…: a path component is longer than 255 bytes", param, ctx)
        return text


class GivenTextType(click.ParamType[str]):
    """Text that must not be empty (a task, a message, a reason, a key's name): an empty one
    was sent and came back as "invalid runs.rerun request: task: String should have at least
    1 character" (exit 1), naming a request the user never saw."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text:
            self.fail("is empty", param, ctx)
        return text


class GivenPath(click.Path):
    """click's path, where an empty or blank one is refused: click took `--cwd ""` as `.`, so
    `--cwd "$DIR"` with DIR unset ran the agent in the working directory, and `--chain ""`
    said "cannot read ." (exit 1)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is empty or blank: give a path", param, ctx)
        return super().convert(value, param, ctx)


def given_or_default(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """An option's value, where an empty one typed on the command line is refused (a
    `--state-dir "$DIR"` whose DIR is unset would otherwise quietly mean the default one, and
    `stop` would stop another node), and an empty variable counts as unset. Blank (spaces
    only) is empty: `--state-dir " "` was a directory named " " under the working directory,
    while the same $SUBAGENTS_STATE_DIR meant the default one."""
    if not isinstance(value, str) or value.strip():
        return value
    if ctx.get_parameter_source(str(param.name)) is click.core.ParameterSource.COMMANDLINE:
        raise click.BadParameter("is empty or blank; leave the option out to mean the default")
    return None


def _check_whole(kind: click.ParamType[Any], value: Any, param: Any, ctx: Any) -> None:
    if isinstance(value, str) and not _WHOLE.fullmatch(value):
        kind.fail(f"{shown(value)} is not a whole number (ASCII digits)", param, ctx)


class WholeNumber(click.types.IntParamType):
    """click's integer, spelt in ASCII digits only."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        _check_whole(self, value, param, ctx)
        return super().convert(value, param, ctx)


class WholeRange(click.IntRange):
    """click's integer range, spelt in ASCII digits only."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        _check_whole(self, value, param, ctx)
        return super().convert(value, param, ctx)


RUN_ID = RunIdType()
WHOLE = WholeNumber()
PATH_TEXT = PathTextType()
SESSION = SessionType()
AGENT = AgentNameType()
SECONDS = SecondsType()
GIVEN_TEXT = GivenTextType()
HEARTBEAT_SECONDS = SecondsType(MIN_HEARTBEAT_S)
#: Counts that travel as signed 32-bit integers (SPEC §0.4).
COUNT = WholeRange(0, MAX_INT32)
POSITIVE_COUNT = WholeRange(1, MAX_INT32)
#: A deadline in milliseconds (R-TMO-3's positive integer, within the int32 the launch carries):
#: out of range it is a usage error (exit 2) before any node is asked, as every other value.
TIMEOUT_MS = WholeRange(1, MAX_INT32)
