"""The values a workflow script hands to `runs` and gets back (SPEC R-WF-4, R-WF-11, R-RUN-7).

Owns their shapes and their validation: `ChildCall` (one `runs.run` or `runs.resume` call; a
reuse of its key must repeat its parameters exactly), `ChildResult` (what a call answers),
`Step` (one launched key: status, async classification, run id), `WorkflowEnv` (the workflow run
the host serves) and the JSON form of a script's values. Pure data: nothing here talks to a node
or touches a file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from subagents_node.messages.errors import WorkflowCallInvalid, WorkflowKeyInvalid
from subagents_node.messages.fanout import FanoutDescriptor
from subagents_node.messages.supervisor import WORKFLOW_KEY, IntercomMode, RunView

_KEY = re.compile(WORKFLOW_KEY)

StepStatus = Literal["pending", "running", "completed", "failed", "stopped"]
_STEP_STATUS: Mapping[str, StepStatus] = {"complete": "completed", "stopped": "stopped"}


def step_status(run_state: str) -> StepStatus:
    """R-WF-11: a child run's terminal state as its step's status (anything else: failed)."""
    return _STEP_STATUS.get(run_state, "failed")


@dataclass(frozen=True)
class WorkflowEnv:
    """What the node told the host about its workflow run (through its environment)."""

    run_id: str
    session_id: str
    token: str
    descriptor: FanoutDescriptor
    run_dir: Path
    cwd: Path
    aggregate: Path | None = None
    intercom: IntercomMode = "on"
    background: bool = False
    #: The workflow run this one resumes (R-WF-5), if it is a resume.
    source_run_id: str | None = None


def _shown_key(key: object) -> str:
    """A runs.all entry as its errors name it: by its key (of any type), if it has one."""
    if key is None:
        return "runs.all entry"
    text = repr(key)
    return f"runs.all entry {text if len(text) <= 60 else text[:60] + '…'}"


@dataclass(frozen=True)
class ChildCall:
    """One `runs.run` call, validated: the key and the parameters a reuse must repeat."""

    key: str
    agent: str = ""
    task: str = ""
    output: str | bool | None = None
    async_: bool = False
    cwd: str | None = None
    timeout_ms: int | None = None
    intercom: IntercomMode | None = None
    #: A `resume` item (R-WF-5, R-FAN-23): the run id (or this workflow's key) of a finished
    #: child to relaunch under `key`, with `task` as the follow-up; it claims its key only.
    resume: str | None = None

    @classmethod
    def of(cls, spec: ChildCall | Mapping[str, Any]) -> ChildCall:
        """From a dict spec (`async` is accepted for `async_`), checking every field."""
        if isinstance(spec, ChildCall):
            return cls._checked(spec)
        if not isinstance(spec, Mapping):
            raise WorkflowCallInvalid(
                f"a runs.all entry is a dict of run() arguments, not {type(spec).__name__}",
                field="spec",
            )
        # A dict is a runs.all entry: its errors name runs.all (they said "runs.run needs
        # 'task'" to a script that never called runs.run), and the entry by its key.
        entry = _shown_key(spec.get("key"))
        known = [f.name for f in fields(cls)] + ["async"]
        unknown = sorted(map(str, set(spec) - set(known)))
        if unknown:
            raise WorkflowCallInvalid(
                f"{entry}: unknown field{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))} (an entry's fields are {', '.join(known)})",
                key=str(spec.get("key", "")),
                field=unknown[0],
            )
        values = dict(spec)
        if "async" in values:
            values["async_"] = values.pop("async")
        for name in ("key",) if values.get("resume") is not None else ("key", "agent", "task"):
            if name not in values:
                raise WorkflowCallInvalid(
                    f"{entry} needs '{name}'", key=str(values.get("key", "")), field=name
                )
        return cls._checked(cls(**values), entry)

    @classmethod
    def _checked(cls, call: ChildCall, where: str = "") -> ChildCall:
        key = call.key
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise WorkflowKeyInvalid(
                f"Workflow child key {key!r} is invalid: a key matches {WORKFLOW_KEY}.",
                key=str(key),
            )
        resuming = call.resume is not None
        problems = {
            "resume": not resuming or (isinstance(call.resume, str) and bool(call.resume)),
            "agent": isinstance(call.agent, str) and (resuming or bool(call.agent)),
            "task": isinstance(call.task, str),
            "output": call.output is None or isinstance(call.output, str | bool),
            "async_": isinstance(call.async_, bool),
            "cwd": call.cwd is None or isinstance(call.cwd, str),
            "timeout_ms": call.timeout_ms is None
            or (
                isinstance(call.timeout_ms, int)
                and not isinstance(call.timeout_ms, bool)
                and call.timeout_ms > 0
            ),
            "intercom": call.intercom in (None, "on", "off"),
        }
        if resuming:  # a resume item relaunches its source's parameters: it sets no others
            problems["output"] = call.output is None
            problems["cwd"] = call.cwd is None
            problems["timeout_ms"] = call.timeout_ms is None
        bad = [name for name, ok in problems.items() if not ok]
        if bad:
            raise WorkflowCallInvalid(
                f"{where or f'runs.run({key!r})'}: invalid {bad[0]}: {getattr(call, bad[0])!r}",
                key=key,
                field=bad[0],
            )
        return call

    def params(self) -> tuple[object, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if f.name != "key")


@dataclass(frozen=True)
class ChildResult:
    """What `runs.run` answers. `success` is None while a background child still runs."""

    key: str
    agent: str
    run_id: str | None
    state: str
    success: bool | None
    output: str = ""
    output_path: str | None = None
    error: str = ""
    async_: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {f.name.rstrip("_"): getattr(self, f.name) for f in fields(self)}


@dataclass
class Step:
    """One launched key: its status, async classification and run id (R-WF-11)."""

    key: str
    agent: str
    call: ChildCall
    output_path: Path | None
    status: StepStatus = "pending"
    async_: bool | None = None
    run_id: str | None = None
    error: str = ""
    stopped: bool = False
    result: ChildResult | None = None
    #: A reused step's workflow run (a resumed workflow, R-WF-5), or a resume item's source run.
    source_run_id: str | None = None
    view: RunView | None = field(default=None, repr=False)


def to_jsonable(value: Any, _within: frozenset[int] = frozenset()) -> Any:
    """A script's value (or an emit) as JSON data; anything else becomes its repr (a float JSON
    cannot hold, NaN or an infinity, included: `'nan'`, `'inf'`). A value that contains itself
    is a ValueError (JSON has no cycles), never a RecursionError."""
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN or infinity: written as json writes them (`NaN`), result.json and
        # `workflow --json` were no JSON for a strict reader (JavaScript's JSON.parse threw).
        return repr(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, ChildResult):
        return value.to_dict()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value), _within)
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        if id(value) in _within:
            raise ValueError(
                f"a {type(value).__name__} that contains itself cannot be a workflow value"
            )
        if len(_within) >= _MAX_NESTING:
            raise ValueError(
                f"a value nested over {_MAX_NESTING} levels cannot be a workflow value"
            )
        inner = _within | {id(value)}
        if isinstance(value, Mapping):
            return {str(k): to_jsonable(v, inner) for k, v in value.items()}
        return [to_jsonable(v, inner) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


#: Deeper than any result a person reads; well within Python's recursion limit.
_MAX_NESTING = 200
