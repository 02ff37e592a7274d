"""The domain of each `NodeOptions` field, checked before a node takes or creates anything.

Owns the check a program's `Node(NodeOptions(...))` and `Node.embedded(**options)` get that
`subagents-node start` gets from click: a wrong type, a negative, NaN or huge number, an empty
state dir, a single string as `listen` or a setting outside its domain
(runtime/node/settingscheck.py) is a `BadRequest` naming the field
(`details["reason"] == "argument"`), raised before the state dir is created or any process
forked. Without it such a value reached the owner processes, which crashed at every restart
(`max_frame=2**70`, `synchronous="BOGUS"`) until the node stopped, or served in the current
directory (`state_dir=""`). Roles (home, worker, endpoints) are runtime/node/roles.py's. It
never touches the file system.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from subagents_node.messages.errors import BadRequest
from subagents_node.node.settingscheck import check_settings

if TYPE_CHECKING:
    from subagents_node.node.options import NodeOptions

#: The largest mailbox bound (as `start --mailbox-limit`): a bound, not a preallocation.
MAX_MAILBOX_LIMIT = 1_000_000
#: Inbound frame cap bounds: a frame must hold any request; zmq and the owners take an int32.
MIN_FRAME, MAX_FRAME = 1024, (1 << 31) - 1
#: The longest interval or wait an option may name (a week, as a client's timeout).
MAX_SECONDS = 7 * 24 * 3600.0
SYNCHRONOUS = ("NORMAL", "FULL")
#: Which runs' children die with an embedded node's process (actors/runs/binding.py's modes).
CHILDREN_END_WITH_NODE = ("never", "foreground", "all")


def _refuse(field: str, domain: str, value: object) -> BadRequest:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:80] + "…"
    return BadRequest(
        f"NodeOptions.{field} must be {domain}, not {shown}", reason="argument", field=field
    )


def check_state_dir(value: object, field: str = "state_dir") -> None:
    """None (the default state dir) or a non-empty path: "" would be the current directory."""
    if value is None:
        return
    path = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if not isinstance(path, str) or not path or "\0" in path:
        raise _refuse(field, "None or a non-empty path", value)


def _int(opts: NodeOptions, field: str, low: int, high: int) -> None:
    value = getattr(opts, field)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _refuse(field, f"an integer from {low} to {high}", value)


def _seconds(opts: NodeOptions, field: str) -> None:
    value = getattr(opts, field)
    finite = isinstance(value, int | float) and not isinstance(value, bool)
    if not finite or not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise _refuse(field, f"a number of seconds above 0, at most {MAX_SECONDS:g}", value)


def check_options(opts: NodeOptions) -> None:
    """Raise a `BadRequest` naming the first option outside its domain."""
    check_state_dir(opts.state_dir)
    listen = opts.listen
    if isinstance(listen, str | bytes) or not isinstance(listen, Sequence):
        raise _refuse("listen", "a list of endpoints (a single one too: [endpoint])", listen)
    if not all(isinstance(endpoint, str) for endpoint in listen):
        raise _refuse("listen", "a list of endpoint strings", listen)
    for field in ("ipc", "faults", "home"):
        if not isinstance(getattr(opts, field), bool):
            raise _refuse(field, "True or False", getattr(opts, field))
    _int(opts, "mailbox_limit", 1, MAX_MAILBOX_LIMIT)
    _int(opts, "max_frame", MIN_FRAME, MAX_FRAME)
    _int(opts, "restart_max", 0, 1_000_000)
    if opts.child_open_files is not None:  # the kernel's own ceiling (fs.nr_open) is under 2**30
        _int(opts, "child_open_files", 1, 2**30)
    if opts.synchronous not in SYNCHRONOUS:
        raise _refuse("synchronous", "'NORMAL' or 'FULL'", opts.synchronous)
    if opts.children_end_with_node not in CHILDREN_END_WITH_NODE:
        shown = " or ".join(repr(mode) for mode in CHILDREN_END_WITH_NODE)
        raise _refuse("children_end_with_node", shown, opts.children_end_with_node)
    for field in ("restart_window_s", "heartbeat_s", "heartbeat_timeout_s", "remote_timeout_s"):
        _seconds(opts, field)
    settings = opts.settings
    if not isinstance(settings, Mapping) or not all(isinstance(k, str) for k in settings):
        raise _refuse("settings", "a dict of setting names to values", settings)
    check_settings(settings)  # each key known, each value in its domain
    for field in ("join", "home_key", "name", "client_key"):
        if not isinstance(getattr(opts, field), str):
            raise _refuse(field, "a string", getattr(opts, field))


def check_transport(transport: object) -> str:
    """`Node.client(transport)`: "inproc" or "zmq"."""
    if transport not in ("inproc", "zmq"):
        shown = repr(transport)[:80]
        raise BadRequest(
            f"transport must be 'inproc' or 'zmq', not {shown}",
            reason="argument",
            field="transport",
        )
    return str(transport)
