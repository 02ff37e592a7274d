"""The one home of every value domain a request may carry: integers, floats, strings, lists and
maps, each bounded, so nothing from outside reaches a store, a system call or a reply builder
with a value it cannot hold (DESIGN §4: "every integer in its domain and within SQLite's range,
every string within its length cap").

Schema modules annotate their fields with these types instead of writing bounds of their own;
a bound changes here, once. The numbers come from `messages.constants` (MAX_INT32, SQLite's
range) and from the kernel's own limits (NAME_MAX, PATH_MAX, MAX_ARG_STRLEN). Every type is a
pydantic `Annotated[...]`, so a violation is an ordinary field error and the gateway answers it
with a `BadRequest` that names the field.

Nesting is bounded twice: the codec refuses a body deeper than `MAX_BODY_DEPTH` before any
model sees it, and the one free-form field (`fanout.create`'s `limit`, which the owner checks
itself for the spec's own message) is a `ShallowValue`.

It imports only constants and pydantic, never holds state, and never decides a rule of any
owner: a domain says what a value can be, not whether a ledger accepts it.
"""

import os
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints

from subagents_node.messages.constants import MAX_INT32, SQLITE_MAX_INT

# -- the numbers --------------------------------------------------------------------------------

#: Deepest container nesting a request body may have (the deepest model, a chain launch's agent
#: environment, is 7 levels down); the codec enforces it on every frame.
MAX_BODY_DEPTH = 16
#: Longest list and largest map a frame may hold (msgpack decode limits; models cap lower).
MAX_WIRE_ITEMS = 10_000
#: Linux NAME_MAX and PATH_MAX (bytes): a longer component or path fails every system call.
NAME_MAX = 255
PATH_MAX = 4096
#: Linux MAX_ARG_STRLEN: the longest single argv entry or environment string exec accepts.
MAX_ARG_BYTES = 131_072
#: Largest task text (also what `auto` delivery may write to a task file).
MAX_TASK_CHARS = 1 << 19
#: Latest wall-clock time a request may name: 9999-12-31T23:59:59Z.
MAX_EPOCH_S = 253_402_300_799.0
#: Longest wait or TTL any request may ask for: one week.
MAX_DURATION_S = 7 * 24 * 3600.0
#: Largest free-form value (`fanout.create` limit): depth and element count.
MAX_SHALLOW_DEPTH = 4
MAX_SHALLOW_ITEMS = 64


def _no_nul(value: str) -> str:
    # A NUL byte ends a C string: argv, env, paths and SQLite text would silently disagree.
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


def _no_control(value: str) -> str:
    # A session id is printed in one-line errors, tables and logs, and typed back in by
    # people: a newline or an escape would forge lines there, or name a session no command
    # can name again (the CLI refuses control characters in --session too).
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("must not contain a control character (a newline, a tab, an escape)")
    return value


def _env_name(value: str) -> str:
    _no_nul(value)
    if "=" in value:  # the kernel splits NAME=VALUE at the first '='
        raise ValueError("an environment variable name must not contain '='")
    return value


def _not_blank(value: str) -> str:
    _no_nul(value)
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def _path_fits(value: str) -> str:
    _no_nul(value)
    encoded = os.fsencode(value)
    if len(encoded) > PATH_MAX:
        raise ValueError(f"path is longer than {PATH_MAX} bytes")
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > NAME_MAX:
        raise ValueError(f"a path component is longer than {NAME_MAX} bytes ({longest})")
    return value


def _arg_fits(value: str) -> str:
    _no_nul(value)
    if len(value.encode("utf-8", "surrogateescape")) >= MAX_ARG_BYTES:
        raise ValueError(f"longer than the {MAX_ARG_BYTES - 1}-byte argument limit")
    return value


# -- integers -----------------------------------------------------------------------------------

#: A count or a limit: ledgers keep them as signed 32-bit integers (SPEC §0.4).
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_INT32)]
#: A positive count (at least one).
PositiveCount = Annotated[int, Field(strict=True, ge=1, le=MAX_INT32)]
#: A count that may be negative on the wire so a rule can refuse it in its own words.
SignedCount = Annotated[int, Field(strict=True, ge=-MAX_INT32, le=MAX_INT32)]
#: A slot index in a session pool ([0, limit) with limit a Count).
Slot = Annotated[int, Field(strict=True, ge=0, le=MAX_INT32)]
#: A fencing generation: only grows, stored as an SQLite INTEGER.
Generation = Annotated[int, Field(strict=True, ge=0, le=SQLITE_MAX_INT)]
#: A position in an event log (run events, the fleet's order).
Seq = Annotated[int, Field(strict=True, ge=0, le=SQLITE_MAX_INT)]
#: A process id (Linux pid_max is at most 2^22; the type allows any positive int32).
Pid = Annotated[int, Field(strict=True, ge=1, le=MAX_INT32)]
#: An exit status or a signal number as an observer saw it.
ExitStatus = Annotated[int, Field(strict=True, ge=-MAX_INT32, le=MAX_INT32)]
#: Nesting depth of a launcher, and the most it allows (R-CFG-8).
Depth = Annotated[int, Field(strict=True, ge=0, le=MAX_INT32)]
#: Milliseconds of a timeout (SPEC §0.4: 1 .. 2^31-1).
TimeoutMs = Annotated[int, Field(strict=True, ge=1, le=MAX_INT32)]

# -- floats: finite, within a domain ------------------------------------------------------------

#: Wall-clock seconds since the epoch.
Timestamp = Annotated[float, Field(ge=0, le=MAX_EPOCH_S, allow_inf_nan=False)]
#: A duration in seconds a caller may wait or hold something for (> 0).
Ttl = Annotated[float, Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)]
#: A long-poll wait in seconds (0 = answer now).
WaitS = Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)]

# -- strings ------------------------------------------------------------------------------------

#: A run id, or a unique prefix of one (run ids are 12 hex characters; child and runner ids
#: add a short suffix).
RunId = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(_no_nul)]
#: A session id (chosen by the launcher: `cli-xxxxxxxx`, or a caller's own name).
SessionId = Annotated[
    str, StringConstraints(min_length=1, max_length=256), AfterValidator(_no_control)
]
#: An opaque token or id the owner minted (slot tokens, reservation ids, runner ids).
Token = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(_no_nul)]
#: A fan-out budget id (the sanitized root id plus a uuid) and the root id a budget names.
#: Only ever bound as SQLite parameters and JSON-encoded, so any character may appear.
BudgetId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
#: A name a person gives (an agent, a workflow key, a child id).
Label = Annotated[str, StringConstraints(max_length=128), AfterValidator(_no_nul)]
NonEmptyLabel = Annotated[
    str, StringConstraints(min_length=1, max_length=128), AfterValidator(_no_nul)
]
#: A reason, an error text or a short message shown to people.
ShortText = Annotated[str, StringConstraints(max_length=4000)]
#: A reason a person must give (an operator's release): not empty, not only blanks.
NonEmptyShortText = Annotated[
    str, StringConstraints(min_length=1, max_length=4000), AfterValidator(_not_blank)
]
#: An error a run or a child ended with (may quote a command's own message).
ErrorText = Annotated[str, StringConstraints(max_length=65_536)]
#: Free text a person writes as a task or a message to a run.
TaskText = Annotated[str, StringConstraints(max_length=MAX_TASK_CHARS)]
#: A filesystem path: within PATH_MAX, every component within NAME_MAX, no NUL.
FsPath = Annotated[str, StringConstraints(max_length=PATH_MAX), AfterValidator(_path_fits)]
NonEmptyFsPath = Annotated[
    str, StringConstraints(min_length=1, max_length=PATH_MAX), AfterValidator(_path_fits)
]
#: The name of a node (a worker host, e.g. `w1`), as `keys allow` names a peer's key: a letter
#: or digit, then letters, digits and `_.@-`. It is shown in listings and bound as an SQLite
#: parameter; the pattern keeps it one printable word, so a listing stays one line per host.
HostName = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
]
#: The z85 text of a 32-byte CURVE public key.
CurveKey = Annotated[
    str,
    StringConstraints(
        min_length=40, max_length=40, pattern=r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]+$"
    ),
]
#: A host name, or "" for the home node itself (what a record written before hosts reads as).
HostOrHome = Annotated[
    str, StringConstraints(max_length=64, pattern=r"^(?:[A-Za-z0-9][A-Za-z0-9_.@-]*)?$")
]
#: A node address (ipc:// or tcp://) as a descriptor carries it, for people (never dialled as
#: is: the transport parses addresses strictly).
Address = Annotated[str, StringConstraints(max_length=512)]
#: An encoded fan-out descriptor (a few hundred bytes of base64url).
EncodedDescriptor = Annotated[str, StringConstraints(max_length=8192)]
#: One argv entry of an agent command, and one environment variable name and value.
Arg = Annotated[str, StringConstraints(max_length=MAX_ARG_BYTES), AfterValidator(_arg_fits)]
EnvName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=1024),
    AfterValidator(_env_name),
]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ARG_BYTES), AfterValidator(_arg_fits)]

# -- collections --------------------------------------------------------------------------------

#: An agent command line.
Command = Annotated[list[Arg], Field(min_length=1, max_length=256)]
#: An environment: names to values (the largest real environments hold a few hundred).
Environment = Annotated[dict[EnvName, EnvValue], Field(max_length=4096)]


def _shallow(value: Any) -> Any:
    """A msgpack-shaped value no deeper than MAX_SHALLOW_DEPTH and with at most
    MAX_SHALLOW_ITEMS elements: one error for anything bigger, never one per element."""
    budget = MAX_SHALLOW_ITEMS
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise ValueError(f"a value of more than {MAX_SHALLOW_ITEMS} elements")
        if isinstance(item, list | dict):
            if depth >= MAX_SHALLOW_DEPTH:
                raise ValueError(f"a value nested deeper than {MAX_SHALLOW_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, str) and len(item) > 256:
            raise ValueError("a string of more than 256 characters")
        elif isinstance(item, int) and not -SQLITE_MAX_INT - 1 <= item <= SQLITE_MAX_INT:
            raise ValueError("an integer outside the 64-bit range")
        elif not (item is None or isinstance(item, bool | int | float | str)):
            raise ValueError(f"a value of type {type(item).__name__}")
    return value


#: A free-form value an owner inspects itself (to answer with a rule's own message), bounded.
ShallowValue = Annotated[Any, BeforeValidator(_shallow)]
