"""Shared pieces of the command line: the context object, typed-error handling, output.

Owns how a user error looks (one line on stderr, a stable exit code: 1 refused by a ledger or
invalid, 2 bad usage or address, 3 node not running, 4 node timeout, 124 `wait` timed out,
130 interrupted by Ctrl-C, 141 the reader of stdout went away) and how results print (text,
with text from outside made inert by cli/terminal.py, or `--json`). With `--json` an error is
`{"error": {"code", "message", "details"}}` on stderr, so a script reads one shape.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

import click

from subagents_node.cli.terminal import one_line, say
from subagents_node.client.paths import resolve_state_dir
from subagents_node.messages.errors import BadAddress, NodeNotRunning, NodeTimeout, SubagentsError

if TYPE_CHECKING:  # the client (and pydantic with it) loads when a command first asks for it
    from subagents_node.client.client import Client
    from subagents_node.messages.base import Message
    from subagents_node.messages.supervisor import RunView

P = ParamSpec("P")
T = TypeVar("T")

EXIT_CODES: dict[type[SubagentsError], int] = {NodeNotRunning: 3, NodeTimeout: 4, BadAddress: 2}
#: `wait` gave up before every run settled (the convention of timeout(1)).
EXIT_TIMEOUT = 124
#: Interrupted by Ctrl-C (SIGINT): 128 + 2, the shell's convention.
EXIT_INTERRUPTED = 130
#: The reader of our stdout went away (`| head`): 128 + SIGPIPE, the shell's convention.
EXIT_READER_GONE = 141


def error_line(code: str, message: str, details: dict[str, Any], as_json: bool) -> str:
    """How any error is shown: `error: MESSAGE`, or its JSON object for scripts (one line)."""
    if as_json:
        payload = {"error": {"code": code, "message": message, "details": details}}
        return json.dumps(payload, sort_keys=True, default=str)
    return f"error: {one_line(' '.join(message.split()))}"


class CliError(click.ClickException):
    def __init__(self, err: SubagentsError, as_json: bool = False) -> None:
        super().__init__(err.message)
        self.exit_code = next(  # type: ignore[misc]
            (c for k, c in EXIT_CODES.items() if isinstance(err, k)), 1
        )
        self.error = err
        self.as_json = as_json

    def show(self, file: Any = None) -> None:
        err = self.error
        click.echo(error_line(err.code, err.message, err.details, self.as_json), err=True)


def user_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn typed errors into one-line messages (JSON with `--json`) with their exit code."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except SubagentsError as err:
            raise CliError(err, as_json=bool(kwargs.get("as_json"))) from None
        except OSError as exc:  # a path or descriptor the user gave that the system refused
            if exc.errno == errno.EPIPE:  # our reader went away (`| head`): not the user's
                raise  # path; the command group exits quietly (cli/main.py)
            raise CliError(file_error(exc), as_json=bool(kwargs.get("as_json"))) from None

    return wrapper


def reader_gone() -> NoReturn:
    """The reader of our stdout went away (`| head`): exit 141, quietly, as a Unix tool
    killed by SIGPIPE shows in a shell (click's own handling would exit 1). Stdout goes to
    /dev/null first, so the interpreter's last flush of it has nothing to fail on."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(EXIT_READER_GONE)


def file_error(exc: OSError) -> SubagentsError:
    """An OSError from a user's path as a typed error naming the path (shortened)."""
    from subagents_node.messages.errors import BadRequest

    name = str(exc.filename or "")
    if not name and exc.errno == errno.ENOENT and not _cwd_exists():
        # os.getcwd() names no file: "No such file or directory" alone sent the user looking
        # for a file they had given (or a traceback, from `doctor`).
        return BadRequest(
            "the working directory no longer exists (removed or renamed under this shell); "
            "cd to one that does",
            reason="cwd_gone",
            errno=exc.errno,
        )
    shown = f": {name[:120]}{'…' if len(name) > 120 else ''}" if name else ""
    return BadRequest(f"{exc.strerror or exc}{shown}", reason="os_error", errno=exc.errno)


def _cwd_exists() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True


class Ctx:
    def __init__(
        self, state_dir: str | None, address: str | None, timeout: float, state_origin: str = ""
    ) -> None:
        self.state_dir = resolve_state_dir(state_dir)
        self.explicit_state = state_dir is not None
        #: Where the state dir came from, as `config show` says it (`--state-dir`, the variable).
        self.state_origin = state_origin if state_dir is not None else "default"
        self.address = address
        self.timeout = timeout

    def client(self) -> Client:
        from subagents_node.client.client import connect, default_address

        address = self.address or (
            default_address(self.state_dir) if self.explicit_state else default_address()
        )
        return connect(address, timeout=self.timeout, state_dir=self.state_dir)


def emit(data: Message | dict[str, Any], as_json: bool, text: str) -> None:
    if as_json:
        payload = data if isinstance(data, dict) else data.model_dump(mode="json")
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
    else:
        say(text)


_SOURCE_TEXT = {
    "resume": "resumed from",
    "rerun": "rerun of",
    "attach": "chain attached to live run",  # R-RES-6: the source is this chain's step 0
}


def lineage(run: RunView) -> list[str]:
    """The run's links to other runs, one line each: where it came from (resume, rerun, attach)
    and the rerun that superseded it (R-MISC-2). `show`, `fleet` and `debug-run` print them."""
    lines: list[str] = []
    if run.source_run_id:
        lines.append(f"{_SOURCE_TEXT.get(run.source_kind or 'resume')}: {run.source_run_id}")
    if run.superseded_by:
        lines.append(f"superseded by rerun: {run.superseded_by}")
    return lines


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 child`, `2 children`, `0 runs`."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
