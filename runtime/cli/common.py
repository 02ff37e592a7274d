"""Shared pieces of the command line: the context object, typed-error handling, output.

Owns how a user error looks (one line on stderr, a stable exit code: 1 refused by a ledger or
invalid, 2 bad usage or address, 3 node not running, 4 node timeout) and how results print
(text, or `--json`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

from subagents_node.client.paths import resolve_state_dir
from subagents_node.messages.errors import BadAddress, NodeNotRunning, NodeTimeout, SubagentsError

if TYPE_CHECKING:  # the client (and pydantic with it) loads when a command first asks for it
    from subagents_node.client.client import Client
    from subagents_node.messages.base import Message

P = ParamSpec("P")
T = TypeVar("T")

EXIT_CODES: dict[type[SubagentsError], int] = {NodeNotRunning: 3, NodeTimeout: 4, BadAddress: 2}


class CliError(click.ClickException):
    def __init__(self, err: SubagentsError) -> None:
        super().__init__(err.message)
        self.exit_code = next(  # type: ignore[misc]
            (c for k, c in EXIT_CODES.items() if isinstance(err, k)), 1
        )
        self.error = err

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def user_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn typed errors into one-line messages with their exit code."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except SubagentsError as err:
            raise CliError(err) from None

    return wrapper


class Ctx:
    def __init__(self, state_dir: str | None, address: str | None, timeout: float) -> None:
        self.state_dir = resolve_state_dir(state_dir)
        self.explicit_state = state_dir is not None
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
        click.echo(text)


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
