"""The arguments of a `tools/call`, refused as the project refuses any bad input: a tool error
whose text is one line naming the argument and whose structured content is the typed error
(`{"error": {code, message, details}}`), never the SDK's pydantic dump (four lines and a URL).

Owns the MCPServer the tools are served by (`ToolServer`) and its one change to the SDK's: its
`call_tool`, which the SDK calls for every `tools/call` once its initialize gate let the call
through (so a call before `initialize` is refused as every other one is), refuses an argument
the tool does not take (the SDK would drop it: `backgrund: true` or `timeout: 60` would quietly
run in the foreground or without a deadline), and turns the SDK's refusal of an argument its
input schema refuses (`timeout_ms: true`, `agent: 5`, a stray key inside `tasks[0]`) into one
line naming the argument, with every field error listed (bounded) in the details.

It must never run a tool itself nor judge a call the schema takes: the SDK validates the
arguments and calls the tool, the tool answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.context import Context
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from pydantic import ValidationError

from subagents_node.messages.base import schema_error
from subagents_node.messages.errors import BadRequest, SubagentsError
from subagents_node.messages.inert import printable

#: Longest argument or key name a refusal repeats (a stray one may be any length).
MAX_NAME_SHOWN = 64


def refusal(err: SubagentsError) -> CallToolResult:
    """A typed error as a tool error: its message as the text (a terminal control in it shown
    as an escape), the error itself as the structured content."""
    return CallToolResult(
        content=[TextContent(type="text", text=printable(err.message))],
        structured_content={"error": err.to_wire()},
        is_error=True,
    )


def stray_arguments(
    tool: str, given: Mapping[str, Any], takes: frozenset[str]
) -> BadRequest | None:
    """BadRequest naming the arguments in `given` that `tool` does not take (None when it takes
    them all); the arguments it does take are named too, for the caller to correct itself."""
    stray = sorted(set(given) - takes)
    if not stray:
        return None
    shown = ", ".join(repr(k[:MAX_NAME_SHOWN]) for k in stray[:5])
    accepted = ", ".join(sorted(takes)) or "none"
    return BadRequest(
        f"{tool} takes no argument {shown} (its arguments: {accepted})",
        field=stray[0][:MAX_NAME_SHOWN],
    )


def argument_error(tool: str, exc: ValidationError) -> BadRequest:
    """One line naming the first argument `tool`'s input schema refused, in pydantic's words
    without its "Value error, " prefix and URL, and how many more there were; the details list
    each field error as a node's schema refusal does (reason `schema`, bounded)."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0]
    loc = tuple(first["loc"])
    if first["type"] == "extra_forbidden" and loc:  # a stray key inside an object argument
        where, why = _where(loc[:-1]), f"takes no key {str(loc[-1])[:MAX_NAME_SHOWN]!r}"
    elif first["type"] == "missing":
        where, why = _where(loc), "required, and not given"
    else:
        where, why = _where(loc), _reason(first["type"], str(first["msg"]))
    more = exc.error_count() - 1
    text = f"invalid {tool} argument {where}: {why}" + (f" (and {more} more)" if more else "")
    details = schema_error(tool, exc).details
    details["field"] = where
    return BadRequest(text, **details)


def _where(loc: Sequence[int | str]) -> str:
    """A location as the caller wrote the argument: `tasks[0].agent`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part}"
    return out[: MAX_NAME_SHOWN * 2] or "arguments"


#: Pydantic's words that speak of Python, or of what the caller did not send, in JSON's terms.
_REASONS = {
    "int_parsing_size": "should be an integer, and this one is too large",  # not "a string"
    "model_type": "should be an object",  # not "a valid dictionary or instance of TaskSpec"
    "model_attributes_type": "should be an object",
    "dict_type": "should be an object",
}


def _reason(kind: str, msg: str) -> str:
    """Why, in pydantic's words ("should be a valid string") but for the few in _REASONS;
    our own validators' words as they wrote them (without pydantic's "Value error, ")."""
    if kind in _REASONS:
        return _REASONS[kind]
    msg = msg.removeprefix("Value error, ")
    for subject in ("Input ", "String "):  # "Input should be ...": the argument is named
        if msg.startswith(subject + "should"):
            return msg.removeprefix(subject)
    return msg


class ToolServer(MCPServer[Any]):
    """The SDK's MCPServer, whose tool calls refuse bad arguments as the project refuses bad
    input (see the module docstring). `takes` maps each tool to the arguments it takes."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.takes: dict[str, frozenset[str]] = {}

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        takes = self.takes.get(name)
        stray = stray_arguments(name, arguments, takes) if takes is not None else None
        if stray is not None:
            return refusal(stray)
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError:
            raise  # a crash: the SDK logs it and answers with its generic line
        except ToolError as exc:
            # The SDK raises the arguments' ValidationError as this ToolError's cause; the
            # tool's own ValidationErrors never get here (tool_result made them BadRequests).
            if isinstance(exc.__cause__, ValidationError):
                return refusal(argument_error(name, exc.__cause__))
            raise


__all__ = ["ToolServer", "argument_error", "refusal", "stray_arguments"]
